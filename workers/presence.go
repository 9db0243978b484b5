package workers

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/palrun/pal/eventstore"
)

// presenceProbeEvery is how often a worker probes each peer. A peer whose
// connection is gone is answered "no responders" by the server at once,
// so a kill -9 is noticed within this and its runs resumed straight after.
// 25 ms, not 50: over 100 kills at random phases the takeover's p99 was
// 102-108 ms at 50 ms and 84-89 ms at 25 ms; a probe is two small messages
// (the probe and its empty answer), 80 a second from each worker to each peer.
const presenceProbeEvery = 25 * time.Millisecond

// A probe is a publish with a reply subject, not a request: nothing waits
// for its answer and nothing times out. A live peer answers (which says
// nothing more), a frozen one holds its subscription and stays silent
// (which says nothing either), and only a peer whose connection is gone
// makes the server send the status "no responders" to the reply subject,
// at once. So a probe in flight to a peer that dies never delays the
// next one: every peer is probed at every interval whatever is
// outstanding, and a peer killed while a probe waited in its socket is
// found gone by the next (docs/architecture.md §11.1).
const (
	statusHeader = "Status" // what nats.go's request reads, unexported there
	noResponders = "503"
)

// presence is a worker's side of instant takeover (docs/architecture.md
// §11): it answers probes on its presence subject, keeps its presence
// entry, probes its peers', and takes the leases of a peer whose
// connection is gone.
type presence struct {
	w     *Worker
	nc    *nats.Conn
	token string
	sub   *nats.Subscription // answers peers' probes
	// replies receives the server's answers to this worker's probes, on
	// inbox.<token>.<revision> of the entry probed; gone is where the
	// "no responders" among them go, to the probe loop.
	replies *nats.Subscription
	inbox   string
	gone    chan eventstore.Presence
	wg      sync.WaitGroup

	mu    sync.Mutex
	peers map[string]*peer // token → peer
}

type peer struct {
	eventstore.Presence
	taking bool // a takeover is in progress
}

func (w *Worker) startPresence(ctx context.Context) (*presence, error) {
	nc := w.store.JetStream().Conn()
	p := &presence{w: w, nc: nc, token: eventstore.PresenceToken(w.owner), inbox: nc.NewInbox(),
		gone: make(chan eventstore.Presence, 16), peers: map[string]*peer{}}
	sub, err := nc.Subscribe(eventstore.PresenceSubject(w.owner), func(m *nats.Msg) { _ = m.Respond(nil) })
	if err != nil {
		return nil, err
	}
	p.sub = sub
	if p.replies, err = nc.Subscribe(p.inbox+".*.*", p.reply); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	unsubscribe := func() {
		_ = sub.Unsubscribe()
		_ = p.replies.Unsubscribe()
	}
	// The server must know the subscription before peers learn of it,
	// or their first probe finds no responders.
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		unsubscribe()
		return nil, err
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := w.leases.Announce(actx, w.capabilities()); err != nil {
		unsubscribe()
		return nil, err
	}
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		p.watch(ctx)
	}()
	go func() {
		defer p.wg.Done()
		var ticks <-chan time.Time // probed by hand (tests): never
		if !w.probeByHand {
			t := time.NewTicker(presenceProbeEvery)
			defer t.Stop()
			ticks = t.C
		}
		p.probeLoop(ctx, ticks)
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
					if _, err := p.w.leases.Announce(ctx, p.w.capabilities()); err != nil && ctx.Err() == nil {
						p.w.log.Warn("announcing this worker's presence again failed; peers take its runs over by lease expiry until it succeeds", "err", err)
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

// probeLoop probes every peer on each tick and starts the takeover of
// each peer found gone.
func (p *presence) probeLoop(ctx context.Context, ticks <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
			p.probeAll()
		case e := <-p.gone:
			p.startTakeOver(ctx, e)
		}
	}
}

// probeAll sends one probe to each peer not being taken over, and returns
// how many it sent.
func (p *presence) probeAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, pr := range p.peers {
		if pr.taking {
			continue
		}
		reply := p.inbox + "." + pr.Token + "." + strconv.FormatUint(pr.Revision, 10)
		// A probe that cannot be sent (the connection is down) says
		// nothing of the peer; the next tick probes again.
		if p.nc.PublishRequest(eventstore.PresencePrefix+pr.Token, reply, nil) == nil {
			n++
		}
	}
	return n
}

// reply reads an answer to a probe: "no responders" says the peer's
// connection is gone. The reply subject names the entry probed, so an
// answer about an entry since written again (the same worker back after a
// reconnect) takes nothing over.
func (p *presence) reply(m *nats.Msg) {
	if len(m.Data) > 0 || m.Header.Get(statusHeader) != noResponders {
		return // there
	}
	token, rev, ok := strings.Cut(strings.TrimPrefix(m.Subject, p.inbox+"."), ".")
	if !ok {
		return
	}
	r, err := strconv.ParseUint(rev, 10, 64)
	if err != nil {
		return
	}
	p.mu.Lock()
	pr := p.peers[token]
	if pr == nil || pr.Revision != r {
		p.mu.Unlock()
		return
	}
	e := pr.Presence
	p.mu.Unlock()
	select {
	case p.gone <- e:
	default: // the loop is behind: the next tick's probe says it again
	}
}

// startTakeOver takes over from the peer of entry e, unless its entry
// changed since the probe or a takeover of it is under way.
func (p *presence) startTakeOver(ctx context.Context, e eventstore.Presence) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pr := p.peers[e.Token]
	if pr == nil || pr.Revision != e.Revision || pr.taking {
		return
	}
	pr.taking = true
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.takeOver(ctx, e)
		p.mu.Lock()
		defer p.mu.Unlock()
		if pr := p.peers[e.Token]; pr != nil {
			pr.taking = false
		}
	}()
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
		q, err := p.w.store.QueueOf(ctx, ls.RunID)
		if err == nil {
			err = p.w.store.Requeue(ctx, q, ls.RunID, "takeover")
		}
		if err != nil {
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
	_ = p.replies.Unsubscribe()
}

// capabilities is what this worker announces in its presence entry: its
// queues, its Go tools, its MCP servers and the programs its process
// steps may start (pal workers lists them).
func (w *Worker) capabilities() eventstore.Capabilities {
	c := eventstore.Capabilities{Owner: w.owner, WorkerID: w.cfg.ID, Queues: slices.Clone(w.cfg.Queues),
		Tools: slices.Sorted(maps.Keys(w.tools)), Started: w.startedAt}
	if w.cfg.Sandbox != nil {
		c.Programs = w.cfg.Sandbox.Programs()
	}
	if w.cfg.MCP != nil {
		c.MCP = slices.Sorted(maps.Keys(w.cfg.MCP.Servers))
	}
	return c
}
