package testenv

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/palrun/pal/internal/sandbox"
)

// Main is the TestMain of packages that use testenv:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// First, when the test binary was started as one of a process step's
// sandbox processes, it is that process (sandbox.Init). Otherwise it runs
// the tests, stops and removes the PostgreSQL cluster started for
// them and the binaries built for them, then checks that no goroutine leaked
// (goleak, with opts) and exits with the right code.
func Main(m *testing.M, opts ...goleak.Option) {
	// Process steps re-execute the test binary for their sandbox: then it
	// is one of the sandbox's processes, not a test run.
	sandbox.Init()
	code := m.Run()
	stopShared()
	removeBuilds()
	// nats.go v1.55's ObjectStore.Put publishes its chunks on a JetStream
	// context of its own and removes that context's status listener when
	// it returns (jetstream/object.go, cleanupReplySub). When the removal
	// comes before the listener goroutine it started has read its channel
	// (publish.go, resetPendingAcksOnReconnect), the goroutine waits on a
	// nil channel for good. That is the library's, one per unlucky put;
	// PAL has no hold on it.
	opts = append(opts, goleak.IgnoreTopFunction("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"))
	// golang-lru v2.0.7's expirable LRU (a worker's folded-state cache)
	// expires entries from a goroutine it starts and never stops: the
	// library has no way to, "decided to add [it] in the version later
	// than v2". One per cache, waiting on a ticker.
	opts = append(opts, goleak.IgnoreTopFunction("github.com/hashicorp/golang-lru/v2/expirable.NewLRU[...].func1"))
	if err := goleak.Find(opts...); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: goroutines leaked: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
