package engine_test

import (
	"flag"
	"testing"

	"go.uber.org/goleak"
)

var (
	update = flag.Bool("update", false, "rewrite testdata/*.golden.json from the histories")
	// The histories are saved journals: they stay as written so that a
	// change to the fold that breaks old journals shows. -histories
	// regenerates them from the scenarios in history_test.go (for a new
	// scenario, or a deliberate format change).
	writeHistories = flag.Bool("histories", false, "rewrite testdata/*.jsonl from the scenarios")
)

func TestMain(m *testing.M) {
	flag.Parse()
	goleak.VerifyTestMain(m)
}
