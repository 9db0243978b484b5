package sandbox_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/palrun/pal/internal/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.Init()
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goroutines leaked: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}
