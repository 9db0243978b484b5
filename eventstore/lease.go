package eventstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Leases grants per-run leases from the PAL_LEASES bucket.
type Leases struct {
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	ttl time.Duration
	log *slog.Logger
}

// LeaseOption configures OpenLeases.
type LeaseOption func(*Leases)

// WithLeaseLogger sets where a broken foreign lease is logged (default
// slog.Default()).
func WithLeaseLogger(log *slog.Logger) LeaseOption { return func(l *Leases) { l.log = log } }

// OpenLeases returns the lease bucket created by Setup, handing out leases
// of the given TTL (rounded to whole seconds, at least 1s).
func OpenLeases(ctx context.Context, js jetstream.JetStream, ttl time.Duration, opts ...LeaseOption) (*Leases, error) {
	kv, err := js.KeyValue(ctx, LeaseBucket)
	if err != nil {
		return nil, fmt.Errorf("opening KV bucket %s: %w", LeaseBucket, err)
	}
	l := &Leases{js: js, kv: kv, ttl: Config{LeaseTTL: ttl}.withDefaults().LeaseTTL, log: slog.Default()}
	for _, o := range opts {
		o(l)
	}
	return l, nil
}

// TTL is the lease time-to-live.
func (l *Leases) TTL() time.Duration { return l.ttl }

// Lease is a held lease. It is not safe for concurrent use.
type Lease struct {
	RunID    string
	Owner    string
	Revision uint64
	ttl      time.Duration
	// sent is when the last successful create or renewal was sent; the
	// server's TTL runs from a moment after it.
	sent time.Time
}

// Acquire takes the run's lease for owner. A value there that is no
// lease PAL wrote (notALease) is broken first, and logged: it would
// otherwise be honoured for ever. Errors: *LeaseHeldError (matches
// ErrLeaseHeld) when someone holds it.
func (l *Leases) Acquire(ctx context.Context, runID, owner string) (*Lease, error) {
	if err := checkRunID(runID); err != nil {
		return nil, fmt.Errorf("acquiring lease: %w", err)
	}
	for broke := false; ; broke = true {
		sent := time.Now()
		rev, err := l.kv.Create(ctx, runID, []byte(owner), jetstream.KeyTTL(l.ttl))
		if err == nil {
			return &Lease{RunID: runID, Owner: owner, Revision: rev, ttl: l.ttl, sent: sent}, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("acquiring lease on run %s: %w", runID, err)
		}
		holder := "another worker"
		m, gerr := l.last(ctx, runID)
		if gerr == nil {
			why := notALease(m)
			if why != "" && !broke {
				if err := l.breakForeign(ctx, runID, m, why); err != nil {
					return nil, err
				}
				continue
			}
			holder = string(m.Data)
		}
		return nil, &LeaseHeldError{RunID: runID, Owner: holder}
	}
}

// last is the last message of a run's lease key, read as it is stored.
func (l *Leases) last(ctx context.Context, runID string) (*jetstream.RawStreamMsg, error) {
	st, err := l.js.Stream(ctx, leaseStream)
	if err != nil {
		return nil, err
	}
	return st.GetLastMsgForSubject(ctx, leasePrefix+runID)
}

// maxOwner bounds a lease value: a worker id (event.ValidateRunID's
// alphabet, at most 128), "/" and 8 hex of nonce (workers.New).
const maxOwner = 128 + 1 + 8

// notALease says why m, the last value of a run's lease key, is not a
// lease PAL wrote, or "": a lease carries a TTL, as every acquire and
// renewal writes it (a value without one never expires), and is a short
// owner string, not a stored answer aimed at the key.
func notALease(m *jetstream.RawStreamMsg) string {
	switch {
	case StampOf(m.Header, Answered).Echo != "":
		return "a stored answer: " + StampOf(m.Header, Answered).Echo
	case served(m.Header, jetstream.MsgTTLHeader) == "":
		return "no TTL"
	case len(m.Data) == 0 || len(m.Data) > maxOwner || strings.ContainsFunc(string(m.Data), func(r rune) bool {
		return r <= ' ' || r == '{' || r == '"' || r > '~'
	}):
		return "not a worker's owner string"
	}
	return ""
}

// breakForeign purges a run's lease key holding m, a value that is not
// a lease, at its revision (a lease taken meanwhile is left alone).
func (l *Leases) breakForeign(ctx context.Context, runID string, m *jetstream.RawStreamMsg, why string) error {
	rev := storedSeq(m)
	l.log.Warn("breaking a lease value PAL did not write", "run_id", runID, "revision", rev, "reason", why,
		"value", strings.ToValidUTF8(string(m.Data[:min(len(m.Data), 80)]), ""))
	err := l.kv.Purge(ctx, runID, jetstream.LastRevision(rev), jetstream.PurgeTTL(time.Minute))
	if err != nil && !isWrongLastSeq(err) && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("breaking the foreign lease value on run %s: %w", runID, err)
	}
	return nil
}

// Renew extends the lease by its TTL. Errors: ErrLeaseLost when another
// owner took it or it expired; other errors are transient (the lease may
// still be held until Valid says otherwise). A retry after a transient
// error whose renewal had landed (its ack was lost) recognises it and
// renews again from there.
func (l *Leases) Renew(ctx context.Context, ls *Lease) error {
	for checked := false; ; checked = true {
		sent := time.Now()
		msg := &nats.Msg{Subject: leasePrefix + ls.RunID, Data: []byte(ls.Owner)}
		ack, err := l.js.PublishMsg(ctx, msg,
			jetstream.WithExpectStream(leaseStream),
			jetstream.WithExpectLastSequencePerSubject(ls.Revision),
			jetstream.WithMsgTTL(ls.ttl),
			jetstream.WithRetryWait(pubRetryWait))
		if err == nil {
			ls.Revision = ack.Sequence
			ls.sent = sent
			return nil
		}
		if !isWrongLastSeq(err) {
			return fmt.Errorf("renewing lease on run %s: %w", ls.RunID, err)
		}
		if checked {
			return fmt.Errorf("renewing lease on run %s: %w", ls.RunID, ErrLeaseLost)
		}
		rev, ours, err := l.landedRenewal(ctx, ls)
		if err != nil {
			return fmt.Errorf("renewing lease on run %s: %w", ls.RunID, err)
		}
		if !ours {
			return fmt.Errorf("renewing lease on run %s: %w", ls.RunID, ErrLeaseLost)
		}
		// The lease is ours at rev. Renew once more, so that Valid counts
		// from a send whose time is known.
		ls.Revision = rev
	}
}

// landedRenewal reports whether the lease key's last revision is a
// renewal of ls that landed with its ack lost: our owner's value, published
// with ls.Revision as the expected last sequence. Anything else there (an
// expiry or release marker, another owner, a fresh acquire) means the
// lease is lost.
func (l *Leases) landedRenewal(ctx context.Context, ls *Lease) (uint64, bool, error) {
	st, err := l.js.Stream(ctx, leaseStream)
	if err != nil {
		return 0, false, err
	}
	m, err := st.GetLastMsgForSubject(ctx, leasePrefix+ls.RunID)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	ours := string(m.Data) == ls.Owner &&
		m.Header.Get(jetstream.ExpectedLastSubjSeqHeader) == strconv.FormatUint(ls.Revision, 10)
	return m.Sequence, ours, nil
}

// Release gives the lease up if ls still holds it. Releasing a lost lease
// is not an error.
func (l *Leases) Release(ctx context.Context, ls *Lease) error {
	err := l.kv.Purge(ctx, ls.RunID, jetstream.LastRevision(ls.Revision), jetstream.PurgeTTL(time.Minute))
	if err != nil && !isWrongLastSeq(err) && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("releasing lease on run %s: %w", ls.RunID, err)
	}
	return nil
}

// Holder returns the current owner of a run's lease, or "" when free.
func (l *Leases) Holder(ctx context.Context, runID string) (string, error) {
	if err := checkRunID(runID); err != nil {
		return "", fmt.Errorf("reading lease: %w", err)
	}
	e, err := l.kv.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading lease on run %s: %w", runID, err)
	}
	return string(e.Value()), nil
}

// WaitFree blocks until the run's lease is free (released or expired) or
// ctx ends. It returns nil only when the lease is free: ctx.Err() when ctx
// ended, an error when the watch itself ended (the connection closed).
func (l *Leases) WaitFree(ctx context.Context, runID string) error {
	if err := checkRunID(runID); err != nil {
		return fmt.Errorf("watching lease: %w", err)
	}
	w, err := l.kv.Watch(ctx, runID)
	if err != nil {
		return fmt.Errorf("watching lease on run %s: %w", runID, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				// The watch ended (its connection closed) without saying
				// anything about the lease.
				if err := ctx.Err(); err != nil {
					return err
				}
				return fmt.Errorf("watching lease on run %s: the watch ended before the lease was free", runID)
			}
			// nil marks the end of the initial values: the key is absent.
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				if e != nil || l.free(ctx, runID) {
					return nil
				}
			}
		}
	}
}

func (l *Leases) free(ctx context.Context, runID string) bool {
	h, err := l.Holder(ctx, runID)
	return err == nil && h == ""
}

// Valid reports whether the lease is certainly still held at now: the
// TTL, less a safety margin, has not passed since the last renewal was
// sent. A writer checks it before every append.
func (ls *Lease) Valid(now time.Time) bool {
	margin := ls.ttl / 5
	if margin > 500*time.Millisecond {
		margin = 500 * time.Millisecond
	}
	return now.Sub(ls.sent) < ls.ttl-margin
}

// TTL is the lease's time-to-live.
func (ls *Lease) TTL() time.Duration { return ls.ttl }

// Break takes a run's lease from whoever holds it (an operator's forced
// resume): it purges the key at the revision it read, so a lease taken
// meanwhile by someone else is left alone. The holder's next renewal then
// fails (ErrLeaseLost) and the fencing token of the next drive keeps its
// appends out. It returns the holder it broke, or "" when the lease was
// free.
func (l *Leases) Break(ctx context.Context, runID string) (string, error) {
	if err := checkRunID(runID); err != nil {
		return "", fmt.Errorf("breaking lease: %w", err)
	}
	e, err := l.kv.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading lease on run %s: %w", runID, err)
	}
	err = l.kv.Purge(ctx, runID, jetstream.LastRevision(e.Revision()), jetstream.PurgeTTL(time.Minute))
	if err != nil && !isWrongLastSeq(err) && !errors.Is(err, jetstream.ErrKeyExists) {
		return "", fmt.Errorf("breaking lease on run %s: %w", runID, err)
	}
	if err != nil {
		return "", fmt.Errorf("breaking lease on run %s: it changed hands meanwhile: %w", runID, ErrLeaseHeld)
	}
	return string(e.Value()), nil
}

// AfterTaken runs act and then waits until someone takes the run's lease
// (a put after act began), or ctx ends. It returns the new holder, or ""
// when ctx ended first: that is not an error.
func (l *Leases) AfterTaken(ctx context.Context, runID string, act func() error) (string, error) {
	if err := checkRunID(runID); err != nil {
		return "", fmt.Errorf("watching lease: %w", err)
	}
	w, err := l.kv.Watch(ctx, runID, jetstream.UpdatesOnly())
	if err != nil {
		return "", fmt.Errorf("watching lease on run %s: %w", runID, err)
	}
	defer func() { _ = w.Stop() }()
	if err := act(); err != nil {
		return "", err
	}
	for {
		select {
		case <-ctx.Done():
			return "", nil
		case e, ok := <-w.Updates():
			if !ok {
				return "", nil
			}
			if e != nil && e.Operation() == jetstream.KeyValuePut {
				return string(e.Value()), nil
			}
		}
	}
}
