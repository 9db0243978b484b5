package event

// Deltas: an LLM step's answer as it streams. The worker publishes each
// piece on pal.deltas.<run_id> (core NATS, kept a short while in the
// memory stream PAL_DELTAS so that a watcher arriving mid-step gets the
// text so far); they are never journaled: the journal keeps the whole
// answer in step_completed (docs/architecture.md §5.4).

// Delta kinds.
const (
	// DeltaText is answer text.
	DeltaText = "text"
	// DeltaReasoning is thinking text, where the provider streams it.
	DeltaReasoning = "reasoning"
)

// MaxDeltaText bounds the text of one delta: a provider's bigger piece is
// published as several.
const MaxDeltaText = 16 << 10

// Delta is a piece of an LLM step's answer as it streams.
type Delta struct {
	StepID  string `json:"step_id"`
	Attempt int    `json:"attempt"`
	// Call names the call the delta belongs to: the seq of the journal's
	// last event before the call was sent. A later call of the step (a
	// retry, or the same attempt resumed after a crash) has a greater one.
	Call uint64 `json:"call"`
	// Index numbers the call's deltas from 0, text and reasoning alike.
	Index int    `json:"index"`
	Text  string `json:"text"`
	Kind  string `json:"kind"`
	// Reset marks a call's first delta: a watcher drops what it has of the
	// step (an earlier call's partial text) and starts again.
	Reset bool `json:"reset,omitempty"`
}

// How Streamed.Apply took a delta.
const (
	// DeltaNew: the next delta of the step's call (or the first of a new
	// call): it extends the step's text.
	DeltaNew = iota
	// DeltaSeen: a delta already taken (history and live overlap).
	DeltaSeen
	// DeltaStale: a delta of an earlier call, or of a call the journal
	// ended: dropped.
	DeltaStale
	// DeltaGap: a delta after one that is missing: not taken (Force takes
	// it when the missing one cannot be had).
	DeltaGap
)

// Streamed is the text of a run's steps as their deltas tell it: the one
// rule by which every watcher (the event feeds, pal run watch) orders,
// de-duplicates and resets deltas. Not safe for concurrent use.
type Streamed struct {
	steps map[string]*streamedStep
}

type streamedStep struct {
	call            uint64
	attempt         int
	next            int
	text, reasoning []byte
	// ended is the seq of the journal event that ended the step's latest
	// call (step_completed, step_failed, step_retrying): a call before it
	// is over.
	ended uint64
}

func (s *Streamed) step(id string) *streamedStep {
	if s.steps == nil {
		s.steps = map[string]*streamedStep{}
	}
	st, ok := s.steps[id]
	if !ok {
		st = &streamedStep{}
		s.steps[id] = st
	}
	return st
}

// Apply takes d if it is the next piece of its step: the first of a call
// later than the step's (which resets the step's text), or the next index
// of the step's call. It says how it took d (DeltaNew, DeltaSeen,
// DeltaStale, DeltaGap); only DeltaNew changes the text.
func (s *Streamed) Apply(d Delta) int {
	st := s.step(d.StepID)
	switch {
	case d.Call < st.ended || d.Call < st.call:
		return DeltaStale
	case d.Call > st.call:
		if d.Index != 0 {
			return DeltaGap
		}
		*st = streamedStep{call: d.Call, ended: st.ended}
	case d.Index < st.next:
		return DeltaSeen
	case d.Index > st.next:
		return DeltaGap
	}
	st.take(d)
	return DeltaNew
}

// Force takes d although deltas before it are missing (they are gone from
// PAL_DELTAS): the step's text has a hole.
func (s *Streamed) Force(d Delta) {
	st := s.step(d.StepID)
	if d.Call > st.call {
		*st = streamedStep{call: d.Call, ended: st.ended}
	}
	st.take(d)
}

func (st *streamedStep) take(d Delta) {
	st.attempt, st.next = d.Attempt, d.Index+1
	if d.Kind == DeltaReasoning {
		st.reasoning = append(st.reasoning, d.Text...)
	} else {
		st.text = append(st.text, d.Text...)
	}
}

// End tells that the journal ended step's call at seq (its step_completed,
// step_failed or step_retrying): deltas of calls before seq are stale
// from then on, and the text of such a call is dropped (the journal has
// the answer). The text of a later call (a retry's, read before the end
// of the call it follows) stays.
func (s *Streamed) End(stepID string, seq uint64) {
	st := s.step(stepID)
	if seq <= st.ended {
		return
	}
	if st.call < seq {
		*st = streamedStep{}
	}
	st.ended = seq
}

// Text is a step's streamed answer and thinking so far, and the attempt
// they belong to.
func (s *Streamed) Text(stepID string) (text, reasoning string, attempt int) {
	st, ok := s.steps[stepID]
	if !ok {
		return "", "", 0
	}
	return string(st.text), string(st.reasoning), st.attempt
}

// Ends reports whether ev ends a step's call: the seq End takes.
func Ends(ev Event) bool {
	switch ev.Kind {
	case StepCompleted, StepFailed, StepRetrying:
		return ev.StepID != ""
	}
	return false
}
