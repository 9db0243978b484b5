package engine_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/schemas"
)

// A scenario is one saved history: the events and how they were packed
// into messages (nil: one event per message).
type scenario struct {
	name  string
	build func(t testing.TB) []event.Event
	pack  []int
}

// Run ids of the scenarios: run_ and a ULID, as NewRunID makes them.
const (
	runSucceeded    = "run_01JNB6W2G8Z4K0S1C5V7X9D3A0"
	runCrashed      = "run_01JNB6W2G8Z4K0S1C5V7X9D3A1"
	runRetrySame    = "run_01JNB6W2G8Z4K0S1C5V7X9D3A2"
	runRetryNext    = "run_01JNB6W2G8Z4K0S1C5V7X9D3A3"
	runFailed       = "run_01JNB6W2G8Z4K0S1C5V7X9D3A4"
	runCancelled    = "run_01JNB6W2G8Z4K0S1C5V7X9D3A5"
	runClaimed      = "run_01JNB6W2G8Z4K0S1C5V7X9D3A6"
	runDelivered    = "run_01JNB6W2G8Z4K0S1C5V7X9D3A7"
	runUnconfirmed  = "run_01JNB6W2G8Z4K0S1C5V7X9D3A8"
	runDeadBranch   = "run_01JNB6W2G8Z4K0S1C5V7X9D3A9"
	runCondition    = "run_01JNB6W2G8Z4K0S1C5V7X9D3AA"
	runInvalid      = "run_01JNB6W2G8Z4K0S1C5V7X9D3AB"
	runCrashLoop    = "run_01JNB6W2G8Z4K0S1C5V7X9D3AC"
	runCrashFinish  = "run_01JNB6W2G8Z4K0S1C5V7X9D3AD"
	runWebhookFinal = "run_01JNB6W2G8Z4K0S1C5V7X9D3AE"
	runApprovalWait = "run_01JNB6W2G8Z4K0S1C5V7X9D3AF"
	runApprovalFail = "run_01JNB6W2G8Z4K0S1C5V7X9D3AG"
	runApprovalLate = "run_01JNB6W2G8Z4K0S1C5V7X9D3AH"
	runSignalEarly  = "run_01JNB6W2G8Z4K0S1C5V7X9D3AJ"
	runSignalWait   = "run_01JNB6W2G8Z4K0S1C5V7X9D3AK"
	runSignalLate   = "run_01JNB6W2G8Z4K0S1C5V7X9D3AM"
	runSignalRouted = "run_01JNB6W2G8Z4K0S1C5V7X9D3AN"
	runForked       = "run_01JNB6W2G8Z4K0S1C5V7X9D3AP"
)

func scenarios() []scenario {
	return append([]scenario{
		{name: "succeeded_three_steps", build: buildSucceeded},
		// The same journal, packed as strict durability mode may write it:
		// each step_completed with the next step_started.
		{name: "packed_three_steps", build: buildSucceeded, pack: []int{1, 2, 2, 2, 2}},
		{name: "crashed_mid_step", build: buildCrashedMidStep},
		{name: "crashed_then_finished", build: buildCrashedThenFinished},
		{name: "crash_loop", build: buildCrashLoop},
		{name: "retry_same_attempt", build: buildRetrySameAttempt},
		{name: "retry_next_attempt", build: buildRetryNextAttempt},
		{name: "failed_retries_exhausted", build: buildFailed},
		{name: "cancelled", build: buildCancelled},
		{name: "webhook_claimed", build: buildWebhookClaimed},
		{name: "webhook_delivered", build: buildWebhookDelivered},
		{name: "webhook_unconfirmed_finished", build: buildWebhookUnconfirmed},
		{name: "webhook_finished", build: buildWebhookFinished},
		{name: "conditional_dead_branch", build: buildDeadBranch},
		{name: "condition_node", build: buildConditionNode},
		{name: "invalid_workflow", build: buildInvalidWorkflow},
		// Approval deadlines, decided by Next at the clock it is given.
		{name: "approval_waiting", build: buildApprovalWaiting},
		{name: "approval_timeout_failed", build: buildApprovalTimeoutFailed},
		{name: "approval_timeout_routed", build: buildApprovalTimeoutRouted},
		// Signals: kept first in first out per name, each taken once.
		{name: "signal_sent_early", build: buildSignalSentEarly},
		{name: "signal_waiting", build: buildSignalWaiting},
		{name: "signal_after_wait", build: buildSignalAfterWait},
		{name: "signal_timeout_routed", build: buildSignalTimeoutRouted},
		// A fork of runSucceeded from review: draft is copied, not run.
		{name: "forked_from_review", build: buildForkedFromReview},
	}, append(brakeScenarios(), frontierScenarios()...)...)
}

// summariseRun is the first part of every wfSummarise run: the draft.
func summariseRun(t testing.TB, runID string) *history {
	h := newHistory(t, runID, wfSummarise, inputSummarise).wait(40 * time.Millisecond).resume("worker-a")
	return h.llm("draft", "PAL journals each agent step to JetStream so crashes lose nothing.", "gpt-4o-mini-2024-07-18", 58, 14)
}

func buildSucceeded(t testing.TB) []event.Event {
	h := summariseRun(t, runSucceeded)
	h.llm("review", "Accurate and complete.", "claude-sonnet-4-5-20250929", 41, 6)
	h.llm("publish", "Agent runs that survive crashes", "gpt-4o-mini-2024-07-18", 37, 7)
	return h.finish().events()
}

func buildCrashedMidStep(t testing.TB) []event.Event {
	h := summariseRun(t, runCrashed).start("review")
	// worker-a is killed while review's call is in flight; worker-b takes
	// over after the lease expires.
	return h.wait(12 * time.Second).resume("worker-b").events()
}

func buildCrashedThenFinished(t testing.TB) []event.Event {
	h := summariseRun(t, runCrashFinish).start("review")
	h.wait(12 * time.Second).resume("worker-b")
	h.wait(12 * time.Second).resume("worker-c")
	// worker-c resumes the started attempt (same key) and completes it.
	h.complete("review", `{"text":"Accurate and complete.","model":"claude-sonnet-4-5-20250929","finish_reason":"stop","id":"resp_review"}`,
		&event.Usage{InputTokens: 41, OutputTokens: 6, TotalTokens: 47, CostUSD: 0.000213})
	h.llm("publish", "Agent runs that survive crashes", "gpt-4o-mini-2024-07-18", 37, 7)
	return h.finish().events()
}

func buildCrashLoop(t testing.TB) []event.Event {
	h := summariseRun(t, runCrashLoop).start("review")
	for _, w := range []string{"worker-b", "worker-c", "worker-d", "worker-e", "worker-f"} {
		h.wait(12 * time.Second).resume(w)
	}
	// The fifth crashed drive gives up, in the same append as its
	// run_resumed.
	h.append(event.RunFailed, "", 0, event.RunFailedData{Code: event.CodeCrashLoop, StepID: "review",
		Error: `run crashed its workers 5 times in a row without completing a step (at step "review"); giving up`})
	return h.events()
}

func buildRetrySameAttempt(t testing.TB) []event.Event {
	h := newHistory(t, runRetrySame, wfSummarise, inputSummarise).resume("worker-a").start("draft")
	// The call timed out after it was sent: its outcome is unknown, so the
	// retry keeps the attempt and the idempotency key.
	retried := h.failTry("draft", "openai: POST /v1/chat/completions: context deadline exceeded", event.ClassTimeout, true, true, 500*time.Millisecond)
	require.True(t, retried)
	return h.events()
}

func buildRetryNextAttempt(t testing.TB) []event.Event {
	h := newHistory(t, runRetryNext, wfSummarise, inputSummarise).resume("worker-a").start("draft")
	require.True(t, h.failTry("draft", "openai: POST /v1/chat/completions: context deadline exceeded", event.ClassTimeout, true, true, 500*time.Millisecond))
	h.start("draft") // attempt 1 again, same key
	// A definite failure: the provider answered 503. The next try is a new
	// attempt with a new key.
	require.True(t, h.failTry("draft", "openai: 503 Service Unavailable", event.ClassLLM, true, false, 1100*time.Millisecond))
	return h.events()
}

func buildFailed(t testing.TB) []event.Event {
	h := newHistory(t, runFailed, wfSummarise, inputSummarise).resume("worker-a")
	for try := 1; try <= 3; try++ {
		h.start("draft")
		retried := h.failTry("draft", "openai: 500 Internal Server Error", event.ClassLLM, true, false, time.Duration(try)*500*time.Millisecond)
		require.Equal(t, try < 3, retried, "try %d", try)
	}
	return h.finish().events()
}

func buildCancelled(t testing.TB) []event.Event {
	h := summariseRun(t, runCancelled).start("review")
	h.worker = "api"
	h.append(event.RunCancelled, "", 0, event.RunCancelledData{Reason: "no longer needed", By: "user:ada"})
	return h.events()
}

// notifyRun drafts and reviews, then starts the webhook.
func notifyRun(t testing.TB, runID string) *history {
	h := newHistory(t, runID, wfNotify, inputNotify).resume("worker-a")
	h.llm("draft", "Revenue grew 12% this quarter.", "gpt-4o-mini-2024-07-18", 30, 9)
	h.llm("review", "Correct.", "claude-sonnet-4-5-20250929", 25, 3)
	return h.start("notify")
}

func buildWebhookClaimed(t testing.TB) []event.Event {
	// Crash after the claim: the request may or may not have been sent.
	return notifyRun(t, runClaimed).claim("notify").wait(12 * time.Second).resume("worker-b").events()
}

func buildWebhookDelivered(t testing.TB) []event.Event {
	// Crash after the receiver acknowledged, before step_completed.
	h := notifyRun(t, runDelivered).claim("notify").deliver("notify", 202)
	return h.wait(12 * time.Second).resume("worker-b").events()
}

func buildWebhookUnconfirmed(t testing.TB) []event.Event {
	h := notifyRun(t, runUnconfirmed).claim("notify").wait(12 * time.Second).resume("worker-b")
	// worker-b does not send again: it records the delivery as unconfirmed.
	return h.deliveryDone("notify").finish().events()
}

func buildWebhookFinished(t testing.TB) []event.Event {
	h := notifyRun(t, runWebhookFinal).claim("notify").deliver("notify", 200)
	return h.deliveryDone("notify").finish().events()
}

func buildDeadBranch(t testing.TB) []event.Event {
	h := newHistory(t, runDeadBranch, wfTriage, inputTriage).resume("worker-a")
	h.llm("classify", "routine", "gpt-4o-mini-2024-07-18", 22, 1)
	// escalate's edge does not fire: it is dead, and log still runs
	// after reply.
	h.llm("reply", "Go to Billing, then Export.", "gpt-4o-mini-2024-07-18", 20, 8)
	h.start("log").complete("log", `{"logged":true,"entry":"audit-0091"}`, nil)
	return h.finish().events()
}

func buildConditionNode(t testing.TB) []event.Event {
	h := newHistory(t, runCondition, wfGate, inputGate).resume("worker-a")
	h.start("sentiment").complete("sentiment", `{"score":0.92,"label":"positive"}`, nil)
	h.pure("check")
	h.start("publish").claim("publish").deliver("publish", 200).deliveryDone("publish")
	return h.finish().events()
}

func buildInvalidWorkflow(t testing.TB) []event.Event {
	var raw bytes.Buffer
	require.NoError(t, json.Compact(&raw, []byte(wfInvalid)))
	h := newHistoryRaw(t, runInvalid, raw.Bytes(), "needs-approval", `{}`).resume("worker-a")
	return h.finish().events()
}

// releaseWait starts a release run and parks it on its approval, which
// times out an hour after it was planned.
func releaseWait(t testing.TB, runID, wf string) *history {
	h := newHistory(t, runID, wf, inputRelease).resume("worker-a").waitFor("ok")
	require.Equal(t, engine.StatusWaiting, h.st.Status)
	return h
}

// timeOut is a drive after the deadline: the worker's clock has passed
// it, so Next completes the approval as timed out.
func (h *history) timeOut(worker, stepID string) *history {
	h.t.Helper()
	// Before the deadline Next still says wait.
	h.now = h.st.Steps[stepID].TimeoutAt.Add(-time.Millisecond)
	require.True(h.t, h.plan(stepID).Wait.Waiting)
	h.now = h.st.Steps[stepID].TimeoutAt.Add(2 * time.Second) // the durable timer's slack
	return h.resume(worker).pure(stepID)
}

func buildApprovalWaiting(t testing.TB) []event.Event {
	return releaseWait(t, runApprovalWait, wfRelease).events()
}

func buildApprovalTimeoutFailed(t testing.TB) []event.Event {
	h := releaseWait(t, runApprovalFail, wfRelease).timeOut("worker-b", "ok")
	return h.finish().events() // nothing routes on it: the run fails
}

func buildApprovalTimeoutRouted(t testing.TB) []event.Event {
	h := releaseWait(t, runApprovalLate, wfReleaseRouted).timeOut("worker-b", "ok")
	h.start("page").complete("page", `{"paged":"oncall-7"}`, nil)
	return h.finish().events()
}

// buildSignalSentEarly: two "go" signals arrive before the run is first
// driven; the first wait takes the older, the second the newer.
func buildSignalSentEarly(t testing.TB) []event.Event {
	h := newHistory(t, runSignalEarly, wfDeploy, `{}`)
	h.signal("go", `{"by":"ana"}`, "ana").signal("go", `{"by":"bo"}`, "bo")
	h.resume("worker-a").pure("first").pure("second")
	require.Equal(t, uint64(2), h.st.Steps["first"].SignalSeq)
	require.Equal(t, uint64(3), h.st.Steps["second"].SignalSeq)
	h.start("ship").complete("ship", `{"deployed":true}`, nil)
	return h.finish().events()
}

// buildSignalWaiting: one "go" was taken by the first wait; the second
// parks (and at its deadline Next fails the run: nothing routes on it).
func buildSignalWaiting(t testing.TB) []event.Event {
	h := newHistory(t, runSignalWait, wfDeploy, `{}`).signal("go", `{"by":"ana"}`, "ana")
	h.resume("worker-a").pure("first").waitFor("second")
	require.Equal(t, engine.StatusWaiting, h.st.Status)
	return h.events()
}

// buildSignalAfterWait: the run parked on the second wait; a signal
// wakes it.
func buildSignalAfterWait(t testing.TB) []event.Event {
	h := newHistory(t, runSignalLate, wfDeploy, `{}`).signal("go", `{"by":"ana"}`, "ana")
	h.resume("worker-a").pure("first").waitFor("second")
	h.wait(time.Minute).signal("go", `{"by":"bo"}`, "bo")
	h.resume("worker-b").pure("second")
	h.start("ship").complete("ship", `{"deployed":true}`, nil)
	return h.finish().events()
}

// buildSignalTimeoutRouted: no signal comes; at the deadline the wait
// completes as timed out and routes to page.
func buildSignalTimeoutRouted(t testing.TB) []event.Event {
	h := newHistory(t, runSignalRouted, wfDeployRouted, `{}`).resume("worker-a").waitFor("hold")
	h = h.timeOut("worker-b", "hold")
	h.start("page").complete("page", `{"paged":"oncall-7"}`, nil)
	return h.finish().events()
}

// buildForkedFromReview forks runSucceeded at review: run_created carries
// draft's output, which the first drive completes as copied_from without
// a step of its own running; review and publish run under the fork's keys.
func buildForkedFromReview(t testing.TB) []event.Event {
	src, err := engine.Fold(buildSucceeded(t))
	require.NoError(t, err)
	draft := src.Steps["draft"]
	ff := &event.ForkedFrom{RunID: runSucceeded, StepID: "review", Seq: src.Steps["review"].Attempts[0].FirstSeq,
		Copies: []event.CopiedStep{{StepID: "draft", NodeID: "draft", NodeType: "ai-step", Output: draft.Output,
			Seq: draft.CompletedSeq, NodeHash: "5a4c3d0f2e1b8a7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c"}}}
	h := newForkHistory(t, runForked, wfSummarise, inputSummarise, ff).resume("worker-a")
	p := h.plan("draft")
	require.True(t, p.Pure)
	require.NotNil(t, p.CopiedFrom)
	h.pure("draft")
	h.llm("review", "Accurate and complete.", "claude-sonnet-4-5-20250929", 41, 6)
	h.llm("publish", "Agent runs that survive crashes", "gpt-4o-mini-2024-07-18", 37, 7)
	require.Nil(t, h.st.Steps["draft"].Usage, "a copied step costs the fork nothing")
	return h.finish().events()
}

// encodeHistory writes events as message bodies, one per line.
func encodeHistory(t testing.TB, evs []event.Event, pack []int) []byte {
	t.Helper()
	if pack == nil {
		pack = slices.Repeat([]int{1}, len(evs))
	}
	var out bytes.Buffer
	i := 0
	for _, n := range pack {
		body, err := event.Encode(evs[i : i+n]...)
		require.NoError(t, err)
		out.Write(body)
		out.WriteByte('\n')
		i += n
	}
	require.Equal(t, len(evs), i, "pack sizes do not add up to the history")
	return out.Bytes()
}

// readHistory reads a saved history: each line is one message body, as
// it sits on pal.events.<run_id>, and must validate against the schema.
func readHistory(t testing.TB, path string) []event.Event {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var evs []event.Event
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for line := 1; sc.Scan(); line++ {
		body := bytes.TrimSpace(sc.Bytes())
		if len(body) == 0 {
			continue
		}
		require.NoError(t, schemas.ValidateEvent(body), "%s:%d", path, line)
		got, err := event.Decode(body)
		require.NoError(t, err, "%s:%d", path, line)
		evs = append(evs, got...)
	}
	require.NoError(t, sc.Err())
	return evs
}

func historyFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "*.jsonl"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	return files
}

// eachHistory runs fn on every saved journal, each in a parallel subtest
// named after its file.
func eachHistory(t *testing.T, fn func(t *testing.T, name string, evs []event.Event)) {
	t.Helper()
	for _, path := range historyFiles(t) {
		name := strings.TrimSuffix(filepath.Base(path), ".jsonl")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, name, readHistory(t, path))
		})
	}
}

// TestWriteHistories regenerates testdata/*.jsonl with -histories.
// Otherwise it checks that the scenarios still build the saved journals,
// so the generator and the files cannot drift apart unnoticed. It is not
// parallel: with -histories -update the files are written before the
// parallel tests read them.
func TestWriteHistories(t *testing.T) {
	for _, sc := range scenarios() {
		t.Run(sc.name, func(t *testing.T) {
			want := encodeHistory(t, sc.build(t), sc.pack)
			path := filepath.Join("testdata", sc.name+".jsonl")
			if *writeHistories {
				require.NoError(t, os.WriteFile(path, want, 0o644))
				return
			}
			got, err := os.ReadFile(path)
			require.NoError(t, err, "run go test ./engine -run TestWriteHistories -histories to write it")
			require.Equal(t, string(want), string(got),
				"scenario %s no longer builds its saved history; if the change is deliberate, rerun with -histories", sc.name)
		})
	}
}

// TestGoldenHistories folds every saved journal and compares the state
// and the next action with testdata/<name>.golden.json (-update rewrites
// them).
func TestGoldenHistories(t *testing.T) {
	t.Parallel()
	eachHistory(t, func(t *testing.T, name string, evs []event.Event) {
		got := foldSummary(t, evs)
		golden := filepath.Join("testdata", name+".golden.json")
		if *update {
			require.NoError(t, os.WriteFile(golden, got, 0o644))
			return
		}
		want, err := os.ReadFile(golden)
		require.NoError(t, err, "run go test ./engine -run TestGoldenHistories -update to write it")
		require.Equal(t, string(want), string(got))
	})
}

// TestPackingIsOnlyWire: a packed journal folds exactly like the same
// events one per message.
func TestPackingIsOnlyWire(t *testing.T) {
	t.Parallel()
	packed := readHistory(t, filepath.Join("testdata", "packed_three_steps.jsonl"))
	single := readHistory(t, filepath.Join("testdata", "succeeded_three_steps.jsonl"))
	require.Equal(t, single, packed)
	require.Equal(t, string(foldSummary(t, single)), string(foldSummary(t, packed)))

	raw, err := os.ReadFile(filepath.Join("testdata", "packed_three_steps.jsonl"))
	require.NoError(t, err)
	require.Contains(t, string(raw), "[{", "the packed history has packed messages")
}
