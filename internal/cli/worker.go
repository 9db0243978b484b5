package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/connector"
	"github.com/palrun/pal/connector/webhook"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/anthropic"
	"github.com/palrun/pal/provider/openai"
	"github.com/palrun/pal/workers"
)

func (e *env) workerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Drive runs from the work queue",
		Long: `pal worker takes runs from the PAL_WORK queue and drives them, journaling
every step to PAL_EVENTS. Run as many as you like; each run is driven by
one worker at a time (a lease in PAL_LEASES). On SIGTERM a worker hands its
runs to the others at once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			wc, err := e.workerConfig(cmd)
			if err != nil {
				return err
			}
			return e.runWorkerWith(cmd.Context(), wc, nil, providersFromEnv())
		},
	}
	addWorkerFlags(cmd)
	return cmd
}

func addWorkerFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.String("worker-id", "", "worker id in leases and events (env PAL_WORKER_ID, default host-pid)")
	f.String("lease-ttl", "", "lease time-to-live, whole seconds (env PAL_LEASE_TTL, default 3s)")
	f.Int("concurrency", 0, "runs driven at once (env PAL_WORKER_CONCURRENCY, default 64)")
	f.String("durability", "", "process or strict (env PAL_DURABILITY, default process)")
	f.Int("replicas", 0, "stream replicas: 1 on one server, 3 in a cluster (env PAL_REPLICAS, default 1)")
}

// workerConfig is a validated worker configuration.
type workerConfig struct {
	natsURL     string
	id          string
	leaseTTL    time.Duration
	concurrency int
	durability  string
	replicas    int
}

func (e *env) workerConfig(cmd *cobra.Command) (workerConfig, error) {
	var wc workerConfig
	var err error
	wc.natsURL = e.natsURL(cmd)
	if wc.id, err = e.workerID(cmd); err != nil {
		return wc, err
	}
	if wc.leaseTTL, err = e.leaseTTL(cmd); err != nil {
		return wc, err
	}
	if wc.concurrency, err = e.intSetting(cmd, "concurrency", "PAL_WORKER_CONCURRENCY", 64, 1); err != nil {
		return wc, err
	}
	if wc.durability, err = e.durability(cmd); err != nil {
		return wc, err
	}
	if wc.replicas, err = e.replicas(cmd); err != nil {
		return wc, err
	}
	return wc, nil
}

// providersFromEnv builds the LLM providers from OPENAI_* and ANTHROPIC_*.
func providersFromEnv() provider.Registry {
	return provider.Registry{"openai": openai.FromEnv(), "anthropic": anthropic.FromEnv()}
}

func connectors() connector.Registry {
	wh := webhook.New()
	return connector.Registry{wh.Kind(): wh}
}

// runWorkerWith runs a worker until ctx ends. nc, when given, is used
// instead of dialling wc.natsURL (pal dev passes an in-process connection).
func (e *env) runWorkerWith(ctx context.Context, wc workerConfig, nc *nats.Conn, providers provider.Registry) error {
	log, err := e.logger()
	if err != nil {
		return err
	}
	if nc == nil {
		nc, err = connectDurable(wc.natsURL, "pal-worker", log)
		if err != nil {
			return withCode(ExitUnavailable, fmt.Errorf("connecting to NATS at %s: %w", wc.natsURL, err))
		}
		defer nc.Close()
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := setupWithRetry(ctx, js, eventstore.Config{Replicas: wc.replicas, LeaseTTL: wc.leaseTTL}, log); err != nil {
		return withCode(ExitUnavailable, err)
	}
	// A try that gets no answer (the server died mid-request) is retried
	// after this long; the retry is resolved by the lost-ack check.
	reqTimeout := min(max(wc.leaseTTL/2, time.Second), 5*time.Second)
	store, err := eventstore.Open(ctx, js, eventstore.WithPacking(wc.durability == DurabilityStrict),
		eventstore.WithRequestTimeout(reqTimeout))
	if err != nil {
		return withCode(ExitUnavailable, err)
	}
	leases, err := eventstore.OpenLeases(ctx, js, wc.leaseTTL)
	if err != nil {
		return withCode(ExitUnavailable, err)
	}
	w := workers.New(workers.Config{ID: wc.id, Concurrency: wc.concurrency, Logger: log}, store, leases, providers, connectors())
	if err := w.Start(ctx); err != nil {
		return err
	}
	cmds := workers.NewCommandProcessor(store, log)
	if err := cmds.Start(ctx); err != nil {
		return withCode(ExitUnavailable, err)
	}
	svc, err := api.StartService(ctx, nc, store, log)
	if err != nil {
		return withCode(ExitUnavailable, fmt.Errorf("registering the NATS service %q: %w", api.ServiceName, err))
	}
	log.Info("worker ready", "id", w.ID(), "nats", wc.natsURL, "durability", wc.durability, "lease_ttl", wc.leaseTTL)
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_ = svc.Stop()
	cerr := cmds.Stop(sctx)
	if err := w.Stop(sctx); err != nil {
		return err
	}
	return cerr
}
