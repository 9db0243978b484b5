package testenv_test

import (
	"context"
	"testing"
	"time"

	"github.com/palrun/pal/paltest/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// waitCtx bounds a wait in a test; the test fails rather than hangs.
func waitCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
