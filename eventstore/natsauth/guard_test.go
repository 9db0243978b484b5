package natsauth_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/eventstore/natsauth"
)

// create sends a consumer create from the client account and returns the
// JetStream API's answer.
func (b *bundle) create(t *testing.T, stream, name string, cfg map[string]any) map[string]any {
	t.Helper()
	cfg["name"] = name
	body, err := json.Marshal(map[string]any{"stream_name": stream, "config": cfg})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	subject := "$JS.API.CONSUMER.CREATE." + stream
	if name != "" {
		subject += "." + name
	} else {
		delete(cfg, "name")
	}
	m, err := b.client.RequestWithContext(ctx, subject, body)
	require.NoError(t, err)
	var ans map[string]any
	require.NoError(t, json.Unmarshal(m.Data, &ans), "%s", m.Data)
	return ans
}

func apiErrorOf(ans map[string]any) string {
	if e, ok := ans["error"].(map[string]any); ok {
		return fmt.Sprint(e["description"])
	}
	return ""
}

// TestGuardRefuses: a consumer create from the client account whose body
// asks for what NATS cannot check by subject is refused by PAL's guard
// before the JetStream API sees it: a durable, a direct or sourcing
// consumer (uncounted by every JetStream limit), a queue group, an
// inactive threshold past the bound, and a push consumer delivering
// anywhere but the client's inbox (the server would publish there itself,
// in PAL's account: on a journal, a lease, a work queue, an ack, a
// command). Nothing is created, nothing is delivered, and an ephemeral
// push consumer delivering to the client's inbox works.
func TestGuardRefuses(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runA := b.start(t, echoWF)
	b.waitStatus(t, runA, "succeeded")
	js, err := jetstream.New(b.admin)
	require.NoError(t, err)
	consumers := func(stream string) int {
		info, err := js.Stream(ctx, stream)
		require.NoError(t, err)
		return info.CachedInfo().State.Consumers
	}
	streams := []string{eventstore.EventsStream, "KV_" + eventstore.LeaseBucket, eventstore.BlobStream}
	had := map[string]int{}
	for _, s := range streams {
		had[s] = consumers(s)
	}
	// Something to deliver on each target, were the consumer made.
	got := make(chan *nats.Msg, 1000)
	n := 0
	for _, stream := range streams {
		for _, deliver := range []string{
			eventstore.EventsSubject("run_forged"), eventstore.EventsSubject(runA), eventstore.WorkSubject("", runA),
			"$KV." + eventstore.LeaseBucket + "." + runA, eventstore.CommandPrefix + "start", eventstore.CommandPrefix + "start.client",
			"$JS.ACK." + eventstore.WorkStream + "." + eventstore.WorkConsumer + ".1.1.1.0.0", "pal.ctl.cancel." + runA,
			natsauth.Inbox + ".x", "_INBOX", "_INBOX.*", "_INBOX.a..b",
		} {
			n++
			var sub *nats.Subscription
			if !strings.HasPrefix(deliver, "_INBOX") { // the admin may not read the clients' inboxes
				sub, err = b.admin.ChanSubscribe(deliver, got)
				require.NoError(t, err)
			}
			ans := b.create(t, stream, fmt.Sprintf("push%d", n), map[string]any{"deliver_subject": deliver, "deliver_policy": "all", "ack_policy": "none"})
			require.Contains(t, apiErrorOf(ans), "delivers only to the client's inbox", "%s → %s: %v", stream, deliver, ans)
			if sub != nil {
				require.NoError(t, sub.Unsubscribe())
			}
		}
	}
	for name, cfg := range map[string]map[string]any{
		"durable":  {"durable_name": "durable", "ack_policy": "none"},
		"direct":   {"direct": true, "deliver_subject": "_INBOX.d", "ack_policy": "none"},
		"sourcing": {"sourcing": true, "ack_policy": "none"},
		"group":    {"deliver_subject": "_INBOX.g", "deliver_group": "g", "ack_policy": "none"},
		"inactive": {"inactive_threshold": int64(time.Hour), "ack_policy": "none"},
	} {
		ans := b.create(t, eventstore.EventsStream, name, cfg)
		require.Contains(t, apiErrorOf(ans), "PAL:", "%s: %v", name, ans)
	}
	require.NoError(t, b.admin.Flush())
	require.Empty(t, got, "a refused consumer delivered")
	for _, s := range streams {
		require.Equal(t, had[s], consumers(s), "a consumer was made on %s", s)
	}

	// The client's own inbox: made, and it delivers the journal there.
	inbox := nats.NewInbox()
	mine := make(chan *nats.Msg, 100)
	_, err = b.client.ChanSubscribe(inbox, mine)
	require.NoError(t, err)
	ans := b.create(t, eventstore.EventsStream, "mine", map[string]any{"deliver_subject": inbox, "deliver_policy": "all",
		"ack_policy": "none", "filter_subject": eventstore.EventsSubject(runA)})
	require.Empty(t, apiErrorOf(ans), "%v", ans)
	cfg := ans["config"].(map[string]any)
	require.Equal(t, natsauth.DefaultUser, cfg["metadata"].(map[string]any)[natsauth.ClientMetadata], "the guard marks whose it is")
	select {
	case m := <-mine:
		require.Contains(t, string(m.Data), `"kind":"run_created"`)
	case <-ctx.Done():
		t.Fatal("nothing delivered to the client's inbox")
	}

	// A create without a consumer name (the server names it) too, on
	// every stream a client consumes.
	for _, stream := range []string{eventstore.EventsStream, "KV_" + eventstore.LeaseBucket, "KV_" + eventstore.WorkflowBucket} {
		ans := b.create(t, stream, "", map[string]any{"deliver_subject": nats.NewInbox(), "deliver_policy": "new", "ack_policy": "none"})
		require.Empty(t, apiErrorOf(ans), "%s: %v", stream, ans)
		require.NotEmpty(t, ans["name"], stream)
	}
	require.NoError(t, b.client.Flush())
	require.Empty(t, b.cviol.all())
}

// TestClientConsumerLimit: the client account holds at most
// natsauth.MaxClientConsumers consumers on a stream; creating one more
// fails with the JetStream API's maximum consumers error, which nats.go
// reports as jetstream.ErrMaximumConsumersLimit. PAL's own consumers are
// not counted and still made.
func TestClientConsumerLimit(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: natsauth.MaxClientInactive}
	for i := range natsauth.MaxClientConsumers {
		_, err := b.cjs.CreateConsumer(ctx, eventstore.EventsStream, cfg)
		require.NoError(t, err, "consumer %d", i+1)
	}
	_, err := b.cjs.CreateConsumer(ctx, eventstore.EventsStream, cfg)
	require.ErrorIs(t, err, jetstream.ErrMaximumConsumersLimit, "consumer %d", natsauth.MaxClientConsumers+1)
	require.True(t, strings.Contains(err.Error(), "maximum consumers limit reached"), "%v", err)
	// Another stream has its own count.
	_, err = b.cjs.CreateConsumer(ctx, "KV_"+eventstore.LeaseBucket, cfg)
	require.NoError(t, err)
	// PAL's own consumers are made past it (the projector's rebuild, say).
	pjs, err := jetstream.New(b.admin)
	require.NoError(t, err)
	_, err = pjs.OrderedConsumer(ctx, eventstore.EventsStream, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	require.NoError(t, b.client.Flush())
	require.Empty(t, b.cviol.all())
}
