package palcli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/internal/service"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/runs"
)

// The long-running commands (pal dev, pal worker, pal server, pal
// projector) compose their parts on one service.Stack: each part is
// started on top of the ones it uses, and they stop in reverse, when the
// command ends or as soon as one of them fails to start.

// stopTimeout bounds how long a stopping process waits for its parts.
const stopTimeout = 30 * time.Second

// stopStack stops st within stopTimeout, also when ctx has ended (the
// process is stopping). A long-running command defers it, joined to its
// error: every return, a failure half way up included, stops what
// started.
func stopStack(ctx context.Context, st *service.Stack, err *error) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopTimeout)
	defer cancel()
	*err = errors.Join(*err, st.Stop(sctx))
}

// natsService is the NATS micro service pal over client, as a part:
// registered on nc when started, deregistered when stopped. With pool, a
// run whose journal retention removed reads from its rows.
func natsService(nc *nats.Conn, client *runs.Client, pool *pgxpool.Pool, log *slog.Logger) service.Service {
	var svc micro.Service
	return service.Func{
		OnStart: func(ctx context.Context) (err error) {
			var opts []api.ServiceOption
			if pool != nil {
				opts = append(opts, api.WithRunReader(projections.NewReader(pool)))
			}
			if svc, err = api.StartService(ctx, nc, client, log, opts...); err != nil {
				return withCode(ExitUnavailable, fmt.Errorf("registering the NATS service %q: %w", api.ServiceName, err))
			}
			return nil
		},
		OnStop: func(context.Context) error { return svc.Stop() },
	}
}
