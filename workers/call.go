package workers

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/palrun/pal/connector"
	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/redact"
	"github.com/palrun/pal/provider"
)

// call is one step executing: in a branch of its own while other steps
// of the run are in flight (flight.go). It reads nothing of the run's
// state, which belongs to the drive's goroutine: what it needs from there
// is given when it starts (the run's prices, its deployed version, a
// child's run_created), and what it must journal before it goes on (a
// delivery's claim, a child's creation) it hands to the drive's goroutine
// (journal).
type call struct {
	d   *drive
	ctx context.Context
	p   engine.StepPlan
	// prices are the run's (RunState.Prices): every call is charged at
	// them.
	prices event.Prices
	// deployed is the deployed workflow the run runs (run_created's), nil
	// for none: secrets resolve only in a run of one (secretsFor).
	deployed *event.Deployed
	// child is the run_created of a subagent step's child, built by the
	// drive when the step started; nil when the child was created before.
	child *event.Event
	// deltas is where an LLM step's answer streams (drive.deltas), named
	// by the journal's seq when the step started.
	deltas provider.Sink
	// thread is the run's thread (run_created's), "" for none: an LLM
	// step of a thread node continues it (thread.go).
	thread string
	// held are the run's values an LLM step's images may name (heldValues),
	// when its call names a blob.
	held []json.RawMessage
}

// journal runs fn on the drive's goroutine, the run's one writer, and
// returns its error: how a branch journals what must be durable before
// it goes on. fn may emit and flush.
func (c *call) journal(fn func() error) error {
	req := driveCall{fn: fn, done: make(chan error, 1)}
	select {
	case c.d.fly.calls <- req:
	case <-c.ctx.Done():
		return context.Cause(c.ctx)
	}
	// Once taken, the drive answers: it runs fn, or refuses it while the
	// run fails (interrupt).
	return <-req.done
}

// execute runs the step's executor.
func (c *call) execute() (stepResult, error) {
	switch c.p.Exec {
	case engine.ExecLLM:
		return c.execAI()
	case engine.ExecTool:
		return c.execTool()
	case engine.ExecConnector:
		return c.execConnector()
	case engine.ExecSubagent:
		return c.runChild()
	default:
		return stepResult{}, permanent("step %s: nothing executes %q steps", c.p.StepID, c.p.Exec)
	}
}

func (c *call) execTool() (stepResult, error) {
	p, w := c.p, c.d.w
	var in engine.ToolInput
	if err := json.Unmarshal(p.Input, &in); err != nil {
		return stepResult{}, permanent("step %s: bad input: %v", p.StepID, err)
	}
	if in.MCP != "" {
		return c.execMCP(in)
	}
	fn, ok := w.tools[in.Tool]
	if !ok {
		names := make([]string, 0, len(w.tools))
		for n := range w.tools {
			names = append(names, n)
		}
		sort.Strings(names)
		return stepResult{}, permanent("step %s: configuration error: tool %q is not registered on worker %s (queues %s; registered: %v): run the workflow on a queue whose workers register it (pal workers lists them)",
			p.StepID, in.Tool, w.cfg.ID, strings.Join(w.cfg.Queues, ","), names)
	}
	ctx, cancel := context.WithTimeout(c.ctx, timeoutOf(p.TimeoutMs, defaultToolTimeout))
	defer cancel()
	ctx = context.WithValue(ctx, stepInfoKey{}, StepInfo{RunID: c.d.runID, StepID: p.StepID, Attempt: p.Attempt, IdempotencyKey: p.Key})
	sec := c.secretsFor(p.Node)
	out, err := fn(context.WithValue(ctx, secretsKey{}, sec), in.Input)
	if err != nil {
		return stepResult{}, redact.Error(err, sec.used...)
	}
	if len(out) == 0 {
		out = json.RawMessage("null")
	}
	// Measured before it is parsed: scanning 64 MiB that cannot be
	// journaled anyway costs seconds a lease may not have.
	if err := c.d.fits(p, "output", out); err != nil {
		return stepResult{}, err
	}
	if !json.Valid(out) {
		return stepResult{}, &ToolError{Err: fmt.Errorf("tool %q returned output that is not JSON", in.Tool)}
	}
	return stepResult{output: out}, nil
}

// execConnector delivers once, with a receipt: claim (durable, journaled
// by the drive) → send → confirm. A delivery an earlier drive claimed is
// not sent again: the drive settles it without a call (claimedDelivery).
func (c *call) execConnector() (stepResult, error) {
	p, w := c.p, c.d.w
	var in engine.ConnectorInput
	if err := json.Unmarshal(p.Input, &in); err != nil {
		return stepResult{}, permanent("step %s: bad input: %v", p.StepID, err)
	}
	conn, err := w.connectors.Get(in.Kind)
	if err != nil {
		return stepResult{}, permanent("step %s: %v", p.StepID, err)
	}
	sec := c.secretsFor(p.Node)
	url, headers, err := sec.expandAll(in.URL, in.Headers)
	if err == nil {
		err = sec.allowToURL(url) // a webhook follows no redirect: its URL is where it goes
	}
	if err != nil {
		return stepResult{}, redact.Error(fmt.Errorf("step %s: %w", p.StepID, err), sec.used...)
	}
	target := redact.URL(in.URL)
	if in.Email != nil {
		target = emailTarget(in.Email)
	}
	if err := c.journal(func() error {
		c.d.emit(event.SideEffectClaimed, p.StepID, p.Attempt, event.SideEffectClaimedData{
			IdempotencyKey: p.Key, Connector: in.Kind, Target: target})
		return c.d.flush()
	}); err != nil {
		return stepResult{}, &abortError{err: err}
	}
	// The delivery is claimed: let it finish even if the drive is being
	// stopped, so the receiver is not left with a cut request.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), timeoutOf(p.TimeoutMs, defaultConnectorTimeout))
	defer cancel()
	rec, err := conn.Deliver(ctx, connector.Delivery{RunID: c.d.runID, StepID: p.StepID, IdempotencyKey: p.Key,
		URL: url, Method: in.Method, Headers: headers, Body: in.Body, Email: in.Email})
	if err != nil {
		return stepResult{}, redact.Error(err, sec.used...)
	}
	res, err := deliveryResult(event.DeliveryDelivered, rec.Status)
	res.delivered = &event.SideEffectDeliveredData{IdempotencyKey: p.Key, Status: rec.Status}
	return res, err
}

// claimedDelivery settles a delivery whose claim is journaled, without a
// call: delivered when the receipt is journaled too, else unconfirmed (its
// outcome is unknown, and it is not sent again).
func (d *drive) claimedDelivery(p engine.StepPlan) (stepResult, error) {
	if p.Delivered {
		return deliveryResult(event.DeliveryDelivered, d.st.Steps[p.StepID].DeliveryStatus)
	}
	d.log.Warn("delivery was claimed by an interrupted drive and never confirmed; not sending again",
		"step_id", p.StepID, "attempt", p.Attempt, "idempotency_key", p.Key)
	return deliveryResult(event.DeliveryUnconfirmed, 0)
}

func deliveryResult(delivery string, status int) (stepResult, error) {
	b, err := json.Marshal(engine.ConnectorOutput{Delivery: delivery, Status: status})
	if err != nil {
		return stepResult{}, err
	}
	return stepResult{output: b, delivery: delivery}, nil
}

// maxEmailTarget bounds the recipients quoted in side_effect_claimed.
const maxEmailTarget = 256

// emailTarget names an email's recipients for the claim, as a mailto: URL
// cut to maxEmailTarget bytes.
func emailTarget(m *connector.Email) string {
	t := "mailto:" + m.To
	if len(t) > maxEmailTarget {
		t = strings.ToValidUTF8(t[:maxEmailTarget], "") + "…"
	}
	return t
}
