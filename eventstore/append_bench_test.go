package eventstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// BenchmarkAppendRoundTrip puts one Append of one event beside its floor
// on the same connection and server: the same message published fenced
// with the same headers, without the Store around it, and a core NATS
// request answered at once. A sequential run's step costs two appends
// (docs/performance.md), so this is what bounds it from below; store-pair
// is one Append of two events, a step boundary in process durability (two
// messages, the second fenced on the first's ack).
//
//	go test -run '^$' -bench AppendRoundTrip -benchtime 3000x ./eventstore/
func BenchmarkAppendRoundTrip(b *testing.B) {
	bd := setup(b, eventstore.Config{})
	ctx := b.Context()
	step := func() event.Event {
		ev := event.MustNew(event.StepStarted, "s", 1, event.StepStartedData{NodeID: "s", NodeType: "tool", Input: json.RawMessage(`{"i":1}`), IdempotencyKey: "k"})
		ev.WorkerID = "w"
		return ev
	}
	for _, c := range []struct {
		name   string
		events int
	}{{"store", 1}, {"store-pair", 2}} {
		b.Run(c.name, func(b *testing.B) {
			run := fmt.Sprintf("run_%s%d", c.name, b.N)
			head, err := bd.store.Append(ctx, run, eventstore.Head{}, event.MustNew(event.RunCreated, "", 0, event.RunCreatedData{Workflow: json.RawMessage(`{}`)}))
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				evs := make([]event.Event, c.events)
				for i := range evs {
					evs[i] = step()
				}
				if head, err = bd.store.Append(ctx, run, head, evs...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("publish", func(b *testing.B) {
		body, err := event.Encode(step())
		if err != nil {
			b.Fatal(err)
		}
		subject := eventstore.EventsSubject(fmt.Sprintf("run_publish%d", b.N))
		var last uint64
		for i := range b.N {
			msg := &nats.Msg{Subject: subject, Data: body, Header: nats.Header{"Pal-Kind": []string{"step_started"}}}
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			ack, err := bd.js.PublishMsg(pctx, msg, jetstream.WithMsgID(fmt.Sprintf("%s:%d", subject, i)),
				jetstream.WithExpectStream(eventstore.EventsStream), jetstream.WithExpectLastSequencePerSubject(last))
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			last = ack.Sequence
		}
	})
	b.Run("core-request", func(b *testing.B) {
		sub, err := bd.nc.Subscribe("bench.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) })
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		for range b.N {
			if _, err := bd.nc.Request("bench.echo", []byte("x"), 5*time.Second); err != nil {
				b.Fatal(err)
			}
		}
	})
}
