package palcli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/internal/redact"
	"github.com/palrun/pal/internal/retry"
	"github.com/palrun/pal/runs"
)

// natsTarget is where, and as whom, a process connects to NATS: the URL
// (PAL_NATS_URL, which may carry user:password) and the credentials of
// PAL_NATS_CREDS (a creds file or an nkey seed file).
type natsTarget struct {
	url   string
	creds string // PAL_NATS_CREDS, the path
	auth  []nats.Option
}

// String is the URL without its password, for logs and errors.
func (t natsTarget) String() string { return redact.URL(t.url) }

// natsTarget reads PAL_NATS_URL and PAL_NATS_CREDS.
func (e *env) natsTarget(cmd *cobra.Command) (natsTarget, error) {
	t := natsTarget{url: e.natsURL(cmd), creds: e.getenv("PAL_NATS_CREDS")}
	if path := t.creds; path != "" {
		opt, err := natsauth.CredsOption(path)
		if err != nil {
			return t, badInput("PAL_NATS_CREDS=%s: %v", path, err)
		}
		t.auth = []nats.Option{opt}
	}
	return t, nil
}

// natsRefusal is a permissions violation NATS reported on a one-shot
// command's connection: the command's credentials may not do what it
// needs. It replaces the error the command then fails with (a request cut
// short), which says nothing of why.
type natsRefusal struct {
	who   string // "the credentials in PAL_NATS_CREDS (path)", or the URL's user
	err   error  // wraps nats.ErrPermissionViolation, or for a login a nats.ErrAuthorization
	login bool   // NATS refused the connection itself
}

func (r *natsRefusal) Error() string {
	if r.login {
		return fmt.Sprintf("NATS refused the login of %s: %v — set PAL_NATS_CREDS to a role's credentials "+
			"(under pal dev, .pal/dev.env names the worker's, .pal/%s is the api role's) or the user and password in PAL_NATS_URL",
			r.who, r.err, natsauth.SeedFile(natsauth.API))
	}
	what := strings.TrimPrefix(r.err.Error(), nats.ErrPermissionViolation.Error()+": ")
	return fmt.Sprintf("NATS refused this command for %s: %s — the CLI's run commands need the api role (.pal/%s under pal dev) "+
		"or the worker's (.pal/%s, what pal dev's .pal/dev.env sets); a client user reaches PAL through the NATS service (pal.api.>) and pal.cmd.runs.<kind>.<user>",
		r.who, what, natsauth.SeedFile(natsauth.API), natsauth.SeedFile(natsauth.Worker))
}

func (r *natsRefusal) Unwrap() error { return r.err }

// explain gives err the reason NATS gave, if it refused the command
// something: the refusal, not the closed connection that followed it.
func (e *env) explain(err error) error {
	var r *natsRefusal
	if err == nil || errors.As(err, &r) {
		return err
	}
	if r := e.refused.Load(); r != nil {
		return r
	}
	return err
}

// connectNow connects for a one-shot command: it fails fast with exit
// code 4 when NATS is unreachable. A permissions violation closes the
// connection at once, so the request NATS dropped fails now rather than
// at its timeout, and explain reports the violation.
func (e *env) connectNow(t natsTarget, name string) (*nats.Conn, error) {
	who := "the user of PAL_NATS_URL (" + t.String() + ")"
	if t.creds != "" {
		who = "the credentials in PAL_NATS_CREDS (" + t.creds + ")"
	}
	onError := nats.ErrorHandler(func(c *nats.Conn, _ *nats.Subscription, err error) {
		if !errors.Is(err, nats.ErrPermissionViolation) {
			fmt.Fprintf(e.stderr, "pal: NATS: %v\n", err)
			return
		}
		if e.refused.CompareAndSwap(nil, &natsRefusal{who: who, err: err}) {
			// Not from this callback's goroutine: Close runs the
			// connection's callbacks on it.
			go c.Close()
		}
	})
	// A one-shot command connects as one of PAL's roles: its replies stay
	// in PAL's account (_PAL_INBOX; _INBOX crosses to the clients).
	nc, err := nats.Connect(t.url, append([]nats.Option{nats.Name(name), nats.Timeout(3 * time.Second), onError,
		natsauth.InboxOption()}, t.auth...)...)
	if refusedLogin(err) {
		// Refused for good, as a permissions violation is: exit 2.
		return nil, &natsRefusal{who: who, err: err, login: true}
	}
	if err != nil {
		return nil, withCode(ExitUnavailable, fmt.Errorf("cannot reach NATS at %s: %v (start 'pal dev'; from outside its directory set PAL_HOME to its data directory, default ./.pal; or set PAL_NATS_URL and PAL_NATS_CREDS)", t, err))
	}
	return nc, nil
}

// refusedLogin reports whether NATS refused a connection's credentials
// (none given, wrong, expired or revoked), not that it could not be reached.
func refusedLogin(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		errors.Is(err, nats.ErrAuthRevoked) || errors.Is(err, nats.ErrAccountAuthExpired)
}

// connectClient connects a one-shot command (pal run …) and returns the
// front door over the event store (client.Store() for the journal
// itself), the one every such command uses; close closes the connection.
func (e *env) connectClient(ctx context.Context, s *settings) (client *runs.Client, close func(), err error) {
	nc, err := e.connectNow(s.nats, "pal-cli")
	if err != nil {
		return nil, nil, err
	}
	store, err := openStore(ctx, nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return s.client(store), nc.Close, nil
}

// connectDurable connects for a long-running process: it keeps trying
// while NATS is down and reconnects forever.
func connectDurable(t natsTarget, name string, log *slog.Logger) (*nats.Conn, error) {
	opts := append([]nats.Option{
		nats.Name(name),
		natsauth.InboxOption(), // replies to PAL's processes are for PAL's roles only
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100 * time.Millisecond),
		nats.ReconnectJitter(50*time.Millisecond, 50*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected from NATS", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("reconnected to NATS", "url", c.ConnectedUrlRedacted()) }),
		// A role's missing permission shows in the log, not only as a
		// request that times out.
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Error("NATS error", "err", err)
		}),
	}, t.auth...)
	return nats.Connect(t.url, opts...)
}

// setupWithRetry runs eventstore.Setup until it succeeds or ctx ends, so a
// worker started before NATS waits for it.
func setupWithRetry(ctx context.Context, js jetstream.JetStream, cfg eventstore.Config, log *slog.Logger) error {
	return waitFor(ctx, log, "waiting for NATS JetStream", func() error {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return natsReason(js.Conn(), eventstore.Setup(sctx, js, cfg))
	})
}

// natsReason adds to err, from a wait for NATS, what the server last said
// (nc.LastError): a refused login otherwise shows only as "connection
// closed". A connection NATS closed for good — it refused the
// credentials twice, and MaxReconnects is unlimited otherwise — ends the
// wait: nothing will change until the process is started with others.
func natsReason(nc *nats.Conn, err error) error {
	if err == nil {
		return nil
	}
	if last := nc.LastError(); last != nil && !strings.Contains(err.Error(), last.Error()) {
		err = fmt.Errorf("%w (NATS: %s)", err, strings.TrimPrefix(last.Error(), "nats: "))
	}
	if nc.IsClosed() {
		return retry.Permanent(fmt.Errorf("%w; NATS closed the connection for good (check PAL_NATS_CREDS and the server's authorization)", err))
	}
	return err
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
