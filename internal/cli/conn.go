package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/palrun/pal/eventstore"
)

// connectNow connects for a one-shot command: it fails fast with exit
// code 4 when NATS is unreachable.
func (e *env) connectNow(cmd *cobra.Command, name string) (*nats.Conn, error) {
	url := e.natsURL(cmd)
	nc, err := nats.Connect(url, nats.Name(name), nats.Timeout(3*time.Second))
	if err != nil {
		return nil, withCode(ExitUnavailable, fmt.Errorf("cannot reach NATS at %s: %v (start 'pal dev', or set PAL_NATS_URL)", url, err))
	}
	return nc, nil
}

// storeNow connects for a one-shot command and opens the event store. The
// caller closes the connection.
func (e *env) storeNow(cmd *cobra.Command) (*eventstore.Store, *nats.Conn, error) {
	nc, err := e.connectNow(cmd, "pal-cli")
	if err != nil {
		return nil, nil, err
	}
	store, err := openStore(cmd.Context(), nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return store, nc, nil
}

// connectDurable connects for a long-running process: it keeps trying
// while NATS is down and reconnects forever.
func connectDurable(url, name string, log *slog.Logger) (*nats.Conn, error) {
	return nats.Connect(url,
		nats.Name(name),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond),
		nats.ReconnectJitter(50*time.Millisecond, 50*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected from NATS", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("reconnected to NATS", "url", c.ConnectedUrlRedacted()) }),
	)
}

// setupWithRetry runs eventstore.Setup until it succeeds or ctx ends, so a
// worker started before NATS waits for it.
func setupWithRetry(ctx context.Context, js jetstream.JetStream, cfg eventstore.Config, log *slog.Logger) error {
	return waitFor(ctx, log, "waiting for NATS JetStream", func() error {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return eventstore.Setup(sctx, js, cfg)
	})
}

// openStore opens the event store for a one-shot command, creating PAL's
// streams if this is the first use of the server.
func openStore(ctx context.Context, nc *nats.Conn, opts ...eventstore.Option) (*eventstore.Store, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	st, err := eventstore.Open(ctx, js, opts...)
	if err != nil && eventstore.IsMissing(err) {
		if serr := eventstore.Setup(ctx, js, eventstore.Config{}); serr != nil {
			return nil, withCode(ExitUnavailable, fmt.Errorf("setting up PAL's streams: %w", serr))
		}
		st, err = eventstore.Open(ctx, js, opts...)
	}
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
			return nil, withCode(ExitUnavailable, fmt.Errorf("NATS JetStream is not available: %w", err))
		}
		return nil, err
	}
	return st, nil
}
