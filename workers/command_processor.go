package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/workflow"
)

// ReplyToHeader names a subject on which a durable command's outcome is
// answered (the command body's reply_to field does the same).
const ReplyToHeader = "Pal-Reply-To"

// Answer is the outcome of a command, as sent to its reply subject and by
// the NATS service.
type Answer struct {
	OK      bool   `json:"ok"`
	RunID   string `json:"run_id,omitempty"`
	Created *bool  `json:"created,omitempty"`
	Error   string `json:"error,omitempty"`
	// Code classifies an error: bad_input, not_found, conflict, unavailable.
	Code  string `json:"code,omitempty"`
	Field string `json:"field,omitempty"`
}

// Rejection is published on pal.cmd.rejected for every refused command.
type Rejection struct {
	Subject   string `json:"subject"`
	StreamSeq uint64 `json:"stream_seq,omitempty"`
	Error     string `json:"error"`
	Code      string `json:"code"`
	Field     string `json:"field,omitempty"`
	Command   string `json:"command"`
}

// Classify maps a command error to an answer code; ok is false for
// errors that are worth retrying (the infrastructure, not the command).
func Classify(err error) (code string, field string, final bool) {
	var ie *InputError
	var ve *workflow.ValidationError
	switch {
	case errors.As(err, &ie):
		return "bad_input", ie.Field, true
	case errors.As(err, &ve):
		return "bad_input", "workflow", true
	case errors.Is(err, eventstore.ErrPayloadTooLarge):
		return "bad_input", "", true
	case errors.Is(err, eventstore.ErrRunNotFound):
		return "not_found", "", true
	case errors.Is(err, ErrRunFinished), errors.Is(err, ErrNotWaiting), errors.Is(err, eventstore.ErrRunExists):
		return "conflict", "", true
	case strings.HasPrefix(err.Error(), "invalid run id"), strings.HasPrefix(err.Error(), "invalid run input"):
		return "bad_input", "run_id", true
	default:
		return "unavailable", "", false
	}
}

// Do carries out one command of the given kind (start, approve, cancel,
// signal) from its JSON body. key, when not empty, is the transport's
// deduplication id (Nats-Msg-Id), used as the start's idempotency key
// when the body names none. It returns the answer and the reply subject
// named in the body, if any.
func Do(ctx context.Context, store *eventstore.Store, nc *nats.Conn, kind string, body []byte, key, by string) (Answer, string, error) {
	switch kind {
	case CmdStart:
		var c StartCommand
		if err := DecodeStrict(body, &c); err != nil {
			return Answer{}, "", err
		}
		if err := c.Validate(); err != nil {
			return Answer{}, c.ReplyTo, err
		}
		if c.IdempotencyKey == "" {
			c.IdempotencyKey = key
		}
		res, err := StartRun(ctx, store, StartRequest{RunID: c.RunID, Workflow: c.Workflow, LLM: c.LLM, Input: c.Input,
			IdempotencyKey: c.IdempotencyKey, Writer: by})
		if err != nil && res.RunID == "" {
			return Answer{}, c.ReplyTo, err
		}
		created := res.Created
		return Answer{OK: true, RunID: res.RunID, Created: &created}, c.ReplyTo, nil
	case CmdApprove:
		var c ApproveCommand
		if err := DecodeStrict(body, &c); err != nil {
			return Answer{}, "", err
		}
		if err := c.Validate(); err != nil {
			return Answer{}, c.ReplyTo, err
		}
		err := Approve(ctx, store, ApproveRequest{RunID: c.RunID, StepID: c.StepID, Approve: c.Decision == "approve",
			Approver: c.Approver, Comment: c.Comment})
		return Answer{OK: err == nil, RunID: c.RunID}, c.ReplyTo, err
	case CmdCancel:
		var c CancelCommand
		if err := DecodeStrict(body, &c); err != nil {
			return Answer{}, "", err
		}
		if err := c.Validate(); err != nil {
			return Answer{}, c.ReplyTo, err
		}
		if c.By == "" {
			c.By = by
		}
		err := CancelRun(ctx, store, nc, CancelRequest{RunID: c.RunID, Reason: c.Reason, By: c.By})
		return Answer{OK: err == nil, RunID: c.RunID}, c.ReplyTo, err
	case CmdSignal:
		var c SignalCommand
		if err := DecodeStrict(body, &c); err != nil {
			return Answer{}, "", err
		}
		if err := c.Validate(); err != nil {
			return Answer{}, c.ReplyTo, err
		}
		err := Signal(ctx, store, c.RunID, c.Name, c.Payload)
		return Answer{OK: err == nil, RunID: c.RunID}, c.ReplyTo, err
	default:
		return Answer{}, "", &InputError{Msg: fmt.Sprintf("unknown command %q (want start, approve, cancel or signal)", kind)}
	}
}

// ErrorAnswer renders an error as an Answer.
func ErrorAnswer(err error) Answer {
	code, field, _ := Classify(err)
	return Answer{Error: err.Error(), Code: code, Field: field}
}

// CommandProcessor carries out the durable commands of PAL_CMDS (consumer
// pal-commands). A command published while no worker runs waits in the
// stream and is carried out when one starts. A refused command is never
// dropped silently: the reason is answered to its reply subject (header
// Pal-Reply-To or field reply_to) when it has one, logged, and published
// on pal.cmd.rejected. A command that fails for a passing reason (NATS
// unavailable) is retried.
type CommandProcessor struct {
	store *eventstore.Store
	nc    *nats.Conn
	log   *slog.Logger

	mu   sync.Mutex
	cc   jetstream.ConsumeContext
	quit chan struct{}
	wg   sync.WaitGroup
}

// NewCommandProcessor returns a processor over the store's connection.
func NewCommandProcessor(store *eventstore.Store, log *slog.Logger) *CommandProcessor {
	if log == nil {
		log = slog.Default()
	}
	return &CommandProcessor{store: store, nc: store.JetStream().Conn(), log: log.With("component", "commands")}
}

// commandWorkers is how many commands are carried out at once.
const commandWorkers = 4

// Start begins consuming commands.
func (p *CommandProcessor) Start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cc != nil {
		return errors.New("command processor already started")
	}
	cons, err := p.store.JetStream().Consumer(ctx, eventstore.CommandsStream, eventstore.CommandConsumer)
	if err != nil {
		return fmt.Errorf("opening consumer %s: %w", eventstore.CommandConsumer, err)
	}
	jobs, quit := make(chan jetstream.Msg), make(chan struct{})
	p.quit = quit
	runCtx := context.WithoutCancel(ctx)
	for range commandWorkers {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for {
				select {
				case m := <-jobs:
					p.handle(runCtx, m)
				case <-quit:
					return
				}
			}
		}()
	}
	p.cc, err = cons.Consume(func(m jetstream.Msg) {
		select {
		case jobs <- m:
		case <-quit:
			_ = m.Nak() // stopping: another worker takes it
		}
	}, jetstream.PullMaxMessages(commandWorkers*4))
	if err != nil {
		close(quit)
		p.wg.Wait()
		return fmt.Errorf("consuming commands: %w", err)
	}
	return nil
}

// Stop stops consuming and waits for commands in progress.
func (p *CommandProcessor) Stop(ctx context.Context) error {
	p.mu.Lock()
	cc := p.cc
	p.mu.Unlock()
	if cc == nil {
		return nil
	}
	cc.Drain()
	select {
	case <-cc.Closed():
	case <-ctx.Done():
		return ctx.Err()
	}
	p.mu.Lock()
	if p.quit != nil {
		close(p.quit)
		p.quit = nil
	}
	p.mu.Unlock()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *CommandProcessor) handle(ctx context.Context, m jetstream.Msg) {
	kind := strings.TrimPrefix(m.Subject(), eventstore.CommandPrefix)
	hdr := m.Headers()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ans, replyTo, err := Do(ctx, p.store, p.nc, kind, m.Data(), hdr.Get(jetstream.MsgIDHeader), "pal.cmd")
	if h := hdr.Get(ReplyToHeader); h != "" {
		replyTo = h
	}
	if err != nil {
		code, field, final := Classify(err)
		if !final {
			p.log.Warn("command failed; retrying", "subject", m.Subject(), "err", err)
			_ = m.NakWithDelay(time.Second)
			return
		}
		ans = Answer{Error: err.Error(), Code: code, Field: field}
		var seq uint64
		if md, merr := m.Metadata(); merr == nil {
			seq = md.Sequence.Stream
		}
		body := string(m.Data())
		if len(body) > 4096 {
			body = body[:4096] + "…"
		}
		p.log.Warn("command rejected", "subject", m.Subject(), "stream_seq", seq, "code", code, "err", err)
		if b, jerr := json.Marshal(Rejection{Subject: m.Subject(), StreamSeq: seq, Error: err.Error(), Code: code, Field: field, Command: body}); jerr == nil {
			_ = p.nc.Publish(eventstore.RejectedSubject, b)
		}
	} else {
		p.log.Info("command done", "subject", m.Subject(), "run_id", ans.RunID)
	}
	if replyTo != "" {
		if b, jerr := json.Marshal(ans); jerr == nil {
			_ = p.nc.Publish(replyTo, b)
		}
	}
	_ = m.Ack()
}
