package runs

import (
	"errors"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/limit"
	"github.com/palrun/pal/internal/telemetry"
	"github.com/palrun/pal/workflow"
)

// Errors of the commands. Callers map them to answers with Classify: an
// *InputError (or ErrInvalidRunID, *workflow.ValidationError,
// ErrPayloadTooLarge) is the caller's mistake (400), a *ForbiddenError
// what the caller may not do (403), ErrRunNotFound and
// ErrWorkflowNotFound 404,
// ErrRunFinished, ErrNotWaiting, ErrRunExists and event.ErrJournalCorrupt
// 409; a *ForbiddenError (the caller's rights or scopes) 403; a run PAL
// cannot read (event.ErrBlob, engine.ErrUnfoldable) 500; a caller over
// its limit (*limit.Error, WithLimiter) 429; anything else is the
// infrastructure (503) and worth retrying.
var (
	// ErrInvalidRunID is wrapped by every refused run id: one that is not
	// a single NATS subject token.
	ErrInvalidRunID = event.ErrInvalidRunID
	// ErrRunNotFound: no journal holds the run.
	ErrRunNotFound = eventstore.ErrRunNotFound
	// ErrRunExists refuses a start whose run id is taken (and no
	// idempotency key says it is the same start).
	ErrRunExists = eventstore.ErrRunExists
	// ErrPayloadTooLarge refuses an event larger than the journal takes.
	ErrPayloadTooLarge = eventstore.ErrPayloadTooLarge
	// ErrRunFinished refuses a command for a run that has ended.
	ErrRunFinished = errors.New("run already finished")
	// ErrNotWaiting refuses an approval or signal for a step that is not
	// waiting for one.
	ErrNotWaiting = errors.New("step is not waiting")
	// ErrScheduleNotFound: no schedule has the name (404).
	ErrScheduleNotFound = eventstore.ErrScheduleNotFound
	// ErrScheduleExists refuses a schedule whose name is taken (409).
	ErrScheduleExists = eventstore.ErrScheduleExists
)

// InputError is a command the caller got wrong: it names the field.
type InputError struct {
	Field string
	Msg   string
	// Err is the cause, when there is one to match (ErrInvalidRunID).
	Err error
}

func (e *InputError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

func (e *InputError) Unwrap() error { return e.Err }

// badRunID wraps a ValidateRunID error as the field's InputError.
func badRunID(field string, err error) error {
	return &InputError{Field: field, Msg: err.Error(), Err: err}
}

// checkRunID validates a run id named by field.
func checkRunID(field, id string) error {
	if id == "" {
		return &InputError{Field: field, Msg: "required"}
	}
	if err := event.ValidateRunID(id); err != nil {
		return badRunID(field, err)
	}
	return nil
}

// Answer codes: how a refused or failed command is classified.
const (
	CodeBadInput    = "bad_input"
	CodeNotFound    = "not_found"
	CodeConflict    = "conflict"
	CodeUnavailable = "unavailable"
	// CodeInternal: PAL failed on the command itself, for good: its
	// handler panicked on every delivery, or the run's journal cannot be
	// read (a bad blob reference) or folded. Not worth retrying; a
	// durable command goes to PAL_DEAD.
	CodeInternal = "internal"
)

// Classify maps a command error to an answer code and the field at fault;
// final is false for errors worth retrying (the infrastructure, not the
// command). It matches with errors.Is and errors.As only.
func Classify(err error) (code string, field string, final bool) {
	var ie *InputError
	var ve *workflow.ValidationError
	var fe *ForbiddenError
	switch {
	case errors.As(err, &fe):
		return CodeForbidden, fe.Field, true
	case errors.Is(err, limit.ErrLimited):
		return CodeRateLimited, "", true
	case errors.As(err, &ie):
		return CodeBadInput, ie.Field, true
	case errors.As(err, &ve):
		return CodeBadInput, "workflow", true
	case errors.Is(err, ErrInvalidRunID):
		return CodeBadInput, "run_id", true
	case errors.Is(err, event.ErrInvalidWorkflowName):
		return CodeBadInput, "name", true
	case errors.Is(err, ErrPayloadTooLarge):
		return CodeBadInput, "", true
	case errors.Is(err, ErrRunNotFound), errors.Is(err, ErrThreadNotFound), errWorkflowNotFound(err), errors.Is(err, ErrScheduleNotFound):
		return CodeNotFound, "", true
	case errLeaseHeld(err):
		return CodeLeaseHeld, "", true
	case errors.Is(err, ErrRunFinished), errors.Is(err, ErrNotWaiting), errors.Is(err, ErrRunExists), errors.Is(err, ErrScheduleExists):
		return CodeConflict, "", true
	case errors.Is(err, event.ErrJournalCorrupt):
		// The run is over: every reader shows it failed (journal_corrupt),
		// and a command on it is refused as on any ended run.
		return CodeConflict, "", true
	case errors.Is(err, event.ErrBlob), errors.Is(err, engine.ErrUnfoldable), errors.Is(err, event.ErrThreadCorrupt):
		// The journal gives the same events on every read: retrying
		// cannot help.
		return CodeInternal, "", true
	default:
		return CodeUnavailable, "", false
	}
}

// observeRefusal is where refused commands are counted
// (pal_commands_refused_total): every command passes through a Client
// method, which defers this with its error. Only the caller's mistakes
// and conflicts count (Classify's final answers); a failure of the
// infrastructure, or PAL's own (internal), is not a refusal.
func observeRefusal(command string, errp *error) {
	err := *errp
	if err == nil {
		return
	}
	code, _, final := Classify(err)
	if !final || code == CodeInternal {
		return
	}
	reason := code
	switch {
	case errors.Is(err, ErrRunFinished):
		reason = "run_finished"
	case errors.Is(err, ErrNotWaiting):
		reason = "not_waiting"
	case errors.Is(err, ErrRunExists):
		reason = "run_exists"
	case errors.Is(err, event.ErrJournalCorrupt):
		reason = "journal_corrupt"
	case errors.Is(err, ErrPayloadTooLarge):
		reason = "too_large"
	}
	telemetry.Refused(command, reason)
}
