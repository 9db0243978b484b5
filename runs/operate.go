package runs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/limit"
	"github.com/palrun/pal/workflow"
)

// Command kinds of the operator's commands: pal.cmd.runs.<kind> and
// pal.api.runs.<kind>.
const (
	CmdResume = "resume"
	CmdFork   = "fork"
	CmdRetry  = "retry"
)

// CodeLeaseHeld answers a resume refused because a worker holds the
// run's lease (409).
const CodeLeaseHeld = "lease_held"

// ResumeCommand drives a run now: pal.cmd.runs.resume,
// pal.api.runs.resume, POST /v1/runs/{id}/resume, pal run resume.
type ResumeCommand struct {
	RunID string `json:"run_id"`
	// Force takes the run from the worker holding its lease (a frozen or
	// partitioned one that has not let go): the lease is broken and the
	// next drive's fencing token keeps the old holder's appends out.
	Force   bool   `json:"force,omitempty"`
	ReplyTo string `json:"reply_to,omitempty"`
}

func (c *ResumeCommand) replySubject() string { return c.ReplyTo }

// ResumeResult says what a resume did.
type ResumeResult struct {
	RunID string `json:"run_id"`
	// Broke names the worker whose lease a forced resume broke.
	Broke string `json:"broke,omitempty"`
	// TakenBy names the worker that took the run, when one did within
	// about two seconds ("": the run is queued; no worker took it yet).
	TakenBy string `json:"taken_by,omitempty"`
}

// Validate checks a resume command.
func (c *ResumeCommand) Validate() error { return checkRunID("run_id", c.RunID) }

// Resume queues a queued, running or waiting run at the head of the work
// queue, so a worker drives it at once instead of after a lease TTL or
// the recovery sweep (a parked run parks again unless its input is in).
// It never drives two workers at one run: a run whose lease a worker
// holds is refused (*LeaseHeldError, code lease_held) unless Force, which
// breaks the lease; the fenced journal keeps the old holder's later
// appends out either way.
//
// Errors: *InputError, ErrRunNotFound, ErrRunFinished (the journal of an
// ended run stays closed: retry or fork it), *eventstore.LeaseHeldError.
func (c *Client) Resume(ctx context.Context, cmd ResumeCommand) (_ ResumeResult, err error) {
	if err := c.admit(ctx, CmdResume, limit.Command, ""); err != nil {
		return ResumeResult{}, err
	}
	defer observeRefusal(CmdResume, &err)
	if err := cmd.Validate(); err != nil {
		return ResumeResult{}, err
	}
	st, err := c.fold(ctx, cmd.RunID)
	if err != nil {
		return ResumeResult{}, err
	}
	if st.Status.Terminal() {
		return ResumeResult{}, fmt.Errorf("resuming run %s: %w (%s); its journal stays closed: pal run retry %s, or pal run fork %s --from STEP, makes a new run",
			cmd.RunID, ErrRunFinished, st.Status, cmd.RunID, cmd.RunID)
	}
	leases, err := eventstore.OpenLeases(ctx, c.store.JetStream(), 0)
	if err != nil {
		return ResumeResult{}, fmt.Errorf("resuming run %s: %w", cmd.RunID, err)
	}
	res := ResumeResult{RunID: cmd.RunID}
	if cmd.Force {
		if res.Broke, err = leases.Break(ctx, cmd.RunID); err != nil {
			return ResumeResult{}, err
		}
	} else {
		holder, err := leases.Holder(ctx, cmd.RunID)
		if err != nil {
			return ResumeResult{}, err
		}
		if holder != "" {
			return ResumeResult{}, fmt.Errorf("resuming run %s: %w; it is being driven (resume --force takes it over, fenced)",
				cmd.RunID, &eventstore.LeaseHeldError{RunID: cmd.RunID, Owner: holder})
		}
	}
	// The fresh work message may go to a pull request a frozen worker
	// left open (it lasts a second): if no worker takes the lease soon,
	// the message is replaced again, until a live worker has it.
	for try := 0; try < resumeTries && res.TakenBy == ""; try++ {
		wctx, cancel := context.WithTimeout(ctx, resumeTryWait)
		res.TakenBy, err = leases.AfterTaken(wctx, cmd.RunID, func() error { return c.store.Requeue(ctx, st.Created.Queue, cmd.RunID, "resume") })
		cancel()
		if err != nil {
			return ResumeResult{}, err
		}
		if err := ctx.Err(); err != nil {
			return ResumeResult{}, err
		}
	}
	return res, nil
}

// A resume replaces the run's work message up to resumeTries times, each
// time waiting resumeTryWait for a worker to take the run: longer, all
// told, than a worker's pull request lives (1 s).
const (
	resumeTries   = 10
	resumeTryWait = 200 * time.Millisecond
)

// ForkCommand starts a new run from a step of another: pal.cmd.runs.fork,
// pal.api.runs.fork, POST /v1/runs/{id}/fork, pal run fork.
type ForkCommand struct {
	// RunID is the source run.
	RunID string `json:"run_id"`
	// From is the step id to fork from: it and everything after it runs
	// fresh; the steps the source completed before it are copied.
	From string `json:"from"`
	// Workflow, when set, replaces the source's: a step is copied only if
	// its node is unchanged (node hash).
	Workflow json.RawMessage `json:"workflow,omitempty"`
	// Input, when set, replaces the source's input.
	Input json.RawMessage `json:"input,omitempty"`
	// NewRunID names the new run (default: a fresh id, or with
	// IdempotencyKey the key's, RunIDForKey).
	NewRunID string `json:"new_run_id,omitempty"`
	ReplyTo  string `json:"reply_to,omitempty"`
	// By names who forks (the worker_id of the new run_created).
	By string `json:"-"`
	// Rights is what the caller may do: RightStart, and RightDeploy for a
	// fork with a workflow (which is deployed, as an inline start's).
	Rights Rights `json:"-"`
	// IdempotencyKey, set by the transport (a durable command's
	// Nats-Msg-Id), makes the fork idempotent as it does a start: the
	// same key finds the run it made.
	IdempotencyKey string `json:"-"`
	// at is the seq to fork at when From never started: a retry of a
	// step that failed before its step_started (rendering its input
	// failed) forks at the run_failed that names it.
	at uint64
}

func (c *ForkCommand) replySubject() string { return c.ReplyTo }

// RetryCommand is a fork from the source's first failed step with the
// same workflow and input: pal.cmd.runs.retry, pal.api.runs.retry,
// POST /v1/runs/{id}/retry, pal run retry.
type RetryCommand struct {
	RunID    string `json:"run_id"`
	NewRunID string `json:"new_run_id,omitempty"`
	ReplyTo  string `json:"reply_to,omitempty"`
	By       string `json:"-"`
	// Rights is what the caller may do (RightStart: a retry keeps the
	// source's workflow).
	Rights Rights `json:"-"`
	// IdempotencyKey is ForkCommand's.
	IdempotencyKey string `json:"-"`
}

func (c *RetryCommand) replySubject() string { return c.ReplyTo }

// ForkResult says what a fork made: the new run, which source steps it
// copies and which it runs again, and why.
type ForkResult struct {
	RunID      string            `json:"run_id"`
	ForkedFrom ForkPoint         `json:"forked_from"`
	Copied     []string          `json:"copied"`
	Rerun      []event.RerunStep `json:"rerun"`
	// Created is false when the fork was a duplicate of an earlier one
	// (same idempotency key): the run already existed.
	Created bool `json:"-"`
}

// ForkPoint is run_created's forked_from without its copies.
type ForkPoint struct {
	RunID  string `json:"run_id"`
	StepID string `json:"step_id"`
	Seq    uint64 `json:"seq"`
}

// Validate checks a fork command.
func (c *ForkCommand) Validate() error {
	if err := checkRunID("run_id", c.RunID); err != nil {
		return err
	}
	if c.NewRunID != "" {
		if err := checkRunID("new_run_id", c.NewRunID); err != nil {
			return err
		}
	}
	if c.From == "" {
		return &InputError{Field: "from", Msg: "required: the step to fork from"}
	}
	if in := bytes.TrimSpace(c.Input); len(in) > 0 && !json.Valid(in) {
		return &InputError{Field: "input", Msg: "not valid JSON"}
	}
	if wf := bytes.TrimSpace(c.Workflow); len(wf) > 0 && wf[0] != '{' {
		return &InputError{Field: "workflow", Msg: "want a JSON object"}
	}
	return checkLen("from", c.From, MaxNameBytes)
}

// Fork starts a new run from step From of run RunID. The source's
// journal is only read. Every step the source completed before From first
// started (in any order the graph ran them: loop iterations and agent
// turns are steps too) is copied into the new run's run_created
// (forked_from.copies); the new run completes each with the source's
// output, marked copied_from, and never executes it. From and everything
// after it run fresh, under the new run's idempotency keys. With another
// workflow a step is copied only if its outermost node (the loop or agent
// it runs in, or its own) hashes the same, and every step completed after
// one that is not copied is not copied either: it may have read that
// step's output. ForkResult.Rerun says which steps run again and why.
//
// The new run keeps the source's labels, so a search for them finds the
// fork beside its source, and the source's deployed workflow version; a fork with
// another workflow deploys it first, as an inline start does, and needs
// the same right (RightDeploy).
//
// Errors: *InputError (a step the source never started), *ForbiddenError,
// ErrRunNotFound, *workflow.ValidationError, ErrRunExists,
// ErrPayloadTooLarge (the copies do not fit in one journal message).
func (c *Client) Fork(ctx context.Context, cmd ForkCommand) (_ ForkResult, err error) {
	if err := c.admit(ctx, CmdFork, limit.Start, cmd.By); err != nil {
		return ForkResult{}, err
	}
	defer observeRefusal(CmdFork, &err)
	return c.fork(ctx, cmd)
}

// fork is Fork, its refusals uncounted (Retry counts its own).
func (c *Client) fork(ctx context.Context, cmd ForkCommand) (ForkResult, error) {
	if err := cmd.Validate(); err != nil {
		return ForkResult{}, err
	}
	changed := len(bytes.TrimSpace(cmd.Workflow)) > 0
	if err := need(cmd.Rights, RightStart, "run_id", "forking a run"); err != nil {
		return ForkResult{}, err
	}
	if changed {
		if err := need(cmd.Rights, AllRights, "workflow", "forking a run with another workflow (a definition, which is deployed)"); err != nil {
			return ForkResult{}, err
		}
	}
	src, err := c.fold(ctx, cmd.RunID)
	if err != nil {
		return ForkResult{}, err
	}
	if src.Workflow == nil {
		return ForkResult{}, fmt.Errorf("forking run %s: %w: its workflow snapshot does not parse", cmd.RunID, ErrNotWaiting)
	}
	from := forkSeq(src, cmd.From)
	if from == 0 {
		from = cmd.at
	}
	if from == 0 {
		return ForkResult{}, &InputError{Field: "from", Msg: fmt.Sprintf("run %s never started step %q (its steps: %s)",
			cmd.RunID, truncate(cmd.From, 80), truncate(strings.Join(src.Order, ", "), 400))}
	}
	next, dep := src.Workflow, src.Created.Deployed
	if changed {
		if next, dep, err = c.deployInline(ctx, cmd.Workflow, nil, cmd.By); err != nil {
			return ForkResult{}, err
		}
	}
	ff := &event.ForkedFrom{RunID: cmd.RunID, StepID: cmd.From, Seq: from}
	res := ForkResult{ForkedFrom: ForkPoint{RunID: cmd.RunID, StepID: cmd.From, Seq: from}, Copied: []string{}, Rerun: []event.RerunStep{}}
	rerun := "" // the first source step not copied: everything completed after it runs again
	for _, s := range completedBefore(src, from) {
		outer := outerNode(s.ID)
		oldHash, newHash := nodeHash(src.Workflow, outer), nodeHash(next, outer)
		reason := ""
		switch {
		case rerun != "":
			reason = fmt.Sprintf("completed after step %s, which runs again", rerun)
		case newHash == "":
			reason = fmt.Sprintf("node %s is not in the new workflow", outer)
		case oldHash != newHash:
			reason = fmt.Sprintf("node %s changed (sha256 %.12s → %.12s)", outer, oldHash, newHash)
		}
		if reason != "" {
			if rerun == "" {
				rerun = s.ID
			}
			ff.Rerun = append(ff.Rerun, event.RerunStep{StepID: s.ID, Reason: reason})
			continue
		}
		ff.Copies = append(ff.Copies, event.CopiedStep{StepID: s.ID, NodeID: s.NodeID, NodeType: s.NodeType,
			Output: s.Output, Delivery: s.Delivery, Seq: s.CompletedSeq, NodeHash: newHash})
		res.Copied = append(res.Copied, s.ID)
	}
	res.Rerun = append(res.Rerun, ff.Rerun...)
	input := cmd.Input
	if len(bytes.TrimSpace(input)) == 0 {
		input = src.Created.Input
	}
	by := cmd.By
	if by == "" {
		by = "pal"
	}
	start, err := c.create(ctx, StartCommand{RunID: cmd.NewRunID, IdempotencyKey: cmd.IdempotencyKey,
		Input: input, Labels: src.Created.Labels, By: by, forkedFrom: ff}, next, dep)
	if err != nil && start.RunID == "" {
		return ForkResult{}, err
	}
	res.RunID, res.Created = start.RunID, start.Created
	return res, err
}

// Retry forks a failed or cancelled run from its first failed step (the
// step its run_failed names, else the first that failed, else the first
// that started and did not complete), with the same workflow and input. A
// step that failed before it started (its input did not render) is forked
// at the run_failed: every step the run completed is copied.
//
// Errors: those of Fork; ErrNotWaiting (a conflict) for a run that has
// not ended or succeeded, or has no step to retry (fork it from a step
// instead).
func (c *Client) Retry(ctx context.Context, cmd RetryCommand) (_ ForkResult, err error) {
	if err := c.admit(ctx, CmdRetry, limit.Start, cmd.By); err != nil {
		return ForkResult{}, err
	}
	defer observeRefusal(CmdRetry, &err)
	if err := checkRunID("run_id", cmd.RunID); err != nil {
		return ForkResult{}, err
	}
	if err := need(cmd.Rights, RightStart, "run_id", "retrying a run"); err != nil {
		return ForkResult{}, err
	}
	src, err := c.fold(ctx, cmd.RunID)
	if err != nil {
		return ForkResult{}, err
	}
	switch src.Status {
	case engine.StatusFailed, engine.StatusCancelled:
	case engine.StatusSucceeded:
		return ForkResult{}, retryRefusal("retrying run %s: it succeeded, so no step failed to retry; fork it from a step instead", cmd.RunID)
	default:
		return ForkResult{}, retryRefusal("retrying run %s: it has not ended (it is %s): resume it, or cancel it first", cmd.RunID, src.Status)
	}
	from, at := retryFrom(src)
	if from == "" {
		why := "it was cancelled"
		if src.Status == engine.StatusFailed {
			why = "it failed: " + src.Error
		}
		return ForkResult{}, retryRefusal("retrying run %s: no step of it failed or was left unfinished (%s); fork it from a step instead", cmd.RunID, why)
	}
	return c.fork(ctx, ForkCommand{RunID: cmd.RunID, From: from, NewRunID: cmd.NewRunID, By: cmd.By, Rights: cmd.Rights,
		IdempotencyKey: cmd.IdempotencyKey, at: at})
}

// notWaitingError is a refusal of ErrNotWaiting's class (conflict) worded
// for its command: errors.Is matches ErrNotWaiting, the text is the
// command's own ("step is not waiting" reads oddly for a retry).
type notWaitingError struct{ msg string }

func (e *notWaitingError) Error() string        { return e.msg }
func (e *notWaitingError) Is(target error) bool { return target == ErrNotWaiting }

func retryRefusal(format string, args ...any) error {
	return &notWaitingError{msg: fmt.Sprintf(format, args...)}
}

// retryFrom is the step a retry forks from, and the seq to fork at when
// that step never started (else 0: the step's first event).
func retryFrom(st *engine.RunState) (string, uint64) {
	if st.FailedStep != "" {
		if _, ok := st.Steps[st.FailedStep]; ok {
			return st.FailedStep, 0
		}
		// The run failed on a step before its step_started: the fold
		// takes nothing after the terminal run_failed, so LastSeq is it.
		if st.Status == engine.StatusFailed && st.Workflow != nil && st.Workflow.Index(outerNode(st.FailedStep)) >= 0 {
			return st.FailedStep, st.LastSeq
		}
	}
	for _, id := range st.Order {
		if st.Steps[id].Status == engine.StepFailed {
			return id, 0
		}
	}
	for _, id := range st.Order {
		if st.Steps[id].Status != engine.StepCompleted {
			return id, 0
		}
	}
	return "", 0
}

// forkSeq is the seq of the first event of step from, or of any step in
// it (a loop's iterations and an agent's turns start before the loop or
// agent step itself completes): 0 if the run never started it.
func forkSeq(st *engine.RunState, from string) uint64 {
	var seq uint64
	for id, s := range st.Steps {
		if id != from && !strings.HasPrefix(id, from+"[") && !strings.HasPrefix(id, from+".") {
			continue
		}
		for _, a := range s.Attempts {
			if seq == 0 || a.FirstSeq < seq {
				seq = a.FirstSeq
			}
		}
	}
	return seq
}

// completedBefore lists the steps completed before seq, in the order they
// completed.
func completedBefore(st *engine.RunState, seq uint64) []*engine.Step {
	var out []*engine.Step
	for _, s := range st.Steps {
		if s.Status == engine.StepCompleted && s.CompletedSeq < seq {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CompletedSeq < out[j].CompletedSeq })
	return out
}

// outerNode is the top-level node a step runs in: the outermost loop's
// node, an agent's for its turns and calls, else the step's own.
func outerNode(stepID string) string {
	id, err := engine.ParseStepID(stepID)
	if err != nil {
		return stepID
	}
	if len(id.Loops) > 0 {
		return id.Loops[0].Loop
	}
	return id.Node
}

// NodeHash is the hex sha256 of a node's canonical JSON (sorted keys, no
// spaces): what a fork with another workflow compares. "" when wf has no
// node id.
func NodeHash(wf *workflow.Workflow, id string) string { return nodeHash(wf, id) }

func nodeHash(wf *workflow.Workflow, id string) string {
	i := wf.Index(id)
	if i < 0 {
		return ""
	}
	raw, err := json.Marshal(wf.Nodes[i])
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(canonical(raw))
	return hex.EncodeToString(sum[:])
}

// errLeaseHeld reports whether err is a refused resume.
func errLeaseHeld(err error) bool { return errors.Is(err, eventstore.ErrLeaseHeld) }
