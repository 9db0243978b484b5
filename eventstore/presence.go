package eventstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Presence: a worker subscribes to its presence subject and keeps an entry
// naming it in PAL_LEASES, under a key with a dot (never a run id). The
// subscription lives exactly as long as the worker's connection: when the
// process dies the server drops it, and a probe of the subject is answered
// "no responders" at once. Survivors probe the workers the entries name
// and take a departed one's leases (docs/architecture.md §11).

// PresencePrefix is the core NATS subject prefix of the presence probes:
// pal.presence.<token>, token = PresenceToken(owner).
const PresencePrefix = "pal.presence."

// presenceKeyPrefix keys presence entries in PAL_LEASES: w.<token>.
const presenceKeyPrefix = "w."

// PresenceToken is the subject token and key of a lease owner's presence:
// a digest, so that any owner string makes one bounded token.
func PresenceToken(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(sum[:16])
}

// PresenceSubject is the subject a lease owner answers probes on.
func PresenceSubject(owner string) string { return PresencePrefix + PresenceToken(owner) }

// Presence is one worker's presence entry.
type Presence struct {
	Token    string
	Owner    string // "" when the entry was removed
	Revision uint64
	// Caps is what the worker announced it can do (nil for an entry
	// written before capabilities: its value was the owner alone).
	Caps *Capabilities
}

// Capabilities is what a worker can do, announced in its presence entry
// (a JSON object, §5.2) for pal workers and operators: the queues it takes
// runs from, the Go tools registered on it, its MCP servers and the
// programs its process steps may start (empty: any).
type Capabilities struct {
	Owner    string    `json:"owner"`
	WorkerID string    `json:"worker_id"`
	Queues   []string  `json:"queues"`
	Tools    []string  `json:"tools"`
	MCP      []string  `json:"mcp,omitempty"`
	Programs []string  `json:"programs,omitempty"`
	Started  time.Time `json:"started"`
}

// presenceOf decodes a presence entry's value: a Capabilities object, or
// (written before them) the owner string.
func presenceOf(v []byte) (owner string, caps *Capabilities) {
	var c Capabilities
	if len(v) > 0 && v[0] == '{' && json.Unmarshal(v, &c) == nil && c.Owner != "" {
		return c.Owner, &c
	}
	return string(v), nil
}

// Announce writes the presence entry of caps.Owner and returns its
// revision.
func (l *Leases) Announce(ctx context.Context, caps Capabilities) (uint64, error) {
	owner := caps.Owner
	body, err := json.Marshal(caps)
	if err != nil {
		return 0, fmt.Errorf("announcing presence of %s: %w", owner, err)
	}
	// Expected-stream, so that no other stream takes a copy a push
	// consumer delivers on this subject (docs/architecture.md §5.6).
	msg := &nats.Msg{Subject: leasePrefix + presenceKeyPrefix + PresenceToken(owner), Data: body}
	ack, err := l.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(leaseStream))
	if err != nil {
		return 0, fmt.Errorf("announcing presence of %s: %w", owner, err)
	}
	return ack.Sequence, nil
}

// Withdraw removes a presence entry if it is still at revision rev (0:
// whatever its revision). Removing a removed entry is not an error.
func (l *Leases) Withdraw(ctx context.Context, token string, rev uint64) error {
	var opts []jetstream.KVDeleteOpt
	if rev > 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	err := l.kv.Purge(ctx, presenceKeyPrefix+token, opts...)
	if err != nil && !isWrongLastSeq(err) && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("withdrawing presence %s: %w", token, err)
	}
	return nil
}

// WatchPresence passes every presence entry, then every change to one,
// to fn until ctx ends or the watch ends (its connection closed), and
// returns why it ended.
func (l *Leases) WatchPresence(ctx context.Context, fn func(Presence)) error {
	w, err := l.kv.Watch(ctx, presenceKeyPrefix+"*")
	if err != nil {
		return fmt.Errorf("watching presence: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watching presence: the watch ended")
			}
			if e == nil {
				continue // the end of the initial values
			}
			p := Presence{Token: strings.TrimPrefix(e.Key(), presenceKeyPrefix), Revision: e.Revision()}
			if e.Operation() == jetstream.KeyValuePut {
				p.Owner, p.Caps = presenceOf(e.Value())
			}
			fn(p)
		}
	}
}

// Workers returns the presence entries there are now: the workers that
// announced themselves and were not withdrawn (a worker killed a moment
// ago may still be among them; PresenceSubject answers whether it lives).
func (l *Leases) Workers(ctx context.Context) ([]Presence, error) {
	w, err := l.kv.Watch(ctx, presenceKeyPrefix+"*", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("listing workers: %w", err)
	}
	var out []Presence
	err = eachCurrent(ctx, w, "workers", func(e jetstream.KeyValueEntry) (bool, error) {
		p := Presence{Token: strings.TrimPrefix(e.Key(), presenceKeyPrefix), Revision: e.Revision()}
		p.Owner, p.Caps = presenceOf(e.Value())
		out = append(out, p)
		return true, nil
	})
	return out, err
}

// HeldBy returns the leases owner holds now, read from the bucket's last
// values (one pass over the leases in flight).
func (l *Leases) HeldBy(ctx context.Context, owner string) ([]Lease, error) {
	w, err := l.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("listing the leases of %s: %w", owner, err)
	}
	var out []Lease
	err = eachCurrent(ctx, w, "the leases of "+owner, func(e jetstream.KeyValueEntry) (bool, error) {
		if strings.Contains(e.Key(), ".") || string(e.Value()) != owner {
			return true, nil // a presence entry, or someone else's lease
		}
		out = append(out, Lease{RunID: e.Key(), Owner: owner, Revision: e.Revision(), ttl: l.ttl})
		return e.Delta() != 0, nil
	})
	return out, err
}

// Revoke frees a lease another owner holds, if it is still at ls.Revision:
// it reports whether it did (false: the lease moved on, renewed, released
// or taken by someone else meanwhile). A survivor revokes the leases of a
// worker whose connection is gone; the journal's fencing keeps the run
// safe if that worker was only cut off.
func (l *Leases) Revoke(ctx context.Context, ls Lease) (bool, error) {
	err := l.kv.Purge(ctx, ls.RunID, jetstream.LastRevision(ls.Revision), jetstream.PurgeTTL(time.Minute))
	switch {
	case err == nil:
		return true, nil
	case isWrongLastSeq(err), errors.Is(err, jetstream.ErrKeyExists):
		return false, nil
	}
	return false, fmt.Errorf("revoking the lease on run %s: %w", ls.RunID, err)
}
