package testenv

import (
	"net"
	"testing"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. The
// port is released before FreePort returns, so another process may take it
// in the meantime; callers that bind it should be ready to retry.
func FreePort(tb testing.TB) int {
	tb.Helper()
	port, err := freePort()
	if err != nil {
		tb.Fatalf("testenv: finding a free port: %v", err)
	}
	return port
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
