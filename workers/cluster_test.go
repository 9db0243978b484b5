package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

// TestClusterLeaderKills runs PAL on a 3-node JetStream cluster with
// PAL_REPLICAS=3 and two pal worker processes, and kill -9s, mid-run, the
// leader of PAL_EVENTS, then of PAL_WORK, then of the PAL_LEASES bucket
// (restarting each before the next kill). Each time every run finishes
// exactly once, every event an ordered consumer had received before the
// kill (so the cluster had acknowledged it) is still there unchanged, and
// the journal verifies: the chain and the drive's writer rule hold across
// the leader change. It logs how long each run waited for its next event.
func TestClusterLeaderKills(t *testing.T) {
	t.Parallel()
	c := testenv.NATSClusterProcesses(t, 3)
	nc := c.Conn(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := ctxFor(t, 4*time.Minute)
	require.NoError(t, eventstore.Setup(ctx, js, eventstore.Config{LeaseTTL: 2 * time.Second, Replicas: 3}))
	store, err := eventstore.Open(ctx, js)
	require.NoError(t, err)
	llm := providertest.NewServer(t)
	for _, id := range []string{"w1", "w2"} {
		env := append([]string{"PAL_NATS_URL=" + c.URLs(), "PAL_WORKER_ID=" + id, "PAL_REPLICAS=3",
			"PAL_LEASE_TTL=2s", "PAL_LOG_LEVEL=debug"}, llm.Env()...)
		w := testenv.StartProcess(t, testenv.PalBinary(t), []string{"worker"}, env)
		require.NoError(t, w.WaitForOutput(ctx, "worker ready"), "%s", w.Output())
	}
	streams := []string{eventstore.EventsStream, eventstore.WorkStream, "KV_" + eventstore.LeaseBucket}
	require.NoError(t, c.WaitCurrent(ctx, js, streams...))

	var all []string
	for _, target := range streams {
		// Runs that keep appending a tool step every ~20 ms, and one that
		// waits on a held LLM call across the kill.
		var ids []string
		for range 4 {
			res, err := runs.New(store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(sleepChain(80, 20))})
			require.NoError(t, err)
			ids = append(ids, res.RunID)
		}
		heldID := event.NewRunID()
		hold := llm.Hold(providertest.ByKey(key(heldID, "s2", 1)))
		_, err := runs.New(store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: heldID, Workflow: json.RawMessage(seqWorkflow(3, "openai")),
			Input: json.RawMessage(`{"topic":"cluster"}`)})
		require.NoError(t, err)
		ids = append(ids, heldID)
		_, err = hold.Wait(ctx)
		require.NoError(t, err)

		seen := observe(t, ctx, js, 60)
		leader, err := c.LeaderOf(ctx, js, target)
		require.NoError(t, err)
		killed := time.Now()
		leader.Kill()
		hold.Release()

		var stalls []time.Duration
		for _, id := range ids {
			evs := waitEndOn(t, ctx, store, id)
			require.Equal(t, event.RunSucceeded, evs[len(evs)-1].Kind, "run %s after killing the leader of %s", id, target)
			stalls = append(stalls, stallAfter(evs, killed))
		}
		slices.Sort(stalls)
		t.Logf("killed %s, leader of %s: each run's longest wait for its next event: %v", c.Name(leader), target, stalls)
		leader.Start(t)
		j := testenv.ReadJournal(t, nc) // also: one terminal event per run, nothing after it, chain and writer rule
		for _, ev := range seen {
			got := j[ev.RunID]
			require.GreaterOrEqual(t, len(got), int(ev.Seq), "run %s lost seq %d", ev.RunID, ev.Seq)
			require.Equal(t, ev, got[ev.Seq-1], "run %s seq %d changed", ev.RunID, ev.Seq)
		}
		for _, id := range ids {
			require.Equal(t, 1, j.Count(id, event.RunSucceeded, ""), "run %s", id)
		}
		require.LessOrEqual(t, llm.Keys()[key(heldID, "s2", 1)], 2, "the held call is sent at most twice (once more after a lost drive)")
		require.Equal(t, 1, llm.Keys()[key(heldID, "s3", 1)])
		all = append(all, ids...)
		require.NoError(t, c.WaitCurrent(ctx, js, streams...))
	}
	require.Len(t, all, 15)
}

// sleepChain is a workflow of n tool steps that each sleep ms: a run that
// keeps appending for n*ms.
func sleepChain(n, ms int) string {
	return paltest.Chain(fmt.Sprintf("sleep-%d", n), n, func(i int, _ string) (string, string) {
		id := fmt.Sprintf("t%d", i)
		return id, fmt.Sprintf(`{"id":%q,"type":"tool","data":{"tool":"sleep","input":{"ms":%d}}}`, id, ms)
	})
}

// stallAfter is the longest a run went without a new event after killed:
// the wait from the kill to its first later event, or between two later
// events, whichever is longest.
func stallAfter(evs []event.Event, killed time.Time) time.Duration {
	var worst time.Duration
	prev := killed
	for _, ev := range evs {
		if !ev.TS.After(killed) {
			continue
		}
		worst = max(worst, ev.TS.Sub(prev))
		prev = ev.TS
	}
	return worst.Round(time.Millisecond)
}

// BenchmarkLeaderKill kill -9s the leader of PAL_EVENTS ten times on a
// 3-node cluster (R3, two pal worker processes), each time mid-run, and
// reports how long runs went without a new event: p50 and max over the
// kills of each kill's longest stall. The node is started again and the
// cluster made current before the next kill. It runs on stock nats-server
// and on nodes with PAL's raft timing (natsraft.Fast, as pal dev --cluster
// runs them).
//
//	go test -run '^$' -bench LeaderKill -benchtime 1x ./workers/
func BenchmarkLeaderKill(b *testing.B) {
	for _, nodes := range []struct {
		name string
		opts []testenv.ClusterOption
	}{{"stock-raft", nil}, {"fast-raft", []testenv.ClusterOption{testenv.FastRaft()}}} {
		b.Run(nodes.name, func(b *testing.B) {
			for range b.N {
				stalls := leaderKills(b, 10, nodes.opts...)
				slices.Sort(stalls)
				b.ReportMetric(float64(stalls[len(stalls)/2].Milliseconds()), "p50-ms")
				b.ReportMetric(float64(stalls[len(stalls)-1].Milliseconds()), "max-ms")
				b.Logf("longest stall per leader kill: %v", stalls)
			}
		})
	}
}

func leaderKills(tb testing.TB, kills int, opts ...testenv.ClusterOption) []time.Duration {
	c := testenv.NATSClusterProcesses(tb, 3, opts...)
	nc := c.Conn(tb)
	js, err := jetstream.New(nc)
	require.NoError(tb, err)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	require.NoError(tb, eventstore.Setup(ctx, js, eventstore.Config{LeaseTTL: 2 * time.Second, Replicas: 3}))
	store, err := eventstore.Open(ctx, js)
	require.NoError(tb, err)
	llm := providertest.NewServer(tb)
	for _, id := range []string{"w1", "w2"} {
		env := append([]string{"PAL_NATS_URL=" + c.URLs(), "PAL_WORKER_ID=" + id, "PAL_REPLICAS=3",
			"PAL_LEASE_TTL=2s", "PAL_LOG_LEVEL=info"}, llm.Env()...)
		w := testenv.StartProcess(tb, testenv.PalBinary(tb), []string{"worker"}, env)
		require.NoError(tb, w.WaitForOutput(ctx, "worker ready"))
	}
	streams := []string{eventstore.EventsStream, eventstore.WorkStream, "KV_" + eventstore.LeaseBucket}
	var out []time.Duration
	for len(out) < kills {
		require.NoError(tb, c.WaitCurrent(ctx, js, streams...))
		var ids []string
		for range 3 {
			res, err := runs.New(store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(sleepChain(200, 20))})
			require.NoError(tb, err)
			ids = append(ids, res.RunID)
		}
		observe(tb, ctx, js, 30)
		leader, err := c.LeaderOf(ctx, js, eventstore.EventsStream)
		require.NoError(tb, err)
		killed := time.Now()
		leader.Kill()
		var worst time.Duration
		for _, id := range ids {
			evs := waitEndOn(tb, ctx, store, id)
			require.Equal(tb, event.RunSucceeded, evs[len(evs)-1].Kind)
			worst = max(worst, stallAfter(evs, killed))
		}
		leader.Start(tb)
		if worst == 0 {
			// No run wrote an event after the kill: nothing was measured.
			tb.Logf("killed %s: no run wrote after the kill; not counted", c.Name(leader))
			continue
		}
		out = append(out, worst)
	}
	return out
}
