package workers

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/palrun/pal/eventstore"
)

// presenceProbeEvery is how often a worker probes each peer. A peer whose
// connection is gone is answered "no responders" by the server at once,
// so a kill -9 is noticed within this and its runs resumed straight after.
const presenceProbeEvery = 50 * time.Millisecond

// presenceProbeTimeout bounds one probe. A peer that does not answer in
// time (frozen, partitioned, slow) still holds its subscription and is
// left to its leases' TTL.
const presenceProbeTimeout = time.Second

// presence is a worker's side of instant takeover (docs/architecture.md
// §11): it answers probes on its presence subject, keeps its presence
// entry, probes its peers', and takes the leases of a peer whose
// connection is gone.
type presence struct {
	w     *Worker
	nc    *nats.Conn
	token string
	sub   *nats.Subscription
	wg    sync.WaitGroup

	mu    sync.Mutex
	peers map[string]*peer // token → peer
}

type peer struct {
	eventstore.Presence
	busy bool // a probe or a takeover is in progress
}

func (w *Worker) startPresence(ctx context.Context) (*presence, error) {
	nc := w.store.JetStream().Conn()
	p := &presence{w: w, nc: nc, token: eventstore.PresenceToken(w.owner), peers: map[string]*peer{}}
	sub, err := nc.Subscribe(eventstore.PresenceSubject(w.owner), func(m *nats.Msg) { _ = m.Respond(nil) })
	if err != nil {
		return nil, err
	}
	p.sub = sub
	// The server must know the subscription before peers learn of it,
	// or their first probe finds no responders.
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := w.leases.Announce(actx, w.owner); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		p.watch(ctx)
	}()
	go func() {
		defer p.wg.Done()
		p.probeLoop(ctx)
	}()
	return p, nil
}

// watch follows the presence entries. The worker's own entry, if a peer
// removed it (its connection dropped for a moment), is written again.
func (p *presence) watch(ctx context.Context) {
	for ctx.Err() == nil {
		err := p.w.leases.WatchPresence(ctx, func(e eventstore.Presence) {
			if e.Token == p.token {
				if e.Owner == "" {
					if _, err := p.w.leases.Announce(ctx, p.w.owner); err != nil && ctx.Err() == nil {
						p.w.log.Warn("announcing presence again", "err", err)
					}
				}
				return
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			if e.Owner == "" {
				delete(p.peers, e.Token)
				return
			}
			if pr := p.peers[e.Token]; pr != nil {
				pr.Presence = e
				return
			}
			p.peers[e.Token] = &peer{Presence: e}
		})
		if ctx.Err() == nil {
			// A stream update (another worker's Setup) or a reconnect
			// ends the watch; the next one reads every entry again.
			p.w.log.Debug("presence watch ended; watching again", "err", err)
			sleep(ctx, 100*time.Millisecond)
		}
	}
}

func (p *presence) probeLoop(ctx context.Context) {
	t := time.NewTicker(presenceProbeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		for _, pr := range p.peers {
			if pr.busy {
				continue
			}
			pr.busy = true
			e := pr.Presence
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.probe(ctx, e)
			}()
		}
		p.mu.Unlock()
	}
}

// probe asks whether a peer is there and takes over from it if its
// connection is gone.
func (p *presence) probe(ctx context.Context, e eventstore.Presence) {
	defer func() {
		p.mu.Lock()
		if pr := p.peers[e.Token]; pr != nil {
			pr.busy = false
		}
		p.mu.Unlock()
	}()
	pctx, cancel := context.WithTimeout(ctx, presenceProbeTimeout)
	_, err := p.nc.RequestWithContext(pctx, eventstore.PresencePrefix+e.Token, nil)
	cancel()
	if !errors.Is(err, nats.ErrNoResponders) {
		return // there, or not known to be gone
	}
	p.takeOver(ctx, e)
}

// takeOver revokes the leases a departed worker held and requeues their
// runs. Every survivor may try; each revocation is fenced on the lease's
// revision, so one survivor requeues each run.
func (p *presence) takeOver(ctx context.Context, e eventstore.Presence) {
	log := p.w.log.With("departed", e.Owner)
	held, err := p.w.leases.HeldBy(ctx, e.Owner)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("listing a departed worker's leases", "err", err)
		}
		return
	}
	n := 0
	for _, ls := range held {
		ok, err := p.w.leases.Revoke(ctx, ls)
		if err != nil {
			log.Warn("revoking a departed worker's lease", "run_id", ls.RunID, "err", err)
			continue
		}
		if !ok {
			continue
		}
		if err := p.w.store.Requeue(ctx, ls.RunID, "takeover"); err != nil {
			// The lease is free: the work message's redelivery or the
			// sweep drives the run.
			log.Warn("requeueing a departed worker's run", "run_id", ls.RunID, "err", err)
			continue
		}
		n++
	}
	if n > 0 {
		log.Info("took over the runs of a departed worker", "runs", n)
	}
	if err := p.w.leases.Withdraw(ctx, e.Token, e.Revision); err != nil && ctx.Err() == nil {
		log.Warn("removing a departed worker's presence", "err", err)
	}
}

// stop withdraws the worker's presence once its drives are over, after
// the context given to startPresence ended.
func (p *presence) stop(ctx context.Context) {
	p.wg.Wait()
	if err := p.w.leases.Withdraw(ctx, p.token, 0); err != nil {
		p.w.log.Warn("withdrawing presence", "err", err)
	}
	_ = p.sub.Unsubscribe()
}
