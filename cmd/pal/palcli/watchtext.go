package palcli

import (
	"fmt"
	"io"
	"strings"

	"github.com/palrun/pal/event"
)

// Gutters of an LLM step's streamed text under its step line in pal run
// watch: the answer, and the thinking where the provider streams it.
const (
	gutterText      = "      │ "
	gutterReasoning = "      ┊ "
)

// textPrinter prints the text LLM steps stream (their deltas) under the
// step lines of pal run watch, as it comes: a gutter per line, and a mark
// when a call starts the step's text again (a retry, or a resume after a
// crash). event.Streamed decides which deltas are new; a step's journal
// end makes its later deltas stale.
type textPrinter struct {
	w        io.Writer
	streamed event.Streamed
	// calls is the call each step's printed text belongs to.
	calls map[string]uint64
	// open is the step whose text was printed last, kind the kind of its
	// last line; midLine: that line has not ended.
	open    string
	kind    string
	midLine bool
}

func newTextPrinter(w io.Writer) *textPrinter {
	return &textPrinter{w: w, calls: map[string]uint64{}}
}

// event tells the printer of a journal event (printed by the caller): the
// text being printed ends its line, and an end of a step makes its call's
// deltas stale.
func (p *textPrinter) event(ev event.Event) {
	if event.Ends(ev) {
		p.streamed.End(ev.StepID, ev.Seq)
	}
	p.close()
}

// delta prints d if it is new.
func (p *textPrinter) delta(d event.Delta) {
	if p.streamed.Apply(d) != event.DeltaNew {
		return
	}
	if last, ok := p.calls[d.StepID]; ok && d.Call > last {
		p.close()
		fmt.Fprintf(p.w, "      ↺ %s (attempt %d): the call started again; the text so far is dropped\n", d.StepID, d.Attempt)
	}
	if d.StepID != p.open {
		p.close()
		p.open = d.StepID
	}
	p.calls[d.StepID] = d.Call
	if d.Kind != p.kind {
		p.close()
	}
	p.kind = d.Kind
	gutter := gutterText
	if d.Kind == event.DeltaReasoning {
		gutter = gutterReasoning
	}
	for i, line := range strings.Split(d.Text, "\n") {
		if i > 0 {
			fmt.Fprintln(p.w)
			p.midLine = false
		}
		if line == "" {
			continue
		}
		if !p.midLine {
			fmt.Fprint(p.w, gutter)
		}
		fmt.Fprint(p.w, line)
		p.midLine = true
	}
}

// close ends the line being printed.
func (p *textPrinter) close() {
	if p.midLine {
		fmt.Fprintln(p.w)
	}
	p.midLine = false
}
