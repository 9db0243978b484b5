package eventstore

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/retry"
)

// Blob references (docs/architecture.md §6.4, §13.1). PAL_BLOBS is keyed
// by content, so one object may serve many runs; PAL_BLOB_REFS says which.
// A run that names a blob has an empty message on
// pal.blobref.<sha256>.<run_id>, written before the blob is put and its
// event appended. Retention releases a removed run's references
// (ReleaseBlobs) and deletes an object once no run references it.
//
// A release and a writer of the same blob race, so both write before they
// read, on one stream read from its leader (no Direct Get). A release
// first marks the blob (pal.blobreclaim.<sha256>, a create with a TTL),
// then drops its reference, then looks for others, and only then deletes
// the object and the mark. A writer first writes its reference, then
// waits while the blob is marked, then puts the blob unless it is there.
// Either the release sees the writer's reference and keeps the object, or
// the writer sees the mark and, once it goes, finds the object gone and
// puts it again.
const (
	// BlobRefsStream holds the references and the release marks.
	BlobRefsStream = "PAL_BLOB_REFS"
	// BlobRefPrefix starts a reference's subject:
	// pal.blobref.<sha256>.<run_id>.
	BlobRefPrefix = "pal.blobref."
	// BlobReclaimPrefix starts a release mark's subject:
	// pal.blobreclaim.<sha256>.
	BlobReclaimPrefix = "pal.blobreclaim."
)

// reclaimTTL is how long a release mark lives: the server removes the
// mark of a release that died, so writers wait at most this long. A
// release that took half of it deletes nothing (its mark may be about to
// go, and a writer past it).
const reclaimTTL = time.Minute

// A writer looks again at a marked blob after reclaimPoll, twice as
// long each time up to reclaimPollMax: a release takes a few round trips,
// a dead one's mark a minute.
const (
	reclaimPoll    = 20 * time.Millisecond
	reclaimPollMax = 500 * time.Millisecond
)

func blobRefSubject(sum, runID string) string { return BlobRefPrefix + sum + "." + runID }

// blobRefs opens PAL_BLOB_REFS on first use.
func (s *Store) blobRefs(ctx context.Context) (jetstream.Stream, error) {
	return s.refs.get(func() (jetstream.Stream, error) {
		st, err := s.js.Stream(ctx, BlobRefsStream)
		if err != nil {
			return nil, fmt.Errorf("opening stream %s: %w", BlobRefsStream, err)
		}
		return st, nil
	})
}

// refBlobs records that runID names the blobs sums, then waits until
// none of them is being released.
func (s *Store) refBlobs(ctx context.Context, runID string, sums []string) error {
	st, err := s.blobRefs(ctx)
	if err != nil {
		return err
	}
	for _, sum := range sums {
		msg := &nats.Msg{Subject: blobRefSubject(sum, runID)}
		if err := retry.Do(ctx, jsRetry, func() error {
			pctx, cancel := context.WithTimeout(ctx, s.timeout)
			defer cancel()
			_, err := s.js.PublishMsg(pctx, msg, jetstream.WithExpectStream(BlobRefsStream))
			return blobErr("referencing", sum, err)
		}); err != nil {
			return err
		}
	}
	for _, sum := range sums {
		if err := s.awaitRelease(ctx, st, sum); err != nil {
			return err
		}
	}
	return nil
}

// awaitRelease returns once blob sum carries no release mark.
func (s *Store) awaitRelease(ctx context.Context, st jetstream.Stream, sum string) error {
	for wait := reclaimPoll; ; wait = min(2*wait, reclaimPollMax) {
		err := retry.Do(ctx, jsRetry, func() error {
			gctx, cancel := context.WithTimeout(ctx, s.timeout)
			defer cancel()
			_, err := st.GetLastMsgForSubject(gctx, BlobReclaimPrefix+sum)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				return nil
			}
			if err == nil {
				return retry.Permanent(errReleasing)
			}
			return blobErr("checking", sum, err)
		})
		if !errors.Is(err, errReleasing) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the release of blob %s: %w", sum, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// errReleasing says a blob carries a release mark.
var errReleasing = errors.New("blob is being released")

// BlobsOf lists the blobs a run's journal names, from its messages as
// stored (no blob is read). Retention takes them before it purges the
// journal and releases them after (ReleaseBlobs).
func (s *Store) BlobsOf(ctx context.Context, runID string) ([]string, error) {
	if err := checkRunID(runID); err != nil {
		return nil, fmt.Errorf("listing blobs: %w", err)
	}
	var set event.BlobSet
	msgs := 0
	err := s.Scan(ctx, runID, 0, 0, func(_ uint64, body []byte) {
		msgs++
		// A message that is not PAL's, or a malformed reference, names no
		// blob PAL can trust.
		if evs, err := event.Decode(body); err == nil {
			_ = set.Add(evs, msgs)
		}
	})
	if err != nil {
		return nil, err
	}
	return set.Sums(), nil
}

// ReleaseBlobs drops the run's references to the blobs sums and deletes
// each blob no other run references; it returns how many it deleted. A
// blob the run has no reference to (released already, or named before
// PAL kept references) is left: it may be named by other runs that have
// none either. It may be called again for the same blobs.
func (s *Store) ReleaseBlobs(ctx context.Context, runID string, sums []string) (int, error) {
	if err := checkRunID(runID); err != nil {
		return 0, fmt.Errorf("releasing blobs: %w", err)
	}
	if len(sums) == 0 {
		return 0, nil
	}
	st, err := s.blobRefs(ctx)
	if err != nil {
		return 0, err
	}
	deleted := 0
	for _, sum := range sums {
		if !event.IsBlobSum(sum) {
			return deleted, fmt.Errorf("releasing blobs of run %s: %q is not a blob name", runID, sum)
		}
		ok, err := s.releaseBlob(ctx, st, sum, runID)
		if err != nil {
			return deleted, fmt.Errorf("releasing blob %s of run %s: %w", sum, runID, err)
		}
		if ok {
			deleted++
		}
	}
	return deleted, nil
}

// releaseBlob drops runID's reference to blob sum and deletes the blob if
// no other run references it; true means it deleted it.
func (s *Store) releaseBlob(ctx context.Context, st jetstream.Stream, sum, runID string) (_ bool, err error) {
	own, err := st.GetLastMsgForSubject(ctx, blobRefSubject(sum, runID))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// Mark the blob: a create, so two releases of one blob take turns. The
	// mark's TTL runs from when the server stores it, so the clock starts
	// before the publish.
	marked := time.Now()
	mark, err := s.markRelease(ctx, st, sum)
	if err != nil {
		return false, err
	}
	keepMark := false
	defer func() {
		if keepMark {
			return
		}
		if derr := st.DeleteMsg(context.WithoutCancel(ctx), mark.Sequence); derr != nil && err == nil && !gone(derr) {
			err = fmt.Errorf("unmarking: %w", derr) // its TTL removes it anyway
		}
	}()
	if err := st.DeleteMsg(ctx, own.Sequence); err != nil && !gone(err) {
		return false, fmt.Errorf("dropping the reference: %w", err)
	}
	// Another reference? A Get, which only the leader answers (a stream
	// info may come from a follower while there is no leader).
	_, err = st.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(BlobRefPrefix+sum+".*"))
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, fmt.Errorf("looking for other references: %w", err)
	}
	if time.Since(marked) > reclaimTTL/2 {
		return false, nil
	}
	obs, err := s.blobStore(ctx)
	if err != nil {
		return false, err
	}
	dctx, cancel := context.WithDeadline(ctx, marked.Add(reclaimTTL*3/4))
	defer cancel()
	if err := obs.Delete(dctx, sum); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		// The delete may still land: the mark stays until its TTL, so no
		// writer takes the object for there meanwhile.
		keepMark = true
		return false, fmt.Errorf("deleting: %w", err)
	}
	return true, nil
}

// markRelease writes blob sum's release mark, waiting while another
// release holds it. A publish whose answer was lost is sent again under
// the same message id, which the server answers as the first.
func (s *Store) markRelease(ctx context.Context, st jetstream.Stream, sum string) (*jetstream.PubAck, error) {
	id := "reclaim-" + sum + "-" + rand.Text()
	for {
		var mark *jetstream.PubAck
		err := retry.Do(ctx, jsRetry, func() error {
			pctx, cancel := context.WithTimeout(ctx, s.timeout)
			defer cancel()
			var err error
			mark, err = s.js.PublishMsg(pctx, &nats.Msg{Subject: BlobReclaimPrefix + sum},
				jetstream.WithExpectStream(BlobRefsStream), jetstream.WithExpectLastSequencePerSubject(0),
				jetstream.WithMsgTTL(reclaimTTL), jetstream.WithMsgID(id))
			if err != nil && !transient(err) {
				return retry.Permanent(err)
			}
			return err
		})
		if err == nil {
			return mark, nil
		}
		if !isWrongLastSeq(err) {
			return nil, fmt.Errorf("marking: %w", err)
		}
		if err := s.awaitRelease(ctx, st, sum); err != nil {
			return nil, err
		}
	}
}

// gone reports a delete of a message that is no longer there (nats.go
// folds the server's "no message found" into ErrMsgDeleteUnsuccessful).
func gone(err error) bool {
	return errors.Is(err, jetstream.ErrMsgNotFound) ||
		(errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) && strings.Contains(err.Error(), "no message found"))
}
