package runs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/telemetry"
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
	// Broke names the worker whose lease a forced resume broke.
	Broke string `json:"broke,omitempty"`
	// TakenBy names the worker a resume saw take the run.
	TakenBy string `json:"taken_by,omitempty"`
	// Fork says what a fork or retry copied and runs again (RunID is
	// the new run).
	Fork  *ForkResult `json:"fork,omitempty"`
	Error string      `json:"error,omitempty"`
	// Code classifies an error: bad_input, forbidden, not_found,
	// conflict, unavailable, internal.
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

// DefaultReplyPrefix is where command replies may always go: the
// inboxes NATS clients make for requests.
const DefaultReplyPrefix = "_INBOX."

// CheckReply refuses a reply subject outside "_INBOX." and the client's
// reply prefixes (PAL_REPLY_PREFIX), or one with wildcards: PAL would
// otherwise publish its answer wherever a caller says, a run's journal
// or a lease included. An empty subject is fine (no reply).
func (c *Client) CheckReply(subject string) error {
	if subject == "" {
		return nil
	}
	if len(subject) > 255 || strings.ContainsAny(subject, "*> \t\r\n") {
		return &InputError{Field: "reply_to", Msg: "not a plain NATS subject"}
	}
	for _, p := range c.reply {
		if strings.HasPrefix(subject, p) && len(subject) > len(p) {
			return nil
		}
	}
	return &InputError{Field: "reply_to", Msg: fmt.Sprintf("%q: replies go only under %s (PAL_REPLY_PREFIX adds prefixes)", truncate(subject, 80), strings.Join(c.reply, " or "))}
}

// ParseReplyPrefixes parses PAL_REPLY_PREFIX: comma-separated subject
// prefixes, each ending in "." with no wildcards, and none that covers
// PAL's own subjects (pal.) or the system's ($).
func ParseReplyPrefixes(s string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		switch {
		case p == "":
			continue
		case !strings.HasSuffix(p, ".") || strings.HasPrefix(p, ".") || strings.Contains(p, ".."):
			return nil, fmt.Errorf("PAL_REPLY_PREFIX: %q: want a subject prefix ending in '.' (e.g. replies.)", p)
		case strings.ContainsAny(p, "*> \t\r\n"):
			return nil, fmt.Errorf("PAL_REPLY_PREFIX: %q: no wildcards or spaces", p)
		case strings.HasPrefix(p, "pal.") || strings.HasPrefix(p, "$"):
			return nil, fmt.Errorf("PAL_REPLY_PREFIX: %q: may not cover PAL's subjects (pal.) or the system's ($)", p)
		}
		out = append(out, p)
	}
	return out, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}

// decodeCommand decodes a command of type C strictly from body and
// checks the reply subject it names (CheckReply): what every kind of Do
// does first.
func decodeCommand[C any, P interface {
	*C
	replySubject() string
}](c *Client, body []byte) (*C, error) {
	cmd := P(new(C))
	if err := DecodeStrict(body, cmd); err != nil {
		return nil, err
	}
	if err := c.CheckReply(cmd.replySubject()); err != nil {
		return nil, err
	}
	return (*C)(cmd), nil
}

// Do carries out one command of the given kind (start, approve, cancel,
// budget, signal, resume, fork, retry) from its JSON body, for caller.
// key, when not empty, is the transport's deduplication id
// (Nats-Msg-Id): the start's idempotency key when the body names none,
// and a fork's or retry's (commandKey), so a command delivered again
// finds the run it made. The caller's scopes must allow the kind
// (natsauth.CommandScope), a forced resume needs scope admin, and a body's
// by or approver may only repeat the caller's name unless it has admin
// (Caller); else a *ForbiddenError. Start, fork and retry check the
// caller's rights (Caller.Rights).
// It returns the answer and the reply subject named in the body, if any;
// a reply subject CheckReply refuses refuses the whole command.
func (c *Client) Do(ctx context.Context, kind string, body []byte, key string, caller Caller) (Answer, string, error) {
	if err := caller.may(kind); err != nil {
		return Answer{}, "", err
	}
	if !caller.pal {
		// A client user spends its own limits, whatever its body names.
		ctx = WithCaller(ctx, caller.Name)
	}
	switch kind {
	case CmdStart:
		cmd, err := decodeCommand[StartCommand](c, body)
		if err != nil {
			return Answer{}, "", err
		}
		if cmd.IdempotencyKey == "" {
			if cmd.IdempotencyKey, err = commandKey(kind, key); err != nil {
				return Answer{}, cmd.ReplyTo, err
			}
		}
		cmd.By, cmd.Rights = caller.Name, caller.Rights()
		res, err := c.Start(ctx, *cmd)
		if err != nil && res.RunID == "" {
			return Answer{}, cmd.ReplyTo, err
		}
		created := res.Created
		return Answer{OK: true, RunID: res.RunID, Created: &created}, cmd.ReplyTo, nil
	case CmdApprove:
		cmd, err := decodeCommand[ApproveCommand](c, body)
		if err != nil {
			return Answer{}, "", err
		}
		if cmd.Approver, err = caller.actingAs("approver", cmd.Approver, true); err != nil {
			return Answer{}, cmd.ReplyTo, err
		}
		err = c.Approve(ctx, *cmd)
		return Answer{OK: err == nil, RunID: cmd.RunID}, cmd.ReplyTo, err
	case CmdCancel:
		cmd, err := decodeCommand[CancelCommand](c, body)
		if err != nil {
			return Answer{}, "", err
		}
		if cmd.By, err = caller.actingAs("by", cmd.By, false); err != nil {
			return Answer{}, cmd.ReplyTo, err
		}
		err = c.Cancel(ctx, *cmd)
		return Answer{OK: err == nil, RunID: cmd.RunID}, cmd.ReplyTo, err
	case CmdBudget:
		cmd, err := decodeCommand[BudgetCommand](c, body)
		if err != nil {
			return Answer{}, "", err
		}
		if cmd.By, err = caller.actingAs("by", cmd.By, false); err != nil {
			return Answer{}, cmd.ReplyTo, err
		}
		err = c.RaiseBudget(ctx, *cmd)
		return Answer{OK: err == nil, RunID: cmd.RunID}, cmd.ReplyTo, err
	case CmdSignal:
		cmd, err := decodeCommand[SignalCommand](c, body)
		if err != nil {
			return Answer{}, "", err
		}
		if cmd.By, err = caller.actingAs("by", cmd.By, false); err != nil {
			return Answer{}, cmd.ReplyTo, err
		}
		err = c.Signal(ctx, *cmd)
		return Answer{OK: err == nil, RunID: cmd.RunID}, cmd.ReplyTo, err
	case CmdResume:
		cmd, err := decodeCommand[ResumeCommand](c, body)
		if err != nil {
			return Answer{}, "", err
		}
		if err := caller.force(cmd.Force); err != nil {
			return Answer{}, cmd.ReplyTo, err
		}
		res, err := c.Resume(ctx, *cmd)
		return Answer{OK: err == nil, RunID: cmd.RunID, Broke: res.Broke, TakenBy: res.TakenBy}, cmd.ReplyTo, err
	case CmdFork:
		cmd, err := decodeCommand[ForkCommand](c, body)
		if err != nil {
			return Answer{}, "", err
		}
		cmd.By, cmd.Rights = caller.Name, caller.Rights()
		if cmd.IdempotencyKey, err = commandKey(kind, key); err != nil {
			return Answer{}, cmd.ReplyTo, err
		}
		res, err := c.Fork(ctx, *cmd)
		if err != nil && res.RunID == "" {
			return Answer{}, cmd.ReplyTo, err
		}
		return Answer{OK: true, RunID: res.RunID, Created: &res.Created, Fork: &res}, cmd.ReplyTo, nil
	case CmdRetry:
		cmd, err := decodeCommand[RetryCommand](c, body)
		if err != nil {
			return Answer{}, "", err
		}
		cmd.By, cmd.Rights = caller.Name, caller.Rights()
		if cmd.IdempotencyKey, err = commandKey(kind, key); err != nil {
			return Answer{}, cmd.ReplyTo, err
		}
		res, err := c.Retry(ctx, *cmd)
		if err != nil && res.RunID == "" {
			return Answer{}, cmd.ReplyTo, err
		}
		return Answer{OK: true, RunID: res.RunID, Created: &res.Created, Fork: &res}, cmd.ReplyTo, nil
	default:
		return Answer{}, "", &InputError{Msg: fmt.Sprintf("unknown command %q (want start, approve, cancel, budget, signal, resume, fork or retry)", truncate(kind, 64))}
	}
}

// commandKey is the idempotency key a command's Nats-Msg-Id gives ("" for
// none): the id itself for a start, and for a fork or retry the id under
// the kind's name, so it never names a start's run. An id that would make
// a key over MaxNameBytes is refused.
func commandKey(kind, msgID string) (string, error) {
	if msgID == "" {
		return "", nil
	}
	key := msgID
	if kind != CmdStart {
		key = kind + ":" + msgID
	}
	if len(key) > MaxNameBytes {
		return "", &InputError{Field: jetstream.MsgIDHeader, Msg: fmt.Sprintf("%d bytes; the limit is %d", len(msgID), MaxNameBytes-len(key)+len(msgID))}
	}
	return key, nil
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
// unavailable) is retried. One that fails for good (code internal: the
// run's journal cannot be read or folded) goes to PAL_DEAD at once. A
// command whose handler panics is retried, up to eventstore.MaxDeliveries
// deliveries; then it goes to PAL_DEAD with the panic as its reason. Both
// are announced on pal.cmd.rejected (code internal), and the processor
// goes on with the next.
type CommandProcessor struct {
	client *Client
	log    *slog.Logger
	// hook, when set (tests), runs before each command is carried out.
	hook func(kind string, body []byte)

	mu   sync.Mutex
	cc   jetstream.ConsumeContext
	quit chan struct{}
	// unwatch stops /metrics reporting the commands consumer.
	unwatch func()
	wg      sync.WaitGroup
}

// NewCommandProcessor returns a processor that carries commands out
// through client.
func NewCommandProcessor(client *Client, log *slog.Logger) *CommandProcessor {
	if log == nil {
		log = slog.Default()
	}
	return &CommandProcessor{client: client, log: log.With("component", "commands")}
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
	cons, err := p.client.store.JetStream().Consumer(ctx, eventstore.CommandsStream, eventstore.CommandConsumer)
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
	p.unwatch = telemetry.WatchConsumer(p.client.store.JetStream(), eventstore.CommandsStream, eventstore.CommandConsumer)
	return nil
}

// Stop stops consuming and waits for commands in progress.
func (p *CommandProcessor) Stop(ctx context.Context) error {
	p.mu.Lock()
	cc, unwatch := p.cc, p.unwatch
	p.mu.Unlock()
	if cc == nil {
		return nil
	}
	if unwatch != nil {
		unwatch()
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
	kind, caller, callerErr := p.client.commandCaller(m.Subject())
	hdr := m.Headers()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			p.panicked(ctx, m, r, debug.Stack())
		}
	}()
	if p.hook != nil {
		p.hook(kind, m.Data())
	}
	var (
		ans     Answer
		replyTo string
		err     error
	)
	if h := hdr.Get(ReplyToHeader); h != "" {
		err = p.client.CheckReply(h)
		if err == nil {
			replyTo = h
		}
	}
	if err == nil {
		err = callerErr
	}
	if err == nil {
		var bodyReply string
		ans, bodyReply, err = p.client.Do(ctx, kind, m.Data(), hdr.Get(jetstream.MsgIDHeader), caller)
		if replyTo == "" {
			replyTo = bodyReply
		}
	}
	if err != nil {
		code, field, final := Classify(err)
		if !final {
			p.log.Warn("command failed; retrying", "subject", m.Subject(), "err", err)
			_ = m.NakWithDelay(time.Second)
			return
		}
		if code == CodeInternal {
			// It fails the same way on every delivery: settled for good.
			p.dead(ctx, m, err, replyTo)
			return
		}
		if field == "reply_to" {
			replyTo = "" // never answer where the caller may not be answered
		}
		ans = Answer{Error: err.Error(), Code: code, Field: field}
		p.reject(m, err, code, field)
	} else {
		p.log.Info("command done", "subject", m.Subject(), "run_id", ans.RunID)
	}
	if replyTo != "" {
		if b, jerr := json.Marshal(ans); jerr == nil {
			_ = p.client.nc.Publish(replyTo, b)
		}
	}
	_ = m.Ack()
}

// panicked settles a command whose handler panicked: it is handed back
// until its last delivery, which is dead-lettered and announced.
func (p *CommandProcessor) panicked(ctx context.Context, m jetstream.Msg, r any, stack []byte) {
	seq, n := msgIDs(m)
	reason := fmt.Sprintf("panic: %v", r)
	p.log.Error("command handler panicked", "subject", m.Subject(), "stream_seq", seq, "delivery", n,
		"panic", r, "stack", string(stack))
	dead, err := p.client.store.Retry(context.WithoutCancel(ctx), eventstore.DeadCommands, m, reason, time.Second)
	switch {
	case err != nil:
		p.log.Warn("handing back a command that panicked", "subject", m.Subject(), "stream_seq", seq, "err", err)
	case dead:
		reply := ""
		if h := m.Headers().Get(ReplyToHeader); h != "" && p.client.CheckReply(h) == nil {
			reply = h
		}
		p.deadLettered(m, fmt.Errorf("dead-lettered to %s after %d deliveries: %s", eventstore.DeadStream, n, reason), reason, reply)
	}
}

// dead settles a command that failed for good (code internal: the run's
// journal cannot be read or folded): it goes to PAL_DEAD at once, as
// work for such a run does, instead of being retried without end.
func (p *CommandProcessor) dead(ctx context.Context, m jetstream.Msg, cause error, replyTo string) {
	seq, _ := msgIDs(m)
	if err := p.client.store.Dead(context.WithoutCancel(ctx), eventstore.DeadCommands, m, cause.Error()); err != nil {
		// Handed back (Dead naks what it could not copy): tried again.
		p.log.Warn("dead-lettering a command that failed for good", "subject", m.Subject(), "stream_seq", seq,
			"cause", cause, "err", err)
		return
	}
	p.deadLettered(m, fmt.Errorf("dead-lettered to %s: %w", eventstore.DeadStream, cause), cause.Error(), replyTo)
}

// deadLettered logs and announces a command that went to PAL_DEAD (code
// internal), and answers it on replyTo when that is not "".
func (p *CommandProcessor) deadLettered(m jetstream.Msg, err error, reason, replyTo string) {
	seq, n := msgIDs(m)
	p.log.Warn("command dead-lettered to "+eventstore.DeadStream, "subject", m.Subject(), "stream_seq", seq,
		"deliveries", n, "reason", eventstore.DeadReason(reason))
	p.announce(m, seq, err, CodeInternal, "")
	if replyTo != "" {
		if b, jerr := json.Marshal(Answer{Error: err.Error(), Code: CodeInternal}); jerr == nil {
			_ = p.client.nc.Publish(replyTo, b)
		}
	}
}

// msgIDs are a message's stream sequence and delivery count (0 without
// metadata).
func msgIDs(m jetstream.Msg) (seq, delivered uint64) {
	if md, err := m.Metadata(); err == nil {
		return md.Sequence.Stream, md.NumDelivered
	}
	return 0, 0
}

// reject logs a refused command and announces it on pal.cmd.rejected.
func (p *CommandProcessor) reject(m jetstream.Msg, err error, code, field string) {
	seq, _ := msgIDs(m)
	p.log.Warn("command rejected", "subject", m.Subject(), "stream_seq", seq, "code", code, "err", err)
	p.announce(m, seq, err, code, field)
}

// announce publishes a refused command's Rejection on pal.cmd.rejected.
func (p *CommandProcessor) announce(m jetstream.Msg, seq uint64, err error, code, field string) {
	body := string(m.Data())
	if len(body) > 4096 {
		body = strings.ToValidUTF8(body[:4096], "") + "…"
	}
	if b, jerr := json.Marshal(Rejection{Subject: m.Subject(), StreamSeq: seq, Error: err.Error(), Code: code, Field: field, Command: body}); jerr == nil {
		_ = p.client.nc.Publish(eventstore.RejectedSubject, b)
	}
}
