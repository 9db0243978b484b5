package provider_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/provider"
)

type class struct{ retryable, unknown, timeout bool }

func TestClassify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status int
		err    error
		want   class
	}{
		{"400", 400, errors.New("bad"), class{}},
		{"401", 401, errors.New("auth"), class{}},
		{"404", 404, errors.New("model"), class{}},
		{"422", 422, errors.New("schema"), class{}},
		{"408", 408, errors.New("slow"), class{retryable: true}},
		{"409 key in use", 409, errors.New("conflict"), class{retryable: true, unknown: true}},
		{"429", 429, errors.New("rate"), class{retryable: true}},
		{"500", 500, errors.New("oops"), class{retryable: true}},
		{"502", 502, errors.New("gateway"), class{retryable: true, unknown: true}},
		{"503", 503, errors.New("busy"), class{retryable: true}},
		{"504", 504, errors.New("gateway timeout"), class{retryable: true, unknown: true}},
		{"529", 529, errors.New("overloaded"), class{retryable: true}},
		{"deadline", 0, context.DeadlineExceeded, class{retryable: true, unknown: true, timeout: true}},
		{"client timeout", 0, &url.Error{Op: "Post", URL: "x", Err: os.ErrDeadlineExceeded}, class{retryable: true, unknown: true, timeout: true}},
		{"EOF", 0, &url.Error{Op: "Post", URL: "x", Err: io.EOF}, class{retryable: true, unknown: true}},
		{"unexpected EOF", 0, fmt.Errorf("error reading response body: %w", io.ErrUnexpectedEOF), class{retryable: true, unknown: true}},
		{"reset", 0, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, class{retryable: true, unknown: true}},
		{"refused", 0, &url.Error{Op: "Post", URL: "x", Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}, class{retryable: true}},
		{"dns", 0, &net.DNSError{Err: "no such host", Name: "api.example.test"}, class{retryable: true}},
		{"certificate", 0, &tls.CertificateVerificationError{Err: errors.New("unknown authority")}, class{}},
		{"not resent", 0, provider.ErrMaybeDelivered, class{retryable: true, unknown: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := provider.Classify("p", tt.status, tt.err)
			var pe *provider.Error
			require.ErrorAs(t, err, &pe)
			require.Equal(t, "p", pe.Provider)
			require.Equal(t, tt.status, pe.Status)
			require.Equal(t, tt.want, class{pe.Retryable, pe.Unknown, pe.Timeout})
			require.ErrorIs(t, err, tt.err)
		})
	}
}

func TestClassifyCanceled(t *testing.T) {
	t.Parallel()
	err := provider.Classify("p", 0, fmt.Errorf("calling: %w", context.Canceled))
	require.ErrorIs(t, err, context.Canceled)
	var pe *provider.Error
	require.ErrorAs(t, err, &pe)
	require.False(t, pe.Retryable)
	require.False(t, pe.Timeout)
}

func TestClassifyKeepsError(t *testing.T) {
	t.Parallel()
	require.NoError(t, provider.Classify("p", 0, nil))
	orig := &provider.Error{Provider: "q", Retryable: true}
	require.Same(t, orig, provider.Classify("p", 500, fmt.Errorf("wrapped: %w", orig)))
}

func TestAttemptError(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")

	t.Run("NilIsNil", func(t *testing.T) {
		t.Parallel()
		var a provider.Attempt
		require.NoError(t, a.Error("p", 0, nil))
	})

	t.Run("NeverSentIsPermanent", func(t *testing.T) {
		t.Parallel()
		var a provider.Attempt
		var pe *provider.Error
		require.ErrorAs(t, a.Error("p", 0, boom), &pe)
		require.Equal(t, class{}, class{pe.Retryable, pe.Unknown, pe.Timeout})
	})

	t.Run("NoConnectionIsNotUnknown", func(t *testing.T) {
		t.Parallel()
		var a provider.Attempt
		req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/", nil)
		_, err := a.Middleware(req, func(*http.Request) (*http.Response, error) { return nil, boom })
		var pe *provider.Error
		require.ErrorAs(t, a.Error("p", 0, err), &pe)
		require.Equal(t, class{retryable: true}, class{pe.Retryable, pe.Unknown, pe.Timeout})

		require.ErrorAs(t, a.Error("p", 0, context.DeadlineExceeded), &pe)
		require.Equal(t, class{retryable: true, timeout: true}, class{pe.Retryable, pe.Unknown, pe.Timeout})
	})

	t.Run("StatusWins", func(t *testing.T) {
		t.Parallel()
		var a provider.Attempt
		var pe *provider.Error
		require.ErrorAs(t, a.Error("p", 400, boom), &pe)
		require.Equal(t, 400, pe.Status)
		require.False(t, pe.Retryable)
	})
}
