package eventstore

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/palrun/pal/internal/telemetry"
)

// Group commit for strict durability. On a server that fsyncs before every
// ack (sync_interval: always) one stream stores, and so fsyncs, one message
// at a time: 64 runs appending at once wait for each other's fsyncs. An
// atomic batch (the stream's AllowAtomicPublish) is stored with one fsync
// for all its messages before its one ack, whatever their subjects, and
// each message keeps its own Nats-Expected-Last-Subject-Sequence check. So
// the appends of a process's runs are committed in groups: while a group is
// being written, the next appends queue, and the first of them then writes
// every queued one at once. A lone append is published as it comes, so a
// run on its own pays nothing. The batch is all or nothing: when it fails
// (a run's fence moved, a retried message id, a timeout) every append in it
// is published alone, which tells each its own answer (store.go's publish).

const (
	// groupMinBatch is the fewest appends written as one atomic batch. An
	// atomic batch costs the server a staging store (about 3 ms of file
	// work on the test machine), worth it only over several fsyncs; fewer
	// queued appends are published side by side, one fsync each.
	groupMinBatch = 4
	// groupMaxBatch is nats-server's limit of messages in one batch.
	groupMaxBatch = 1000
	// groupMaxBytes bounds what one batch stages.
	groupMaxBytes = 8 << 20
)

// errGroupFailed is the answer to every append of a batch that failed: it
// is then published alone.
var errGroupFailed = errors.New("eventstore: group commit failed")

// groupCommit queues appends and writes them a group at a time. No
// goroutine runs while nothing is queued: the append that finds no group
// being written writes its own, and hands the next group to the first
// append queued meanwhile.
type groupCommit struct {
	js      jetstream.JetStream
	timeout time.Duration

	mu      sync.Mutex
	writing bool
	queue   []*groupAppend

	// batches and batched count the atomic batches committed and the
	// appends in them (for tests and benchmarks).
	batches, batched atomic.Int64
}

// groupAppend is one queued message and its answer.
type groupAppend struct {
	msg    *nats.Msg
	msgID  string
	expect uint64 // the expected last sequence of its subject

	ack  *jetstream.PubAck
	err  error
	done chan struct{} // closed once ack or err is set
	lead chan struct{} // the append is to write the next group
}

func newGroupCommit(js jetstream.JetStream, timeout time.Duration) *groupCommit {
	return &groupCommit{js: js, timeout: timeout}
}

// publish writes msg (fenced on expect, deduplicated by msgID) with the
// appends queued beside it and returns its ack, or an error as PublishMsg
// would give it (errGroupFailed when its batch failed as a whole).
func (g *groupCommit) publish(ctx context.Context, msg *nats.Msg, msgID string, expect uint64) (*jetstream.PubAck, error) {
	a := &groupAppend{msg: msg, msgID: msgID, expect: expect, done: make(chan struct{}), lead: make(chan struct{}, 1)}
	g.mu.Lock()
	g.queue = append(g.queue, a)
	if !g.writing {
		g.writing = true
		g.mu.Unlock()
		g.write(ctx)
	} else {
		g.mu.Unlock()
	}
	for {
		select {
		case <-a.done:
			return a.ack, a.err
		case <-a.lead:
			g.write(ctx)
		case <-ctx.Done():
			g.abandon(a)
			return nil, ctx.Err()
		}
	}
}

// abandon takes a out of the queue when its caller gives up. If a was
// handed the next group, the group passes on. An append already in a group
// being written stays there; its caller's retry finds whether it landed.
func (g *groupCommit) abandon(a *groupAppend) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, q := range g.queue {
		if q == a {
			g.queue = append(g.queue[:i], g.queue[i+1:]...)
			break
		}
	}
	select {
	case <-a.lead:
		g.handOff()
	default:
	}
}

// write writes one group: the queued appends, one per subject, up to the
// batch limits. It then hands the next group to the first append still
// queued, or stops writing.
func (g *groupCommit) write(ctx context.Context) {
	g.mu.Lock()
	var group, rest []*groupAppend
	subjects := make(map[string]bool, len(g.queue))
	size := 0
	for _, a := range g.queue {
		// A subject can be fenced once per batch; a second append to it
		// (a competing writer) waits for the next group.
		if subjects[a.msg.Subject] || len(group) == groupMaxBatch || (len(group) > 0 && size+len(a.msg.Data) > groupMaxBytes) {
			rest = append(rest, a)
			continue
		}
		subjects[a.msg.Subject] = true
		size += len(a.msg.Data)
		group = append(group, a)
	}
	g.queue = rest
	g.mu.Unlock()

	// The group is written for every caller in it, so it is not cut short
	// when the writing caller gives up; the request timeout bounds it.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.timeout)
	if len(group) >= groupMinBatch {
		g.commit(wctx, group)
	} else {
		g.publishEach(wctx, group)
	}
	cancel()
	for _, a := range group {
		close(a.done)
	}

	g.mu.Lock()
	g.handOff()
	g.mu.Unlock()
}

// handOff passes the writing of the next group to the first queued
// append, or ends it. g.mu is held.
func (g *groupCommit) handOff() {
	if len(g.queue) == 0 {
		g.writing = false
		return
	}
	g.queue[0].lead <- struct{}{}
}

// publishEach publishes a few appends side by side, each with its own ack.
func (g *groupCommit) publishEach(ctx context.Context, group []*groupAppend) {
	var wg sync.WaitGroup
	for _, a := range group {
		wg.Go(func() { a.ack, a.err = publishFenced(ctx, g.js, a.msg, a.msgID, a.expect) })
	}
	wg.Wait()
}

// commit writes the group as one atomic batch: one fsync, one ack, whose
// sequence is the last message's; the others precede it in order.
func (g *groupCommit) commit(ctx context.Context, group []*groupAppend) {
	msgs := make([]*nats.Msg, len(group))
	for i, a := range group {
		// A copy: the batch headers must not stay on a message that is
		// then published alone.
		h := make(nats.Header, len(a.msg.Header)+6)
		for k, v := range a.msg.Header {
			h[k] = v
		}
		h.Set(jetstream.MsgIDHeader, a.msgID)
		h.Set(jetstream.ExpectedStreamHeader, EventsStream)
		h.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(a.expect, 10))
		msgs[i] = &nats.Msg{Subject: a.msg.Subject, Data: a.msg.Data, Header: h}
	}
	ack, err := jetstreamext.PublishMsgBatch(ctx, g.js, msgs,
		jetstreamext.BatchFlowControl{AckFirst: false, AckTimeout: g.timeout})
	if err != nil || ack == nil || ack.BatchSize != uint64(len(group)) || ack.Sequence < uint64(len(group)) {
		for _, a := range group {
			a.err = errGroupFailed
		}
		telemetry.GroupWritten(len(group), false)
		return
	}
	telemetry.GroupWritten(len(group), true)
	g.batches.Add(1)
	g.batched.Add(int64(len(group)))
	first := ack.Sequence - uint64(len(group)) + 1
	for i, a := range group {
		a.ack = &jetstream.PubAck{Stream: ack.Stream, Sequence: first + uint64(i)}
	}
}
