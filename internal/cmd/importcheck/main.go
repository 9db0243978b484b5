// Importcheck checks PAL's import rule (see rules.go): no package imports
// one of a layer above its own, test-only packages stay in tests, api and
// runs do not depend on workers, and in cmd/pal/palcli only the commands that
// run a worker import it. Test files are not checked: tests may drive runs
// through workers.
//
// Run it from anywhere in the module: go run ./internal/cmd/importcheck. It
// prints one line per violation, naming the file and the import, and exits
// 1 if there is any.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

func main() {
	pkgs, err := Load()
	if err != nil {
		fmt.Fprintln(os.Stderr, "importcheck:", err)
		os.Exit(2)
	}
	msgs := Check(pkgs)
	for _, m := range msgs {
		fmt.Fprintln(os.Stderr, m)
	}
	if len(msgs) > 0 {
		fmt.Fprintf(os.Stderr, "importcheck: %d violations of the import rule (internal/cmd/importcheck/rules.go)\n", len(msgs))
		os.Exit(1)
	}
	fmt.Printf("importcheck: %d packages follow the import rule\n", len(pkgs))
}

// Load lists the module's packages with go list and reads the imports of
// each of their non-test Go files.
func Load() ([]Package, error) {
	mod, err := goCmd("list", "-m", "-f", "{{.Path}}")
	if err != nil {
		return nil, err
	}
	modPath := strings.TrimSpace(string(mod))
	out, err := goCmd("list", "-e", "-json=ImportPath,Dir,GoFiles,CgoFiles,Error", modPath+"/...")
	if err != nil {
		return nil, err
	}
	rel := func(path string) (string, bool) {
		if r, ok := strings.CutPrefix(path, modPath+"/"); ok {
			return r, true
		}
		return ".", path == modPath
	}
	var pkgs []Package
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var lp struct {
			ImportPath, Dir   string
			GoFiles, CgoFiles []string
			Error             *struct{ Err string }
		}
		if err := dec.Decode(&lp); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("reading go list output: %w", err)
		}
		if lp.Error != nil {
			return nil, fmt.Errorf("package %s: %s", lp.ImportPath, lp.Error.Err)
		}
		p := Package{Files: map[string][]string{}}
		p.Path, _ = rel(lp.ImportPath)
		fset := token.NewFileSet()
		for _, name := range append(lp.GoFiles, lp.CgoFiles...) {
			f, err := parser.ParseFile(fset, filepath.Join(lp.Dir, name), nil, parser.ImportsOnly)
			if err != nil {
				return nil, err
			}
			imps := []string{}
			for _, spec := range f.Imports {
				path, err := strconv.Unquote(spec.Path.Value)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", fset.Position(spec.Pos()), err)
				}
				if r, ok := rel(path); ok {
					imps = append(imps, r)
				}
			}
			p.Files[name] = imps
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

func goCmd(args ...string) ([]byte, error) {
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out, nil
}
