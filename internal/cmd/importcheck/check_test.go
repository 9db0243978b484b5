package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// target is a small tree that follows the rule: the layering of PAL with
// runs as the front door and workers used only by pal worker and pal dev.
func target() []Package {
	return []Package{
		{Path: "cmd/pal", Files: map[string][]string{"main.go": {"cmd/pal/palcli"}}},
		{Path: "cmd/pal/palcli", Files: map[string][]string{
			"worker.go": {"workers", "runs"},
			"dev.go":    {"workers", "internal/pgcluster"},
			"run.go":    {"runs", "api"},
		}},
		{Path: "api", Files: map[string][]string{"rest.go": {"runs", "projections"}}},
		{Path: "runs", Files: map[string][]string{"client.go": {"eventstore", "engine"}}},
		{Path: "workers", Files: map[string][]string{"drive.go": {"engine", "eventstore", "provider"}}},
		{Path: "projections", Files: map[string][]string{"projector.go": {"engine", "eventstore"}}},
		{Path: "paltest", Files: map[string][]string{"paltest.go": {"workers", "paltest/testenv"}}},
		{Path: "paltest/testenv", Files: map[string][]string{"nats.go": {"event"}}},
		{Path: "engine", Files: map[string][]string{"next.go": {"event", "workflow"}}},
		{Path: "workflow", Files: map[string][]string{"parse.go": {"schemas"}}},
		{Path: "eventstore", Files: map[string][]string{"store.go": {"event"}}},
		{Path: "provider", Files: map[string][]string{"provider.go": nil}},
		{Path: "provider/openai", Files: map[string][]string{"openai.go": {"provider"}}},
		{Path: "event", Files: map[string][]string{"event.go": nil}},
		{Path: "schemas", Files: map[string][]string{"embed.go": nil}},
		{Path: "internal/pgcluster", Files: map[string][]string{"cluster.go": nil}},
	}
}

// with returns pkgs with pkg's file importing imps (the package is added
// if absent).
func with(pkgs []Package, pkg, file string, imps ...string) []Package {
	i := slices.IndexFunc(pkgs, func(p Package) bool { return p.Path == pkg })
	if i < 0 {
		pkgs = append(pkgs, Package{Path: pkg, Files: map[string][]string{}})
		i = len(pkgs) - 1
	}
	pkgs[i].Files[file] = append(pkgs[i].Files[file], imps...)
	return pkgs
}

func without(pkgs []Package, pkg string) []Package {
	return slices.DeleteFunc(pkgs, func(p Package) bool { return p.Path == pkg })
}

func TestCheck(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		pkgs []Package
		want []string
	}{
		{"target tree", target(), nil},
		{"without runs", without(target(), "runs"), nil},
		{"api imports workers", with(target(), "api", "sse.go", "workers"),
			[]string{"api/sse.go imports workers: api must not depend on workers (api -> workers)"}},
		{"runs depends on workers through projections", with(with(target(), "runs", "view.go", "projections"), "projections", "feed.go", "workers"),
			[]string{
				"projections/feed.go imports workers: api must not depend on workers (api -> projections -> workers)",
				"projections/feed.go imports workers: runs must not depend on workers (runs -> projections -> workers)",
			}},
		{"a cli command that runs no worker imports workers", with(target(), "cmd/pal/palcli", "run_query.go", "workers"),
			[]string{"cmd/pal/palcli/run_query.go imports workers: in cmd/pal/palcli only worker.go, dev.go may"}},
		{"upward import", with(target(), "engine", "next.go", "api"),
			[]string{"engine/next.go imports api: upward, from layer 4 (" + strings.Join(layers[3], " ") + ") to layer 3 (" + strings.Join(layers[2], " ") + ")"}},
		{"leaf imports a middle layer", with(target(), "event", "event.go", "workflow"),
			[]string{"event/event.go imports workflow: upward, from layer 5 (" + strings.Join(layers[4], " ") + ") to layer 4 (" + strings.Join(layers[3], " ") + ")"}},
		{"production code imports a test-only package", with(target(), "workers", "drive.go", "paltest/testenv"),
			[]string{"workers/drive.go imports paltest/testenv: a test-only package, for _test.go files"}},
		{"package in no layer", with(target(), "internal/lru", "lru.go"),
			[]string{"internal/lru: in no layer; add it to layers in internal/cmd/importcheck/rules.go"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, Check(tc.pkgs))
		})
	}
}

func TestMatch(t *testing.T) {
	t.Parallel()
	require.True(t, match("provider/...", "provider"))
	require.True(t, match("provider/...", "provider/openai"))
	require.False(t, match("provider/...", "providers"))
	require.True(t, match("api", "api"))
	require.False(t, match("api", "api/v2"))
}

// TestLoad reads PAL's own tree: the files and module imports go list and
// the parser report, test files left out.
func TestLoad(t *testing.T) {
	t.Parallel()
	pkgs, err := Load()
	require.NoError(t, err)
	byPath := map[string]Package{}
	for _, p := range pkgs {
		byPath[p.Path] = p
	}
	// main runs the commands, after the sandbox's re-exec hook, which
	// must come before anything else the process does.
	require.Equal(t, map[string][]string{"main.go": {"cmd/pal/palcli", "internal/sandbox"}}, byPath["cmd/pal"].Files)
	require.Contains(t, byPath["cmd/pal/palcli"].Files["worker.go"], "workers")
	require.NotContains(t, byPath["internal/cmd/importcheck"].Files, "check_test.go")
	for f, imps := range byPath["event"].Files {
		require.Empty(t, imps, "event/%s imports from PAL", f)
	}
}
