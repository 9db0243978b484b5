package workers

import (
	"unicode/utf8"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider"
)

// deltas is where an LLM step's answer streams as the provider writes it:
// the run's delta subject (eventstore.Store.PublishDelta), never the
// journal. The call is named by the journal's seq it follows (taken here,
// on the drive's goroutine, when the step starts), so a watcher tells a
// retried or resumed call from the one before, and its first delta says
// to start the step's text again. A piece over event.MaxDeltaText is
// published as several. Each call has a Sink of its own, called only from
// its own branch, so steps streaming at once share nothing but the
// connection (safe for concurrent use). Publishing does not wait: a delta
// lost on the way costs a watcher some text until the step's
// step_completed, never the run anything.
func (d *drive) deltas(p engine.StepPlan) provider.Sink {
	call, index := d.st.LastSeq, 0
	return func(pd provider.Delta) {
		text := pd.Text
		for text != "" {
			piece := cutText(text, event.MaxDeltaText)
			text = text[len(piece):]
			kind := event.DeltaText
			if pd.Kind == provider.DeltaReasoning {
				kind = event.DeltaReasoning
			}
			err := d.w.store.PublishDelta(d.runID, event.Delta{StepID: p.StepID, Attempt: p.Attempt, Call: call,
				Index: index, Text: piece, Kind: kind, Reset: index == 0})
			if err != nil {
				d.log.Debug("delta not published", "step_id", p.StepID, "err", err)
			}
			index++
		}
	}
}

// cutText is the longest prefix of s of at most n bytes that does not cut
// a UTF-8 sequence (at least one rune).
func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	if i == 0 {
		_, size := utf8.DecodeRuneInString(s)
		i = size
	}
	return s[:i]
}
