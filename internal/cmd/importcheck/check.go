package main

import (
	"fmt"
	"slices"
	"strings"
)

// Package is one package of the module, its paths relative to the module.
type Package struct {
	Path string
	// Files maps each non-test Go file of the build to the module
	// packages it imports.
	Files map[string][]string
}

type ban struct{ from, to string }

type fileRule struct {
	pkg, to string
	files   []string
}

// imports returns the module packages p imports and, for each, the first
// of p's files (in name order) that does.
func (p Package) imports() map[string]string {
	out := map[string]string{}
	for _, f := range sortedKeys(p.Files) {
		for _, imp := range p.Files[f] {
			if _, ok := out[imp]; !ok {
				out[imp] = f
			}
		}
	}
	return out
}

// match reports whether path matches pattern ("x" or "x/...").
func match(pattern, path string) bool {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == base || strings.HasPrefix(path, base+"/")
	}
	return path == pattern
}

// layerOf returns the index of path's layer in layers (0 is the top), or -1.
func layerOf(path string) int {
	for i, l := range layers {
		for _, pat := range l {
			if match(pat, path) {
				return i
			}
		}
	}
	return -1
}

// Check applies the import rule to pkgs and returns one message per
// violation, each naming the file and the import that break it.
func Check(pkgs []Package) []string {
	var out []string
	byPath := map[string]Package{}
	for _, p := range pkgs {
		byPath[p.Path] = p
	}
	slices.SortFunc(pkgs, func(a, b Package) int { return strings.Compare(a.Path, b.Path) })
	for _, p := range pkgs {
		from := layerOf(p.Path)
		if from < 0 {
			out = append(out, fmt.Sprintf("%s: in no layer; add it to layers in internal/cmd/importcheck/rules.go", p.Path))
			continue
		}
		imps := p.imports()
		for _, imp := range sortedKeys(imps) {
			file := p.Path + "/" + imps[imp]
			to := layerOf(imp)
			switch {
			case to >= 0 && to < from:
				out = append(out, fmt.Sprintf("%s imports %s: upward, from layer %d (%s) to layer %d (%s)",
					file, imp, from+1, strings.Join(layers[from], " "), to+1, strings.Join(layers[to], " ")))
			case isTestOnly(imp) && !isTestOnly(p.Path):
				out = append(out, fmt.Sprintf("%s imports %s: a test-only package, for _test.go files", file, imp))
			}
		}
	}
	for _, b := range bans {
		if chain := pathTo(byPath, b.from, b.to); chain != nil {
			last := byPath[chain[len(chain)-2]]
			out = append(out, fmt.Sprintf("%s imports %s: %s must not depend on %s (%s)",
				last.Path+"/"+last.imports()[b.to], b.to, b.from, b.to, strings.Join(chain, " -> ")))
		}
	}
	for _, r := range fileRules {
		p, ok := byPath[r.pkg]
		if !ok {
			continue
		}
		for _, f := range sortedKeys(p.Files) {
			if slices.Contains(p.Files[f], r.to) && !slices.Contains(r.files, f) {
				out = append(out, fmt.Sprintf("%s/%s imports %s: in %s only %s may",
					r.pkg, f, r.to, r.pkg, strings.Join(r.files, ", ")))
			}
		}
	}
	return out
}

// pathTo returns the shortest import chain from one package to another
// (both included), or nil if from does not depend on to or is absent.
func pathTo(byPath map[string]Package, from, to string) []string {
	if _, ok := byPath[from]; !ok {
		return nil
	}
	prev := map[string]string{from: ""}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		for _, imp := range sortedKeys(byPath[cur].imports()) {
			if _, seen := prev[imp]; seen {
				continue
			}
			prev[imp] = cur
			if imp == to {
				var chain []string
				for at := to; at != ""; at = prev[at] {
					chain = append(chain, at)
				}
				slices.Reverse(chain)
				return chain
			}
			queue = append(queue, imp)
		}
	}
	return nil
}

func isTestOnly(path string) bool { return slices.Contains(testOnly, path) }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
