package eventstore_test

import (
	"bufio"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest/testenv"
)

// docRow is one line of the layout table in doc.go: a name, its kind
// (stream, KV, objects, consumer) and, for a stream, its subjects with each
// <placeholder> read as the wildcard *; for a consumer, its stream.
type docRow struct {
	kind string
	on   []string
}

// placeholder is a <run_id>, <sha256>… in a subject of the table.
var placeholder = regexp.MustCompile(`<[^>]+>`)

// readDocLayout reads the layout table of doc.go: the first block of
// indented comment lines after "// Layout". An indented line that starts
// with a space continues the row above it.
func readDocLayout(t *testing.T) map[string]docRow {
	t.Helper()
	f, err := os.Open("doc.go")
	require.NoError(t, err)
	defer f.Close()
	rows := map[string]docRow{}
	inLayout, inTable := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "// Layout") {
			inLayout = true
			continue
		}
		text, indented := strings.CutPrefix(line, "//\t")
		if !inLayout || (!indented && !inTable) {
			continue
		}
		if !indented {
			break
		}
		inTable = true
		if strings.HasPrefix(text, " ") {
			continue
		}
		fields := strings.Fields(text)
		require.GreaterOrEqual(t, len(fields), 3, "doc.go layout row %q: want name, kind, subjects or stream", text)
		row := docRow{kind: fields[1]}
		switch row.kind {
		case "stream":
			for _, f := range fields[2:] {
				if !strings.HasPrefix(f, "pal.") {
					break
				}
				row.on = append(row.on, placeholder.ReplaceAllString(f, "*"))
			}
		case "consumer":
			row.on = []string{fields[2]}
		}
		require.NotContains(t, rows, fields[0], "doc.go layout names %s twice", fields[0])
		rows[fields[0]] = row
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, rows, "doc.go has no layout table")
	return rows
}

// setupLayout is what Setup made on an empty server, in docRow's terms.
func setupLayout(t *testing.T) map[string]docRow {
	t.Helper()
	ctx := t.Context()
	js, err := jetstream.New(testenv.NATS(t).Conn(t))
	require.NoError(t, err)
	require.NoError(t, eventstore.Setup(ctx, js, eventstore.Config{}))
	rows := map[string]docRow{}
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		s, err := js.Stream(ctx, name)
		require.NoError(t, err)
		if bucket, ok := strings.CutPrefix(name, "KV_"); ok {
			rows[bucket] = docRow{kind: "KV"}
		} else if bucket, ok := strings.CutPrefix(name, "OBJ_"); ok {
			rows[bucket] = docRow{kind: "objects"}
		} else {
			subjects := slices.Clone(s.CachedInfo().Config.Subjects)
			rows[name] = docRow{kind: "stream", on: subjects}
		}
		consumers := s.ConsumerNames(ctx)
		for c := range consumers.Name() {
			rows[c] = docRow{kind: "consumer", on: []string{name}}
		}
		require.NoError(t, consumers.Err())
	}
	require.NoError(t, names.Err())
	return rows
}

// TestDocLayoutIsSetup holds the package doc's layout table to what Setup
// creates: every stream with its subjects, KV bucket, object store and
// consumer, and nothing else.
func TestDocLayoutIsSetup(t *testing.T) {
	t.Parallel()
	doc, made := readDocLayout(t), setupLayout(t)
	for _, rows := range []map[string]docRow{doc, made} {
		for name, r := range rows {
			slices.Sort(r.on)
			rows[name] = r
		}
	}
	for name, r := range made {
		require.Contains(t, doc, name, "Setup makes %s %s, which doc.go's layout table leaves out", r.kind, name)
		require.Equal(t, r, doc[name], "doc.go's layout row of %s (kind, then subjects or stream)", name)
	}
	for name, r := range doc {
		require.Contains(t, made, name, "doc.go's layout table names %s %s, which Setup does not make", r.kind, name)
	}
}
