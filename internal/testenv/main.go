package testenv

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Main is the TestMain of packages that use testenv:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// It runs the tests, stops and removes the PostgreSQL cluster started for
// them and the binaries built for them, then checks that no goroutine leaked
// (goleak, with opts) and exits with the right code.
func Main(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	stopShared()
	removeBuilds()
	if err := goleak.Find(opts...); err != nil {
		fmt.Fprintf(os.Stderr, "testenv: goroutines leaked: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
