package connectortest_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/palrun/pal/connector/connectortest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type testBundle struct {
	recv   *connectortest.Receiver
	client *http.Client
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &testBundle{recv: connectortest.NewReceiver(t), client: &http.Client{Transport: tr}}
}

// post sends a request with the given idempotency key and returns the status,
// or the error when no answer arrived.
func (b *testBundle) post(ctx context.Context, path, key, body string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.recv.URL()+path, strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Pal-Run-Id", "run_1")
	req.Header.Set("Pal-Step-Id", "notify")
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(answer), err
}

func byKey(key string) func(connectortest.Request) bool {
	return func(q connectortest.Request) bool { return q.IdempotencyKey == key }
}

func TestReceiverRecords(t *testing.T) {
	t.Parallel()
	b := setup(t)

	require.True(t, strings.HasPrefix(b.recv.URL(), "http://127.0.0.1:"), b.recv.URL())

	before := time.Now()
	status, answer, err := b.post(t.Context(), "/hooks/a", "k1", `{"n":1}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
	require.JSONEq(t, `{"received":true,"idempotency_key":"k1"}`, answer)
	_, _, err = b.post(t.Context(), "/hooks/b", "k1", `{"n":2}`)
	require.NoError(t, err)
	_, _, err = b.post(t.Context(), "/", "k2", ``)
	require.NoError(t, err)

	reqs := b.recv.Requests()
	require.Len(t, reqs, 3)
	first := reqs[0]
	require.Equal(t, http.MethodPost, first.Method)
	require.Equal(t, "/hooks/a", first.Path)
	require.Equal(t, "k1", first.IdempotencyKey)
	require.Equal(t, "run_1", first.RunID)
	require.Equal(t, "notify", first.StepID)
	require.Equal(t, "k1", first.Header.Get("Idempotency-Key"))
	require.Equal(t, `{"n":1}`, string(first.Body))
	require.False(t, first.At.Before(before))
	require.Equal(t, "/hooks/b", reqs[1].Path)
	require.Empty(t, reqs[2].Body)

	require.Equal(t, 2, b.recv.Count("k1"))
	require.Equal(t, 1, b.recv.Count("k2"))
	require.Zero(t, b.recv.Count("k3"))

	// Requests returns copies.
	reqs[0].Body[0] = 'X'
	reqs[0].Header.Set("Idempotency-Key", "changed")
	again := b.recv.Requests()
	require.Equal(t, `{"n":1}`, string(again[0].Body))
	require.Equal(t, "k1", again[0].Header.Get("Idempotency-Key"))
}

func TestReceiverFailNext(t *testing.T) {
	t.Parallel()
	b := setup(t)

	b.recv.FailNext(byKey("flaky"), http.StatusServiceUnavailable, 2)
	b.recv.FailNext(nil, http.StatusTooManyRequests, 1)

	status, _, err := b.post(t.Context(), "/", "steady", `{}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, status, "the catch-all rule hits the first other request")

	for range 2 {
		status, answer, err := b.post(t.Context(), "/", "flaky", `{}`)
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, status)
		require.Contains(t, answer, "injected failure")
	}
	status, _, err = b.post(t.Context(), "/", "flaky", `{}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, "the rule is used up")
	require.Equal(t, 3, b.recv.Count("flaky"), "failed requests are recorded too")
}

func TestReceiverDrop(t *testing.T) {
	t.Parallel()
	b := setup(t)

	b.recv.Drop(byKey("k"), 1)

	_, _, err := b.post(t.Context(), "/", "k", `{"n":1}`)
	require.Error(t, err, "a dropped request gets no answer")
	require.Equal(t, 1, b.recv.Count("k"), "the dropped request was recorded")
	require.Equal(t, `{"n":1}`, string(b.recv.Requests()[0].Body), "it was read whole before the drop")

	status, _, err := b.post(t.Context(), "/", "k", `{"n":1}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
}

func TestReceiverHold(t *testing.T) {
	t.Parallel()
	b := setup(t)

	hold := b.recv.Hold(byKey("slow"))

	type result struct {
		status int
		err    error
	}
	done := make(chan result, 1)
	go func() {
		status, _, err := b.post(context.WithoutCancel(t.Context()), "/slow", "slow", `{"n":1}`)
		done <- result{status, err}
	}()

	q, err := hold.Wait(t.Context())
	require.NoError(t, err)
	require.Equal(t, "slow", q.IdempotencyKey)
	require.Equal(t, "/slow", q.Path)
	require.Equal(t, 1, b.recv.Count("slow"), "recorded on arrival, while held")

	// Other requests pass.
	status, _, err := b.post(t.Context(), "/", "fast", `{}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)

	select {
	case r := <-done:
		t.Fatalf("held request answered before Release: %+v", r)
	default:
	}

	hold.Release()
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, http.StatusOK, r.status)

	// A released hold holds nothing more, and Release is idempotent.
	hold.Release()
	status, _, err = b.post(t.Context(), "/", "slow", `{}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status)
}

func TestReceiverHoldWaitQueuesArrivals(t *testing.T) {
	t.Parallel()
	b := setup(t)

	hold := b.recv.Hold(nil)
	defer hold.Release()

	var wg sync.WaitGroup
	for _, key := range []string{"a", "b"} {
		wg.Go(func() {
			_, _, _ = b.post(context.WithoutCancel(t.Context()), "/", key, `{}`)
		})
	}

	seen := map[string]bool{}
	for range 2 {
		q, err := hold.Wait(t.Context())
		require.NoError(t, err)
		seen[q.IdempotencyKey] = true
	}
	require.Equal(t, map[string]bool{"a": true, "b": true}, seen, "each Wait returns the next arrival")

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	_, err := hold.Wait(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded, "no third arrival")

	hold.Release()
	wg.Wait()
}

func TestReceiverHoldClientGivesUp(t *testing.T) {
	t.Parallel()
	b := setup(t)

	hold := b.recv.Hold(nil)
	defer hold.Release()

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, _, err := b.post(ctx, "/", "k", `{}`)
		done <- err
	}()
	_, err := hold.Wait(t.Context())
	require.NoError(t, err)
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	// The handler notices the client went away; Close (in cleanup) would
	// hang if it had not.
}

func TestReceiverCloseReleasesHeld(t *testing.T) {
	t.Parallel()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()

	recv, err := connectortest.StartReceiver()
	require.NoError(t, err)
	b := &testBundle{recv: recv, client: &http.Client{Transport: tr}}

	hold := recv.Hold(nil)
	done := make(chan error, 1)
	go func() {
		_, _, err := b.post(context.WithoutCancel(t.Context()), "/", "k", `{}`)
		done <- err
	}()
	_, err = hold.Wait(t.Context())
	require.NoError(t, err)

	recv.Close()
	require.Error(t, <-done, "a held request is cut when the receiver closes")
	recv.Close() // idempotent

	_, err = hold.Wait(t.Context())
	require.ErrorIs(t, err, connectortest.ErrClosed)
	require.Equal(t, 1, recv.Count("k"), "records survive Close")
}
