package receipt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// ErrNotFound is returned by Store.Get for a run without a receipt.
var ErrNotFound = errors.New("no receipt for this run")

// maxReceipt bounds a stored receipt read back.
const maxReceipt = 16 << 10

// Store keeps receipts in the KV bucket PAL_RECEIPTS, keyed by run id.
type Store struct {
	kv     jetstream.KeyValue
	events *eventstore.Store
	now    func() time.Time
}

// Open binds the bucket, which eventstore.Setup creates. events is the
// journal Ensure reads; nil if only Get is used.
func Open(ctx context.Context, js jetstream.JetStream, events *eventstore.Store) (*Store, error) {
	kv, err := js.KeyValue(ctx, eventstore.ReceiptBucket)
	if err != nil {
		return nil, fmt.Errorf("opening KV bucket %s: %w", eventstore.ReceiptBucket, err)
	}
	return &Store{kv: kv, events: events, now: time.Now}, nil
}

// KV is the bucket, for a projection's watch.
func (s *Store) KV() jetstream.KeyValue { return s.kv }

// Get returns the receipt of runID, or ErrNotFound.
func (s *Store) Get(ctx context.Context, runID string) (*Receipt, error) {
	e, err := s.kv.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("reading the receipt of run %s: %w", runID, err)
	}
	return Decode(e.Value())
}

// Decode parses a stored receipt.
func Decode(b []byte) (*Receipt, error) {
	if len(b) > maxReceipt {
		return nil, fmt.Errorf("receipt is %d bytes; at most %d", len(b), maxReceipt)
	}
	var r Receipt
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decoding a receipt: %w", err)
	}
	return &r, nil
}

// Ensure returns the receipt of runID, signing and storing it with key
// if there is none, built from the run's journal, which it reads (Build).
// The store is a KV create: when two signers race (the worker that ended
// the run and the sweep), the first create wins and the other returns the
// stored receipt, so a run has one receipt. A run that has not ended
// returns ErrNotEnded.
func (s *Store) Ensure(ctx context.Context, key *Key, runID string) (*Receipt, error) {
	if r, err := s.Get(ctx, runID); !errors.Is(err, ErrNotFound) {
		return r, err
	}
	var msgs [][]byte
	var stamps []event.Stamp // only what PAL wrote is folded into a receipt
	err := s.events.ScanStamped(ctx, runID, 0, 0, func(_ uint64, body []byte, st event.Stamp) {
		if len(msgs) <= MaxMessages {
			msgs, stamps = append(msgs, body), append(stamps, st)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("reading the journal of run %s: %w", runID, err)
	}
	r, err := BuildStamped(runID, msgs, stamps)
	if err != nil {
		return nil, err
	}
	return s.Sign(ctx, key, r)
}

// Sign signs r, the unsigned receipt of its run's journal (Build, or
// Tally.Receipt by the worker that holds the journal's tally), with key
// and stores it by the same KV create as Ensure: if the run has a receipt
// already, Sign returns that one.
func (s *Store) Sign(ctx context.Context, key *Key, r *Receipt) (*Receipt, error) {
	if err := key.Sign(r, s.now()); err != nil {
		return nil, err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	if _, err := s.kv.Create(ctx, r.RunID, b); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return s.Get(ctx, r.RunID)
		}
		return nil, fmt.Errorf("storing the receipt of run %s: %w", r.RunID, err)
	}
	return r, nil
}
