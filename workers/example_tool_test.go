package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

// A worker with a tool of its own: tool nodes name it under data.tool. The
// tool may run again after a crash with the same idempotency key, so it
// must tolerate being called twice for one step.
func Example_customTool() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// An embedded JetStream for the example; a real worker dials
	// PAL_NATS_URL.
	dir, _ := os.MkdirTemp("", "pal-example-")
	defer os.RemoveAll(dir)
	srv, err := server.NewServer(&server.Options{JetStream: true, StoreDir: dir, DontListen: true, NoSigs: true})
	if err != nil {
		panic(err)
	}
	srv.Start()
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(5 * time.Second) {
		panic("NATS did not start")
	}
	nc, err := nats.Connect("", nats.InProcessServer(srv))
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	if err := eventstore.Setup(ctx, js, eventstore.Config{}); err != nil {
		panic(err)
	}
	store, err := eventstore.Open(ctx, js)
	if err != nil {
		panic(err)
	}
	leases, err := eventstore.OpenLeases(ctx, js, 3*time.Second)
	if err != nil {
		panic(err)
	}

	// No LLM providers or connectors: this worker only runs tools.
	w := workers.New(workers.Config{ID: "example"}, store, leases, nil, nil)
	w.RegisterTool("shout", func(ctx context.Context, input json.RawMessage) (json.RawMessage, error) {
		var in struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal(input, &in); err != nil {
			// Bad input stays bad: do not retry it.
			return nil, &workers.ToolError{Err: err, Retryable: false}
		}
		return json.Marshal(map[string]string{"text": strings.ToUpper(in.Text) + "!"})
	})
	if err := w.Start(ctx); err != nil {
		panic(err)
	}
	defer func() { _ = w.Stop(context.Background()) }()

	res, err := runs.New(store).Start(ctx, runs.StartCommand{Rights: runs.AllRights,
		Workflow: json.RawMessage(`{"name":"shout","nodes":[
			{"id":"start","type":"trigger"},
			{"id":"loud","type":"tool","data":{"tool":"shout","input":{"text":"{{input.text}}"}}}],
			"edges":[{"from":"start","to":"loud"}]}`),
		Input: json.RawMessage(`{"text":"durable"}`),
	})
	if err != nil {
		panic(err)
	}
	err = store.Watch(ctx, res.RunID, eventstore.Head{}, func(ev event.Event) error {
		if ev.Kind == event.RunSucceeded {
			var d event.RunSucceededData
			_ = ev.DecodeData(&d)
			fmt.Printf("%s %s\n", ev.Kind, d.Output)
		}
		if ev.Kind.Terminal() {
			return eventstore.ErrStopWatch
		}
		return nil
	})
	if err != nil {
		panic(err)
	}
	// Output: run_succeeded {"text":"DURABLE!"}
}
