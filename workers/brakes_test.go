package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workflow"
)

// withPolicy adds a policy to the workflow wf.
func withPolicy(t *testing.T, wf, policy string) string {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(wf), &m))
	m["policy"] = json.RawMessage(policy)
	b, err := json.Marshal(m)
	require.NoError(t, err)
	return string(b)
}

// pricedChain is n ai-steps on gpt-4o-mini (priced) with maxTokens 1000:
// each call's worst case is about $0.0006.
func pricedChain(n int) string {
	return paltest.Chain(fmt.Sprintf("priced-%d", n), n, func(i int, prev string) (string, string) {
		id := fmt.Sprintf("s%d", i)
		return id, fmt.Sprintf(`{"id":%q,"type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","maxTokens":1000,"prompt":"step %d"}}`, id, i)
	})
}

// stepCost is what every scripted call costs: 100 tokens in, 900 out at
// gpt-4o-mini's price.
var stepCost = provider.Cost("gpt-4o-mini", provider.Usage{InputTokens: 100, OutputTokens: 900})

func fixedUsage(llm *providertest.Server) {
	llm.SetResponder(func(providertest.Call) providertest.Reply {
		return providertest.Reply{Text: "ok", InputTokens: 100, OutputTokens: 900}
	})
}

// projected starts a projector process into a fresh Postgres and returns
// the pool to read it.
func (p *procBundle) projected(t *testing.T, ctx context.Context) *pgxpool.Pool {
	t.Helper()
	pg := testenv.Postgres(t)
	proc := testenv.StartProcess(t, p.bin, []string{"projector"}, []string{"PAL_NATS_URL=" + p.natsURL, "DATABASE_URL=" + pg.DSN()})
	require.NoError(t, proc.WaitForOutput(ctx, "projector ready"), proc.Output())
	return pg.Pool(t)
}

// spendInPG waits until the runs table shows the run ended and returns
// its cost.
func spendInPG(t *testing.T, ctx context.Context, pool *pgxpool.Pool, runID string) float64 {
	t.Helper()
	var cost float64
	require.Eventually(t, func() bool {
		var status string
		err := pool.QueryRow(ctx, "SELECT status, cost_usd FROM runs WHERE run_id = $1", runID).Scan(&status, &cost)
		return err == nil && (status == "failed" || status == "succeeded")
	}, time.Minute, 20*time.Millisecond)
	return cost
}

func sumUsage(t *testing.T, evs []event.Event) (float64, int) {
	var cost float64
	n := 0
	for _, ev := range evs {
		switch ev.Kind {
		case event.StepCompleted:
			d := data[event.StepCompletedData](t, ev)
			if d.Usage != nil {
				cost += d.Usage.CostUSD
				n++
			}
		case event.StepFailed:
			if d := data[event.StepFailedData](t, ev); d.Usage != nil {
				cost += d.Usage.CostUSD
			}
		}
	}
	return cost, n
}

func TestRunawayAgentHaltedAtThreshold(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	// The model asks for the same lookup, with the same arguments, every turn.
	p.LLM.SetResponder(func(providertest.Call) providertest.Reply {
		return providertest.Reply{ToolCalls: []provider.ToolCall{{ID: "c1", Name: "echo", Arguments: json.RawMessage(`{"q":"same"}`)}}}
	})
	wf := `{"name":"loopy","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"agent","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"find it",
		 "tools":[{"name":"echo","description":"echo"}],"maxTurns":20}}],
		"edges":[{"from":"start","to":"ask"}],
		"policy":{"anomalies":{"runaway_loop":{"threshold":3,"action":"halt"}}}}`
	p.palWorker(t, "w1")
	runID := p.Start(t, wf, `{}`)
	end := p.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	f := data[event.RunFailedData](t, end)
	require.Equal(t, event.CodeAnomaly, f.Code)
	require.Contains(t, f.Error, "runaway_loop")
	evs := p.Events(t, runID)
	anomalies := find(evs, event.AnomalyDetected, "")
	require.Len(t, anomalies, 1)
	a := data[event.AnomalyDetectedData](t, anomalies[0])
	require.Equal(t, event.AnomalyDetectedData{Type: event.AnomalyRunawayLoop, Observed: 3, Threshold: 3, Action: event.ActionHalt,
		StepID: "ask.turn[2]", Detail: a.Detail}, a)
	require.Len(t, p.LLM.Calls(), 3, "the model was called exactly the threshold number of times")
	require.Len(t, find(evs, event.StepStarted, "ask.turn[2].tool[0]"), 0, "the third identical call never ran")
}

func TestBudgetStopsBeforeTheCallThatWouldExceedIt(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	ctx := ctxFor(t, 2*time.Minute)
	pool := p.projected(t, ctx)
	fixedUsage(p.LLM)
	const max = 0.003
	wf := withPolicy(t, pricedChain(10), fmt.Sprintf(`{"budget":{"maxCostUsd":%v,"warnAt":0.7}}`, max))
	p.palWorker(t, "w1")
	runID := p.Start(t, wf, `{}`)
	end := p.WaitEnd(t, runID)
	f := data[event.RunFailedData](t, end)
	require.Equal(t, event.CodeBudgetExceeded, f.Code, f.Error)
	evs := p.Events(t, runID)
	x := data[event.BudgetExceededData](t, find(evs, event.BudgetExceeded, "")[0])
	spent, completed := sumUsage(t, evs)
	// Five calls fit: 4 × $0.000555 spent + a worst case of about
	// $0.0006 is under $0.003; a sixth would not be.
	require.Len(t, p.LLM.Calls(), 5)
	require.Equal(t, 5, completed)
	require.Equal(t, "s6", x.StepID)
	require.Equal(t, event.LimitCost, x.Limit)
	require.InDelta(t, spent, x.Spent, 1e-12)
	require.Greater(t, x.Spent+x.Need, max, "the sixth call could have passed the budget")
	require.Contains(t, f.Error, "max_cost_usd")
	require.Contains(t, f.Error, "s6")
	pgCost := spendInPG(t, ctx, pool, runID)
	require.InDelta(t, 5*stepCost, pgCost, 1e-12)
	require.LessOrEqual(t, pgCost, max)
	var limit float64
	var steps int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT (budget->>'max_cost_usd')::float8, steps_spent FROM runs WHERE run_id = $1", runID).Scan(&limit, &steps))
	require.Equal(t, max, limit)
	require.Equal(t, int64(5), steps)
	warned := find(evs, event.BudgetWarning, "")
	require.Len(t, warned, 1, "warned once, at 70%")
	require.Equal(t, event.BudgetWarningData{Limit: event.LimitCost, Spent: 4 * stepCost, Max: max, StepID: "s5"},
		data[event.BudgetWarningData](t, warned[0]))
}

func TestChildSpendCountsInTheParentsBudget(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	ctx := ctxFor(t, 2*time.Minute)
	pool := p.projected(t, ctx)
	fixedUsage(p.LLM)
	child := pricedChain(2)
	// The child spends 2 × $0.000555; then the parent's own step (worst
	// case about $0.0006) no longer fits in $0.0015.
	wf := fmt.Sprintf(`{"name":"parent","nodes":[{"id":"start","type":"trigger"},
		{"id":"kid","type":"subagent","data":{"input":{},"workflow":%s}},
		{"id":"after","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","maxTokens":1000,"prompt":"after"}}],
		"edges":[{"from":"start","to":"kid"},{"from":"kid","to":"after"}],
		"policy":{"budget":{"maxCostUsd":0.0015}}}`, child)
	p.palWorker(t, "w1")
	runID := p.Start(t, wf, `{}`)
	end := p.WaitEnd(t, runID)
	f := data[event.RunFailedData](t, end)
	require.Equal(t, event.CodeBudgetExceeded, f.Code, f.Error)
	require.Equal(t, "after", f.StepID)
	evs := p.Events(t, runID)
	kid := data[event.StepCompletedData](t, find(evs, event.StepCompleted, "kid")[0])
	require.NotNil(t, kid.Usage)
	require.InDelta(t, 2*stepCost, kid.Usage.CostUSD, 1e-12, "the subagent step carries the child's spend")
	x := data[event.BudgetExceededData](t, find(evs, event.BudgetExceeded, "")[0])
	require.InDelta(t, 2*stepCost, x.Spent, 1e-12)
	require.Len(t, p.LLM.Calls(), 2, "the parent's own call was never sent")

	childID := event.ChildRunID(runID, "kid")
	cevs := p.Events(t, childID)
	created := data[event.RunCreatedData](t, cevs[0])
	require.NotNil(t, created.Budget)
	require.InDelta(t, 0.0015, created.Budget.MaxCostUSD, 1e-12, "the child draws on the parent's remaining budget")
	require.InDelta(t, 2*stepCost, spendInPG(t, ctx, pool, runID), 1e-12)
}

func TestKill9DuringABudgetedRunNeitherDoubleCountsNorBypasses(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	ctx := ctxFor(t, 2*time.Minute)
	pool := p.projected(t, ctx)
	fixedUsage(p.LLM)
	p.LLM.Dedup(true) // the provider answers a repeated key once, as with idempotency keys
	const max = 0.003
	wf := withPolicy(t, pricedChain(10), fmt.Sprintf(`{"budget":{"maxCostUsd":%v}}`, max))
	runID := event.NewRunID()
	hold := p.LLM.Hold(providertest.ByKey(key(runID, "s3", 1)))
	w1 := p.palWorker(t, "w1")
	_, err := runs.New(p.Store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: runID, Workflow: json.RawMessage(wf)})
	require.NoError(t, err)
	_, err = hold.Wait(ctx)
	require.NoError(t, err)
	w1.Kill() // kill -9 with s3's call in flight, its usage not journaled
	p.palWorker(t, "w2")
	hold.Release()
	end := p.WaitEnd(t, runID)
	require.Equal(t, event.CodeBudgetExceeded, data[event.RunFailedData](t, end).Code)
	evs := p.Events(t, runID)
	spent, completed := sumUsage(t, evs)
	st, err := engine.Fold(evs)
	require.NoError(t, err)
	require.InDelta(t, spent, st.Spent().CostUSD, 1e-12, "spend is the sum of the completed steps")
	require.Equal(t, 5, completed, "the limit holds across the crash")
	require.InDelta(t, 5*stepCost, spent, 1e-12, "s3 counted once")
	keys := p.LLM.Keys()
	require.Len(t, keys, 5, "five distinct calls")
	require.GreaterOrEqual(t, keys[key(runID, "s3", 1)], 1)
	require.LessOrEqual(t, spendInPG(t, ctx, pool, runID), max)
	require.Len(t, resumesOf(t, evs), 2)
}

func TestBudgetPauseThenRaiseResumes(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	ctx := ctxFor(t, 2*time.Minute)
	fixedUsage(p.LLM)
	// Two calls fit in $0.0012, the third does not: the run waits.
	wf := withPolicy(t, pricedChain(3), `{"budget":{"maxCostUsd":0.0012,"onExceed":"pause"}}`)
	p.palWorker(t, "w1")
	runID := p.Start(t, wf, `{}`)
	p.WaitFor(t, runID, "a budget wait", func(ev event.Event) bool {
		return ev.Kind == event.StepWaiting && data[event.StepWaitingData](t, ev).Reason == event.WaitBudget
	})
	var v *runs.RunView
	require.Eventually(t, func() bool {
		var err error
		v, err = p.Runs.Get(ctx, runID)
		return err == nil && v.Status == engine.StatusWaiting
	}, time.Minute, 20*time.Millisecond)
	require.Equal(t, event.WaitBudget, v.PausedOn)
	require.Equal(t, 0.0012, v.Budget.MaxCostUSD)
	require.InDelta(t, 2*stepCost, v.Spent.CostUSD, 1e-12)
	require.Len(t, p.LLM.Calls(), 2)

	// Widening at start is refused; raising a running run is how to widen.
	_, err := p.Runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(wf), Budget: &workflow.Budget{MaxCostUSD: 5}})
	var ie *runs.InputError
	require.ErrorAs(t, err, &ie)
	require.Contains(t, err.Error(), "widens")

	env := []string{"PAL_NATS_URL=" + p.natsURL}
	get := testenv.StartProcess(t, p.bin, []string{"run", "get", runID, "--journal"}, env)
	require.NoError(t, get.Wait(ctx), get.Output())
	require.Contains(t, get.Output(), fmt.Sprintf("$%.4f of $0.0012 (on exceed: pause; paused on budget)", 2*stepCost))
	wfFile := filepath.Join(t.TempDir(), "wf.json")
	require.NoError(t, os.WriteFile(wfFile, []byte(wf), 0o600))
	wide := testenv.StartProcess(t, p.bin, []string{"run", "start", "--workflow", wfFile, "--budget", `{"maxCostUsd":5}`}, env)
	require.Error(t, wide.Wait(ctx))
	require.Contains(t, wide.Output(), "budget.maxCostUsd: 5 widens the workflow's limit of 0.0012")

	out := testenv.StartProcess(t, p.bin, []string{"run", "budget", runID, "--add-usd", "2", "--by", "ana"}, env)
	require.NoError(t, out.Wait(ctx), out.Output())
	require.Contains(t, out.Output(), "raised the budget of run "+runID)
	end := p.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind)
	evs := p.Events(t, runID)
	raised := find(evs, event.BudgetRaised, "")
	require.Len(t, raised, 1)
	require.Equal(t, event.BudgetRaisedData{AddUSD: 2, By: "ana"}, data[event.BudgetRaisedData](t, raised[0]))
	require.Len(t, p.LLM.Calls(), 3)
	st, err := engine.Fold(evs)
	require.NoError(t, err)
	require.Less(t, math.Abs(st.Budget.MaxCostUSD-2.0012), 1e-12)
}
