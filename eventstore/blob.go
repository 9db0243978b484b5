package eventstore

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/retry"
)

// Big values (docs/architecture.md §6.4): a step value longer than the
// store's blob threshold goes to the PAL_BLOBS object store, named by its
// sha256, and the event carries a reference (event.Externalize). Append
// puts the value before it publishes the event; Read and ReadAfter put
// values back (event.Resolve), checked against their hash. Watch, Scan and
// ReadAfterRefs give the messages as stored.
const (
	// BlobBucket is the object store of big step values.
	BlobBucket = "PAL_BLOBS"
	// BlobStream is the stream behind it.
	BlobStream = "OBJ_" + BlobBucket
	// DefaultBlobThreshold is the size above which a value is kept as a
	// blob (PAL_BLOB_THRESHOLD).
	DefaultBlobThreshold = 256 << 10
	// MinBlobThreshold is the smallest threshold a store takes.
	MinBlobThreshold = 1 << 10
)

// WithBlobThreshold sets the size in bytes above which a step value is kept
// in PAL_BLOBS (default DefaultBlobThreshold; at least MinBlobThreshold, at
// most a quarter of the journal's message size, so that a packed message
// of a few events still fits).
func WithBlobThreshold(n int) Option { return func(s *Store) { s.blobThreshold = n } }

// BlobThreshold is the size above which the store keeps a value as a blob.
func (s *Store) BlobThreshold() int { return s.blobThreshold }

// MaxValueBytes is the largest step value the store can journal.
func (s *Store) MaxValueBytes() int { return event.MaxBlobBytes }

func (s *Store) clampBlobThreshold() {
	if s.blobThreshold <= 0 {
		s.blobThreshold = DefaultBlobThreshold
	}
	s.blobThreshold = max(s.blobThreshold, MinBlobThreshold)
	if s.maxMsg > 0 {
		s.blobThreshold = min(s.blobThreshold, s.maxMsg/4)
	}
}

// blobStore opens PAL_BLOBS on first use: most processes never need it.
func (s *Store) blobStore(ctx context.Context) (jetstream.ObjectStore, error) {
	return s.blobs.get(func() (jetstream.ObjectStore, error) {
		obs, err := s.js.ObjectStore(ctx, BlobBucket)
		if err != nil {
			return nil, fmt.Errorf("opening object store %s: %w", BlobBucket, err)
		}
		return obs, nil
	})
}

// externalize returns the events as they are stored: each big value
// replaced by its reference, and put in PAL_BLOBS first. A value already
// there (same hash) is not put again. Each blob an event names is
// referenced for its run first (blobref.go). A crash after the put and
// before the append leaves an object and a reference that no event names;
// it is harmless, and retention does not find it.
func (s *Store) externalize(ctx context.Context, evs []event.Event) ([]event.Event, error) {
	var out []event.Event
	for i, ev := range evs {
		st, values, err := event.Externalize(ev, s.blobThreshold)
		if err != nil {
			return nil, fmt.Errorf("%w: run %s seq %d: %v", ErrPayloadTooLarge, ev.RunID, ev.Seq, err)
		}
		if values == nil && !bytes.Contains(ev.Data, []byte(event.BlobSuffix)) {
			if out != nil {
				out[i] = ev
			}
			continue
		}
		// Referenced first, then put (blobref.go): so a release of the
		// same blob either sees the reference or is waited out.
		// A malformed reference is the reader's to refuse (event.ErrBlob);
		// it names no blob to keep.
		var named event.BlobSet
		if named.Add([]event.Event{st}, 0) == nil && len(named.Uses) > 0 {
			if err := s.refBlobs(ctx, ev.RunID, named.Sums()); err != nil {
				return nil, fmt.Errorf("appending to run %s: %w", ev.RunID, err)
			}
		}
		if values == nil {
			if out != nil {
				out[i] = ev
			}
			continue
		}
		if out == nil {
			out = append([]event.Event(nil), evs...)
		}
		for _, value := range values {
			if err := s.putBlob(ctx, value); err != nil {
				return nil, fmt.Errorf("appending to run %s: %w", ev.RunID, err)
			}
		}
		out[i] = st
	}
	if out == nil {
		return evs, nil
	}
	return out, nil
}

func (s *Store) putBlob(ctx context.Context, value []byte) (err error) {
	obs, err := s.blobStore(ctx)
	if err != nil {
		return err
	}
	name := event.BlobSum(value)
	// The put always asks the server: a cached value may have been
	// removed from the bucket since.
	defer func() {
		if err == nil {
			s.blobCache.add(name, value)
		}
	}()
	return retry.Do(ctx, jsRetry, func() error {
		pctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		there, err := s.blobStored(pctx, name, len(value))
		if err != nil {
			return blobErr("looking up", name, err)
		}
		if there {
			return nil // content-addressed: already there
		}
		_, err = obs.Put(pctx, jetstream.ObjectMeta{Name: name}, bytes.NewReader(value))
		return blobErr("putting", name, err)
	})
}

// blobStored reports whether PAL_BLOBS holds object name of size bytes,
// asking the stream's leader: a follower answering a Direct Get (as
// ObjectStore.GetInfo asks) may not have seen a release delete it yet
// (blobref.go), and a writer that trusted it would name a blob that is
// gone.
func (s *Store) blobStored(ctx context.Context, name string, size int) (bool, error) {
	req, err := json.Marshal(struct {
		LastBySubj string `json:"last_by_subj"`
	}{"$O." + BlobBucket + ".M." + base64.URLEncoding.EncodeToString([]byte(name))})
	if err != nil {
		return false, err
	}
	msg, err := s.js.Conn().RequestWithContext(ctx, s.apiPrefix+"STREAM.MSG.GET."+BlobStream, req)
	if err != nil {
		return false, err
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Data []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return false, fmt.Errorf("reading the answer of %s: %w", msg.Subject, err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return false, nil
		}
		return false, resp.Error
	}
	if resp.Message == nil {
		return false, errors.New("a message get answered neither a message nor an error")
	}
	var info jetstream.ObjectInfo
	if err := json.Unmarshal(resp.Message.Data, &info); err != nil {
		return false, fmt.Errorf("reading object %s's meta: %w", name, err)
	}
	return !info.Deleted && info.Size == uint64(size), nil
}

// blobErr wraps err, marking it permanent unless it is transient.
func blobErr(what, name string, err error) error {
	if err == nil {
		return nil
	}
	err = fmt.Errorf("%s blob %s in %s: %w", what, name, BlobBucket, err)
	if !transient(err) && !errors.Is(err, context.DeadlineExceeded) {
		return retry.Permanent(err)
	}
	return err
}

// blobCacheBytes bounds the values a store keeps after reading or putting
// them: a value is immutable under its hash, so a run read again (GET
// /v1/runs/{id} polled by a page) costs no second fetch.
const blobCacheBytes = 32 << 20

// blobCache holds verified values by hash, least recently used first out.
type blobCache struct {
	mu    sync.Mutex
	lru   *simplelru.LRU[string, []byte]
	bytes int
}

func newBlobCache() *blobCache {
	c := &blobCache{}
	c.lru, _ = simplelru.NewLRU(4096, func(_ string, v []byte) { c.bytes -= len(v) })
	return c
}

func (c *blobCache) get(sum string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Get(sum)
}

// add keeps value, which must be the bytes of sum; one larger than a
// quarter of the budget is not kept.
func (c *blobCache) add(sum string, value []byte) {
	if len(value) > blobCacheBytes/4 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lru.Contains(sum) {
		return
	}
	c.lru.Add(sum, value)
	c.bytes += len(value)
	for c.bytes > blobCacheBytes {
		c.lru.RemoveOldest()
	}
}

// resolve puts back the values of the references in evs, in place. A
// reference that is malformed, names no object, or whose object's bytes
// do not hash to it is refused (event.ErrBlob).
func (s *Store) resolve(ctx context.Context, evs []event.Event) error {
	for i, ev := range evs {
		type fetched struct {
			sum   string
			value []byte
		}
		var got []fetched // cached once Resolve verified them
		var err error
		evs[i], err = event.Resolve(ev, func(ref event.BlobRef) ([]byte, error) {
			if v, ok := s.blobCache.get(ref.Blob); ok {
				return v, nil
			}
			v, err := s.getBlob(ctx, ref)
			if err != nil {
				return nil, fmt.Errorf("reading run %s seq %d: %w", ev.RunID, ev.Seq, err)
			}
			got = append(got, fetched{ref.Blob, v})
			return v, nil
		})
		if err != nil {
			return err
		}
		for _, g := range got {
			s.blobCache.add(g.sum, g.value)
		}
	}
	return nil
}

// ResolveBlobs puts back the values of the references in evs, in place,
// as Read does (for readers of Scan, the projector).
func (s *Store) ResolveBlobs(ctx context.Context, evs []event.Event) error {
	return s.resolve(ctx, evs)
}

// Blob returns the bytes of the object ref names in PAL_BLOBS (for
// pal run export --blobs, which archives the values a journal names).
// The object's size is checked before it is read (at most
// event.MaxBlobBytes) and its bytes against the sha256 after; an object that is missing or does not match is refused
// with event.ErrBlob, and other errors are NATS's.
func (s *Store) Blob(ctx context.Context, ref event.BlobRef) ([]byte, error) {
	if ref.Size <= 0 || ref.Size > event.MaxBlobBytes {
		return nil, fmt.Errorf("%w: blob %.80q of %d bytes (want 1 to %d bytes)", event.ErrBlob, ref.Blob, ref.Size, event.MaxBlobBytes)
	}
	value, err := s.getBlob(ctx, ref)
	if err != nil {
		return nil, err
	}
	if !ref.Holds(value) {
		return nil, fmt.Errorf("%w: the stored bytes of blob %s do not match its hash", event.ErrBlob, ref.Blob)
	}
	return value, nil
}

func (s *Store) getBlob(ctx context.Context, ref event.BlobRef) ([]byte, error) {
	obs, err := s.blobStore(ctx)
	if err != nil {
		return nil, err
	}
	return retry.Value(ctx, jsRetry, func() ([]byte, error) {
		gctx, cancel := context.WithTimeout(ctx, s.timeout)
		defer cancel()
		info, err := obs.GetInfo(gctx, ref.Blob)
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			return nil, retry.Permanent(fmt.Errorf("%w: blob %s is not in %s", event.ErrBlob, ref.Blob, BlobBucket))
		}
		if err != nil {
			return nil, blobErr("looking up", ref.Blob, err)
		}
		// The size is checked before anything is read: a forged object
		// cannot make the reader hold more than the reference says.
		if info.Size != uint64(ref.Size) {
			return nil, retry.Permanent(fmt.Errorf("%w: blob %s is %d bytes, its reference says %d", event.ErrBlob, ref.Blob, info.Size, ref.Size))
		}
		r, err := obs.Get(gctx, ref.Blob)
		if err != nil {
			return nil, blobErr("reading", ref.Blob, err)
		}
		defer r.Close()
		value, err := io.ReadAll(io.LimitReader(r, ref.Size+1))
		if err != nil {
			return nil, blobErr("reading", ref.Blob, err)
		}
		return value, nil // the caller checks the hash
	})
}
