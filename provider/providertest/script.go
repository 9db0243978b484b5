package providertest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/workflow"
)

// A request may carry a workflow node's fake block (workflow.Fake, the
// X-Pal-Fake header, sent by a worker with PAL_DEV_FAKE=1), the step it
// belongs to (X-Pal-Fake-Step) and its turn (X-Pal-Fake-Turn). The server
// then answers from it:
//
//   - fail: the first fail.times requests of the step are answered with
//     fail.status and the provider's error body (counted per step, whatever
//     their idempotency keys: a retry of the step counts too);
//   - turns: turn i answers the request whose X-Pal-Fake-Turn is i (the
//     worker sends an agent turn's index, 0 for an ai-step), or, without
//     that header, whose conversation holds i assistant messages; with its
//     tool calls and its text (json as compact text);
//   - past the last turn, or with no turns, the responder answers (in pal
//     dev ToolUser), as for a request without a block.
//
// Holds, FailNext, RateLimit and Drop rules come first: a request they
// fail or drop is not counted among its step's.

// maxFakeSteps bounds the steps whose requests the server counts for
// fail: the oldest is forgotten first.
const maxFakeSteps = 4096

// fakeOf reads the request's fake block; nil when it has none.
func fakeOf(h http.Header) (*workflow.Fake, error) {
	raw := h.Get(provider.FakeHeader)
	if raw == "" {
		return nil, nil
	}
	if len(raw) > workflow.MaxFakeBytes {
		return nil, fmt.Errorf("%s: %d bytes, over %d", provider.FakeHeader, len(raw), workflow.MaxFakeBytes)
	}
	var f workflow.Fake
	if err := json.Unmarshal([]byte(raw), &f); err != nil {
		return nil, fmt.Errorf("%s: not a fake block: %v", provider.FakeHeader, err)
	}
	if len(f.Turns) > workflow.MaxFakeTurns {
		return nil, fmt.Errorf("%s: %d turns, over %d", provider.FakeHeader, len(f.Turns), workflow.MaxFakeTurns)
	}
	if t := h.Get(provider.FakeTurnHeader); t != "" {
		if n, err := strconv.Atoi(t); err != nil || n < 0 || n > maxFakeTurnIndex {
			return nil, fmt.Errorf("%s: %q is not a turn index (0 to %d)", provider.FakeTurnHeader, t, maxFakeTurnIndex)
		}
	}
	return &f, nil
}

// maxFakeTurnIndex bounds X-Pal-Fake-Turn: an agent's most turns.
const maxFakeTurnIndex = 1000

// fakeTurn is the turn of the block that answers c: X-Pal-Fake-Turn
// (checked by fakeOf), else the assistant messages its conversation holds.
func fakeTurn(c Call) int {
	if n, err := strconv.Atoi(c.Header.Get(provider.FakeTurnHeader)); err == nil {
		return n
	}
	turn := 0
	for _, m := range c.Messages {
		if m.Role == provider.RoleAssistant {
			turn++
		}
	}
	return turn
}

// fakeStep is what the block's failures are counted under: the
// X-Pal-Fake-Step header, else the idempotency key.
func fakeStep(c Call) string {
	if s := c.Header.Get(provider.FakeStepHeader); s != "" {
		return s
	}
	return c.IdempotencyKey
}

// takeScriptedFailure counts c among its step's requests and returns the
// status it must fail with, 0 for none. s.mu is held.
func (s *Server) takeScriptedFailure(c Call) int {
	if c.Fake == nil || c.Fake.Fail == nil {
		return 0
	}
	step := fakeStep(c)
	n, _ := s.fakeSteps.Get(step)
	s.fakeSteps.Add(step, n+1)
	if n < c.Fake.Fail.Times {
		return c.Fake.Fail.Status
	}
	return 0
}

// scripted returns the block's turn for c, false past the script's end.
func scripted(c Call) (Reply, bool) {
	if c.Fake == nil {
		return Reply{}, false
	}
	turn := fakeTurn(c)
	if turn >= len(c.Fake.Turns) {
		return Reply{}, false
	}
	t := c.Fake.Turns[turn]
	r := Reply{Text: t.AnswerText()}
	for j, tc := range t.ToolCalls {
		args := tc.Arguments
		if len(args) == 0 {
			args = json.RawMessage("{}")
		}
		r.ToolCalls = append(r.ToolCalls, provider.ToolCall{ID: fmt.Sprintf("call_%d_%d", len(c.Messages), j), Name: tc.Name, Arguments: args})
	}
	return r, true
}
