//go:build unix

package api_test

import (
	"context"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
)

// heapNow is the live heap, and the goroutine stacks, after a GC.
func heapNow() (heap, stacks uint64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc, ms.StackInuse
}

// BenchmarkIdleStreamsHeap opens 100 event streams from the start of a
// run whose journal holds 20 MB, reads none of them, and reports how much
// the API's heap grew per stream once they wait on their writes. NATS
// runs in a process of its own, so its caches are not in the heap
// measured. It fails at 64 KiB or more a stream. Run it with
//
//	go test -run '^$' -bench BenchmarkIdleStreamsHeap -benchtime 1x ./api/
func BenchmarkIdleStreamsHeap(b *testing.B) {
	ctx := context.Background()
	srv := testenv.NATSProcess(b)
	js, err := jetstream.New(srv.Conn(b))
	require.NoError(b, err)
	require.NoError(b, eventstore.Setup(ctx, js, eventstore.Config{}))
	runID, _, size := bigRun(b, js, 20<<20)
	store, err := eventstore.Open(ctx, js)
	require.NoError(b, err)
	server := api.NewServer("127.0.0.1:0", api.NewHandler(api.HandlerConfig{Store: store, Logger: paltest.Logger(b),
		Tokens: []api.Token{{Name: "ci", Secret: testToken}}}), paltest.Logger(b))
	require.NoError(b, server.Start(ctx))
	b.Cleanup(func() { _ = server.Stop(context.Background()) })
	addr := server.Addr()
	const n = 100
	var heap, stacks, read float64
	for b.Loop() {
		heap0, stacks0 := heapNow()
		read0 := store.ReadStats().Bytes
		for range n {
			idleStream(b, addr, runID, testToken)
		}
		read1 := settled(b, func() uint64 { return store.ReadStats().Bytes })
		heap1, stacks1 := heapNow()
		heap = (float64(heap1) - float64(heap0)) / n
		stacks = (float64(stacks1) - float64(stacks0)) / n
		read = float64(read1-read0) / n
	}
	b.ReportMetric(heap, "heap-B/stream")
	b.ReportMetric(heap+stacks, "heap+stack-B/stream")
	b.ReportMetric(read, "journal-B-read/stream")
	b.Logf("%d idle streams on a %d MB journal: heap %.0f B, with stacks %.0f B, journal read %.0f KiB per stream",
		n, size>>20, heap, heap+stacks, read/1024)
	if heap >= 64<<10 {
		b.Fatalf("the API's heap grew by %.0f B per idle stream; the bound is 64 KiB", heap)
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	require.NoError(tb, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkReconnectAtTheHead reconnects 100 times, one after another, to
// the event stream of a run in flight whose journal holds 20 MB, with
// nothing left to send (Last-Event-ID its last seq), and reports the CPU
// the whole process (API, NATS, client) spent on them and the journal
// messages each read. It fails at 1 s of CPU or more. Run it with
//
//	go test -run '^$' -bench BenchmarkReconnectAtTheHead -benchtime 1x ./api/
func BenchmarkReconnectAtTheHead(b *testing.B) {
	var store *eventstore.Store
	bd := setup(b, ownStore(b, &store))
	runID, head, size := bigRun(b, bd.JS, 20<<20)
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	last := strconv.FormatUint(head.Seq, 10)
	const n = 100
	var cpu time.Duration
	var msgs uint64
	for b.Loop() {
		read0, cpu0 := store.ReadStats().Messages, cpuTime(b)
		for range n {
			s, err := bd.openSSE(b, client, runID, "", "Last-Event-ID", last)
			require.NoError(b, err)
			require.Equal(b, http.StatusOK, s.res.StatusCode)
			line, err := s.r.ReadString('\n')
			require.NoError(b, err)
			require.True(b, strings.HasPrefix(line, "retry:"), "%q", line)
			s.close()
		}
		cpu, msgs = cpuTime(b)-cpu0, store.ReadStats().Messages-read0
	}
	b.ReportMetric(cpu.Seconds(), "cpu-s/100")
	b.ReportMetric(float64(msgs)/n, "msgs-read/reconnect")
	b.Logf("%d reconnects at the head of a %d MB journal: %v of CPU in all, %d journal messages read", n, size>>20, cpu.Round(time.Millisecond), msgs)
	if cpu >= time.Second {
		b.Fatalf("100 reconnects at the head took %v of CPU; the bound is 1 s", cpu)
	}
}
