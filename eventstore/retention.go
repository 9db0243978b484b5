package eventstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
)

// BlobBucket is the object store that holds step payloads too big for
// an event (docs/architecture.md §5). Retention removes a finished run's
// objects from it; a server without it has no blobs to remove.
const BlobBucket = "PAL_BLOBS"

// PurgeJournal removes every message of the run's subject from
// PAL_EVENTS (a purge filtered on pal.events.<run_id>): retention's
// removal of a finished run's journal. Nothing else of the stream moves.
// Purging a run with no messages is not an error.
func (s *Store) PurgeJournal(ctx context.Context, runID string) error {
	if err := checkRunID(runID); err != nil {
		return fmt.Errorf("purging journal: %w", err)
	}
	if err := s.events.Purge(ctx, jetstream.WithPurgeSubject(EventsSubject(runID))); err != nil {
		return fmt.Errorf("purging the journal of run %s: %w", runID, err)
	}
	return nil
}

// ErrPurgeDenied is returned by CheckPurgeable for a PAL_EVENTS that
// denies purges: one made before retention existed, which JetStream cannot
// change.
var ErrPurgeDenied = errors.New(EventsStream + " denies purges (it was created by a PAL before retention); " +
	"JetStream cannot lift deny_purge: archive it (nats stream backup " + EventsStream + "), " +
	"then recreate it without deny_purge (nats stream restore of the backup with deny_purge false), or leave PAL_RETENTION unset")

// CheckPurgeable reports whether retention can purge journals.
// Errors: ErrPurgeDenied.
func (s *Store) CheckPurgeable(ctx context.Context) error {
	info, err := s.events.Info(ctx)
	if err != nil {
		return fmt.Errorf("reading %s: %w", EventsStream, err)
	}
	if info.Config.DenyPurge {
		return ErrPurgeDenied
	}
	return nil
}

// RemoveBlobs deletes the named objects from PAL_BLOBS and returns how
// many it deleted; names already gone count as removed by someone else
// and are skipped. With no PAL_BLOBS bucket it removes nothing.
func (s *Store) RemoveBlobs(ctx context.Context, names []string) (int, error) {
	if len(names) == 0 {
		return 0, nil
	}
	obs, err := s.js.ObjectStore(ctx, BlobBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("opening %s: %w", BlobBucket, err)
	}
	n := 0
	for _, name := range names {
		err := obs.Delete(ctx, name)
		switch {
		case err == nil:
			n++
		case errors.Is(err, jetstream.ErrObjectNotFound):
		default:
			return n, fmt.Errorf("deleting blob %s: %w", name, err)
		}
	}
	return n, nil
}

// maxBlobDepth bounds how deep BlobNames looks into an event's data.
const maxBlobDepth = 64

// BlobNames returns the blob objects the events name, each once, in the
// order first named: every JSON object in their data of the form
// {"blob": "<name>", "size": <n>, …}, the reference an event carries in
// place of a payload kept in PAL_BLOBS.
func BlobNames(evs []event.Event) []string {
	seen := map[string]bool{}
	var out []string
	var walk func(v any, depth int)
	walk = func(v any, depth int) {
		if depth > maxBlobDepth {
			return
		}
		switch v := v.(type) {
		case map[string]any:
			name, ok := v["blob"].(string)
			if _, sized := v["size"].(json.Number); ok && sized && name != "" && !seen[name] {
				seen[name] = true
				out = append(out, name)
			}
			for _, c := range v {
				walk(c, depth+1)
			}
		case []any:
			for _, c := range v {
				walk(c, depth+1)
			}
		}
	}
	for _, ev := range evs {
		if !bytes.Contains(ev.Data, []byte(`"blob"`)) {
			continue
		}
		dec := json.NewDecoder(bytes.NewReader(ev.Data))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) == nil {
			walk(v, 0)
		}
	}
	return out
}
