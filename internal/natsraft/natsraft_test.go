package natsraft

import (
	"testing"
	"time"
)

// TestSetReachesTheServer checks that the linknamed variables are the
// server's: Stock must read back as nats-server's compiled-in defaults
// before anything is set, and Set must change what Current reads.
func TestSetReachesTheServer(t *testing.T) {
	if got := Current(); got != Stock {
		t.Fatalf("nats-server's raft timing is %+v, not the %+v this package documents: the server changed its defaults", got, Stock)
	}
	t.Cleanup(func() {
		if err := Set(Stock); err != nil {
			t.Error(err)
		}
	})
	if err := Set(Fast); err != nil {
		t.Fatal(err)
	}
	if got := Current(); got != Fast {
		t.Fatalf("after Set(Fast): %+v", got)
	}
	if lostQuorumInterval != 10*Fast.Heartbeat || lostQuorumCheck != 10*Fast.Heartbeat {
		t.Fatalf("lost quorum %v / %v", lostQuorumInterval, lostQuorumCheck)
	}
}

func TestSetRefusesUnsafeTiming(t *testing.T) {
	for _, bad := range []Timing{
		{},
		{Heartbeat: time.Second, MinElection: 2 * time.Second, MaxElection: 3 * time.Second},
		{Heartbeat: 100 * time.Millisecond, MinElection: time.Second, MaxElection: time.Second},
	} {
		if err := Set(bad); err == nil {
			t.Errorf("Set(%+v) took it", bad)
		}
	}
	if got := Current(); got != Stock {
		t.Fatalf("a refused Set changed the timing: %+v", got)
	}
}
