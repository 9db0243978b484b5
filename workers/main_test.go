package workers_test

import (
	"testing"

	"github.com/palrun/pal/internal/sandbox"
	"github.com/palrun/pal/paltest/testenv"
)

// TestMain runs the sandbox's processes when the test binary is started
// as one of them (process steps re-execute it), then the tests.
func TestMain(m *testing.M) {
	sandbox.Init()
	testenv.Main(m)
}
