// Package natsraft sets the raft timing of the nats-server linked into this
// process: how often a JetStream group's leader sends heartbeats and how long
// a follower waits without one before it calls an election.
//
// nats-server v2.15.2 compiles these in (server/raft.go: a 1 s heartbeat and
// a 4–9 s election timeout) and offers no option for them, so a cluster of
// stock servers takes 4–9 s to replace a stream leader that was killed; no
// append to that stream can be acknowledged meanwhile. PAL's own nodes
// (pal dev --cluster, pal dev-nats-node, the test clusters) run with Fast,
// which replaces a killed leader in about a second. The values are set
// through go:linkname on the server package's variables, the same variables
// nats-server's own test suite lowers; they must be set before the server
// starts and hold for every server in the process.
package natsraft

import (
	"fmt"
	"time"
	_ "unsafe" // go:linkname

	_ "github.com/nats-io/nats-server/v2/server" // the variables below
)

//go:linkname hbInterval github.com/nats-io/nats-server/v2/server.hbInterval
var hbInterval time.Duration

//go:linkname minElectionTimeout github.com/nats-io/nats-server/v2/server.minElectionTimeout
var minElectionTimeout time.Duration

//go:linkname maxElectionTimeout github.com/nats-io/nats-server/v2/server.maxElectionTimeout
var maxElectionTimeout time.Duration

//go:linkname lostQuorumInterval github.com/nats-io/nats-server/v2/server.lostQuorumInterval
var lostQuorumInterval time.Duration

//go:linkname lostQuorumCheck github.com/nats-io/nats-server/v2/server.lostQuorumCheck
var lostQuorumCheck time.Duration

// Timing is a raft group's heartbeat and election timeout. A follower
// calls an election after a random wait in [MinElection, MaxElection)
// without hearing from its leader; a leader that has not heard from a
// quorum for 10 heartbeats steps down.
type Timing struct {
	Heartbeat   time.Duration
	MinElection time.Duration
	MaxElection time.Duration
}

// Stock is nats-server v2.15.2's own timing.
var Stock = Timing{Heartbeat: time.Second, MinElection: 4 * time.Second, MaxElection: 9 * time.Second}

// Fast is the timing of PAL's nodes: a killed leader is replaced 0.8–1.4 s
// after its last heartbeat. The election timeout stays at least four
// heartbeats, so a follower on a busy machine that misses one heartbeat
// does not depose a live leader.
var Fast = Timing{Heartbeat: 200 * time.Millisecond, MinElection: 800 * time.Millisecond, MaxElection: 1400 * time.Millisecond}

// Current returns the timing in force.
func Current() Timing {
	return Timing{Heartbeat: hbInterval, MinElection: minElectionTimeout, MaxElection: maxElectionTimeout}
}

// Set puts t in force for every raft group started after it. Call it before
// the first server starts.
func Set(t Timing) error {
	if t.Heartbeat <= 0 || t.MinElection < 4*t.Heartbeat || t.MaxElection <= t.MinElection {
		return fmt.Errorf("natsraft: timing %+v: want a heartbeat > 0, an election timeout of at least 4 heartbeats, max > min", t)
	}
	hbInterval = t.Heartbeat
	minElectionTimeout = t.MinElection
	maxElectionTimeout = t.MaxElection
	lostQuorumInterval = 10 * t.Heartbeat
	lostQuorumCheck = 10 * t.Heartbeat
	return nil
}
