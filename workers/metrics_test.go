package workers_test

import (
	"context"
	"encoding/json"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

var metricsURL = regexp.MustCompile(`http://127\.0\.0\.1:\d+/metrics`)

// TestMetricsOfATakeover scrapes the /metrics of a real pal worker
// (PAL_METRICS_ADDR) that took a run over from a worker killed with
// kill -9 in the middle of step s3, finished it, and then refused a
// durable cancel of the finished run. Every value counts only what that
// process did; the run's start is counted by w1, which drove it first.
func TestMetricsOfATakeover(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	runID := event.NewRunID()
	hold := p.LLM.Hold(providertest.ByKey(key(runID, "s3", 1)))
	w1 := p.palWorker(t, "w1", "PAL_METRICS_ADDR=127.0.0.1:0")
	_, err := runs.New(p.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights,
		RunID: runID, Workflow: json.RawMessage(seqWorkflow(4, "openai")), Input: json.RawMessage(`{"topic":"metrics"}`)})
	require.NoError(t, err)
	_, err = hold.Wait(ctxFor(t, 30*time.Second))
	require.NoError(t, err, w1.Output())
	// w1 drove the run first: it counts its start, though this test
	// process, not w1, created it.
	w1URL := metricsURL.FindString(w1.Output())
	require.NotEmpty(t, w1URL, "w1 logged no metrics address:\n%s", w1.Output())
	started, _ := testenv.Scrape(t, w1URL, nil).Value("pal_runs_started_total")
	require.Equal(t, 1.0, started, "the worker that first drives a run counts its start")
	w1.Kill()
	w2 := p.palWorker(t, "w2", "PAL_METRICS_ADDR=127.0.0.1:0")
	url := metricsURL.FindString(w2.Output())
	require.NotEmpty(t, url, "w2 logged no metrics address:\n%s", w2.Output())
	hold.Release()
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)

	// A durable cancel of the finished run: w2's command processor
	// refuses it, and says so on pal.cmd.rejected.
	rejected, err := p.NC.SubscribeSync(eventstore.RejectedSubject)
	require.NoError(t, err)
	_, err = p.Store.JetStream().Publish(ctxFor(t, 10*time.Second), eventstore.CommandPrefix+runs.CmdCancel,
		[]byte(`{"run_id":"`+runID+`"}`))
	require.NoError(t, err)
	_, err = rejected.NextMsg(30 * time.Second)
	require.NoError(t, err)

	// The drive is counted once it has settled its work, just after the
	// run's end is journaled.
	var m testenv.Metrics
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		m = testenv.Scrape(t, url, nil)
		v, _ := m.Value("pal_drives_total", "outcome=done")
		assert.Equal(c, 1.0, v)
	}, 30*time.Second, 20*time.Millisecond)

	val := func(name string, labels ...string) float64 {
		t.Helper()
		v, ok := m.Value(name, labels...)
		require.True(t, ok, "no series %s%v", name, labels)
		return v
	}
	require.Equal(t, 1.0, val("pal_runs_finished_total", "status=succeeded"))
	require.Equal(t, 0.0, val("pal_runs_started_total"), "w1, not w2, drove the run first")
	require.Equal(t, 1.0, val("pal_lease_takeovers_total"))
	require.Equal(t, 1.0, val("pal_resume_after_interruption_seconds"))
	gap, _ := m.Sum("pal_resume_after_interruption_seconds")
	require.Greater(t, gap, 0.0)
	require.Less(t, gap, 60.0)
	require.Equal(t, 1.0, val("pal_drive_duration_seconds", "outcome=done"))
	// w2 ran s3 (again) and s4; w1 ran the trigger, s1 and s2.
	require.Equal(t, 2.0, val("pal_steps_total", "node_type=ai-step", "outcome=completed"))
	require.Equal(t, 2.0, val("pal_step_duration_seconds", "node_type=ai-step", "outcome=completed"))
	_, ok := m.Value("pal_steps_total", "node_type=trigger", "outcome=completed")
	require.False(t, ok, "w2 ran no trigger step")
	require.Equal(t, 2.0, val("pal_provider_calls_total", "provider=openai", "model=gpt-4o-mini", "result=ok"))
	require.Equal(t, 2.0, val("pal_provider_call_duration_seconds", "provider=openai", "model=gpt-4o-mini"))

	var in, out, cost float64
	for _, s := range []string{"s3", "s4"} {
		u := data[event.StepCompletedData](t, find(p.Events(t, runID), event.StepCompleted, s)[0]).Usage
		require.NotNil(t, u)
		in, out, cost = in+float64(u.InputTokens), out+float64(u.OutputTokens), cost+u.CostUSD
	}
	require.Positive(t, in)
	require.Equal(t, in, val("pal_provider_tokens_total", "provider=openai", "model=gpt-4o-mini", "direction=input"))
	require.Equal(t, out, val("pal_provider_tokens_total", "provider=openai", "model=gpt-4o-mini", "direction=output"))
	require.InDelta(t, cost, val("pal_provider_cost_usd_total", "provider=openai", "model=gpt-4o-mini"), 1e-12)
	require.Positive(t, cost)

	require.Equal(t, 1.0, val("pal_commands_refused_total", "command=cancel", "reason=run_finished"))
	// run_resumed; s3 completed with s4 started; s4 completed with
	// run_succeeded (a drive appends what it emitted at each barrier).
	require.GreaterOrEqual(t, val("pal_append_duration_seconds", "result=ok"), 3.0)
	for _, c := range [][2]string{{eventstore.WorkStream, eventstore.WorkConsumer},
		{eventstore.TimersStream, eventstore.TimerConsumer}, {eventstore.CommandsStream, eventstore.CommandConsumer}} {
		require.Equal(t, 0.0, val("pal_consumer_info_errors", "stream="+c[0], "consumer="+c[1]), c)
		val("pal_consumer_pending_messages", "stream="+c[0], "consumer="+c[1])
		val("pal_consumer_ack_pending_messages", "stream="+c[0], "consumer="+c[1])
	}
}
