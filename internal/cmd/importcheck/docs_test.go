package main

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// layersMarker precedes the layer table in the docs that show the import
// rule.
const layersMarker = "<!-- layers: internal/cmd/importcheck/rules.go -->"

// docLayers reads the layer table that follows layersMarker in a Markdown
// file: a fenced block of lines "N  pkg, pkg, …", where a line that starts
// with a space continues the layer above it.
func docLayers(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out [][]string
	marked, fenced := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case !marked:
			marked = strings.TrimSpace(line) == layersMarker
		case strings.HasPrefix(line, "```"):
			if fenced {
				require.NotEmpty(t, out, "%s: the layer table after %s is empty", path, layersMarker)
				return out
			}
			fenced = true
		case !fenced:
			require.Empty(t, strings.TrimSpace(line), "%s: want the layer table's fenced block right after %s", path, layersMarker)
		case strings.HasPrefix(line, " "):
			require.NotEmpty(t, out, "%s: a continuation line before the first layer: %q", path, line)
			out[len(out)-1] = append(out[len(out)-1], splitList(line)...)
		default:
			n, list, ok := strings.Cut(line, "  ")
			require.True(t, ok, "%s: layer line %q: want \"N  pkg, pkg\"", path, line)
			require.Equal(t, fmt.Sprint(len(out)+1), n, "%s: layers are numbered from 1 in order", path)
			out = append(out, splitList(list))
		}
	}
	require.NoError(t, sc.Err())
	require.True(t, marked, "%s: no %s", path, layersMarker)
	require.FailNow(t, "unterminated layer table", "%s", path)
	return nil
}

// splitList splits "a, b, c," into its names.
func splitList(s string) []string {
	var out []string
	for name := range strings.SplitSeq(s, ",") {
		if name = strings.TrimSpace(name); name != "" {
			out = append(out, name)
		}
	}
	return out
}

// TestDocsShowTheLayers holds the layer tables of docs/architecture.md §4
// and the README to rules.go: the same layers, packages and order.
func TestDocsShowTheLayers(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	for _, doc := range []string{"docs/architecture.md", "README.md"} {
		require.Equal(t, layers, docLayers(t, filepath.Join(root, doc)),
			"%s: the layer table must be rules.go's layers, in order", doc)
	}
}
