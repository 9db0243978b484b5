// Package sdk is for programs that PAL runs as process steps (a workflow
// node of type "process"). It makes a program's own sub-steps durable:
//
//	out, err := sdk.Step(ctx, "fetch", func(ctx context.Context) (Page, error) {
//		return fetch(ctx, sdk.IdempotencyKey("fetch"))
//	})
//
// Step reports each sub-step to the worker running the program, which
// journals it (substep_started, substep_completed {name, output}). When
// the worker dies and another re-drives the step, the program starts over
// with PAL_RESUME=1; Step then returns the journaled output of every
// sub-step that had completed without calling its fn again, and runs the
// rest. A sub-step that was cut short runs again: IdempotencyKey gives it
// the same key as before, so a side effect it passes the key to happens
// once.
//
// Outside PAL (no PAL_REPORT_SOCKET), Step just calls fn.
//
// The package reads the environment PAL gives a process step:
// PAL_REPORT_SOCKET (the Unix socket of the worker's runtime endpoint,
// which only this process sees: holding it is the authority), PAL_STEP_ID,
// PAL_IDEMPOTENCY_KEY and PAL_RESUME. It imports nothing of PAL but the
// standard library.
package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"
)

// Resumed reports whether an earlier process of this step did not finish
// (PAL_RESUME=1): sub-steps it completed are journaled and Step skips
// them.
func Resumed() bool { return os.Getenv("PAL_RESUME") == "1" }

// IdempotencyKey is the key of sub-step name: the step attempt's key
// (PAL_IDEMPOTENCY_KEY), a slash, and name. It is the same in every
// process of the step's attempt, so a sub-step run again after a crash
// passes the same key to what it calls.
func IdempotencyKey(name string) string {
	return os.Getenv("PAL_IDEMPOTENCY_KEY") + "/" + name
}

// Step runs sub-step name once across the processes of a step: if the
// journal holds its output, Step decodes that into T and returns it
// without calling fn; otherwise it reports the sub-step started, runs
// fn, and reports it completed with fn's output (JSON-encoded). An error
// from fn is returned as it is and nothing is journaled for it.
func Step[T any](ctx context.Context, name string, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	c := current()
	if c == nil {
		return fn(ctx)
	}
	if raw, ok, err := c.completed(ctx, name); err != nil {
		return zero, err
	} else if ok {
		var v T
		if err := json.Unmarshal(raw, &v); err != nil {
			return zero, fmt.Errorf("pal sdk: decoding the journaled output of sub-step %q: %w", name, err)
		}
		return v, nil
	}
	if raw, done, err := c.report(ctx, name, "started", nil); err != nil {
		return zero, err
	} else if done {
		var v T
		if err := json.Unmarshal(raw, &v); err != nil {
			return zero, fmt.Errorf("pal sdk: decoding the journaled output of sub-step %q: %w", name, err)
		}
		return v, nil
	}
	v, err := fn(ctx)
	if err != nil {
		return zero, err
	}
	out, err := json.Marshal(v)
	if err != nil {
		return zero, fmt.Errorf("pal sdk: encoding the output of sub-step %q: %w", name, err)
	}
	if _, _, err := c.report(ctx, name, "completed", out); err != nil {
		return zero, err
	}
	return v, nil
}

// client talks to the worker's runtime endpoint over its Unix socket.
type client struct {
	stepID string
	http   *http.Client

	once sync.Once
	err  error
	mu   sync.Mutex
	done map[string]json.RawMessage
}

// The runtime endpoint's paths; the host of the URL is not used.
const (
	reportURL   = "http://pal/v1/runtime/report"
	substepsURL = "http://pal/v1/runtime/substeps"
)

var (
	clientOnce sync.Once
	theClient  *client
)

func current() *client {
	clientOnce.Do(func() {
		sock := os.Getenv("PAL_REPORT_SOCKET")
		if sock == "" {
			return
		}
		dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}
		theClient = &client{stepID: os.Getenv("PAL_STEP_ID"), done: map[string]json.RawMessage{},
			http: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: dial, Proxy: nil}}}
	})
	return theClient
}

// completed returns the journaled output of sub-step name, reading the
// step's completed sub-steps once per process.
func (c *client) completed(ctx context.Context, name string) (json.RawMessage, bool, error) {
	c.once.Do(func() {
		var body struct {
			Substeps []struct {
				Name   string          `json:"name"`
				Output json.RawMessage `json:"output"`
			} `json:"substeps"`
		}
		if c.err = c.do(ctx, http.MethodGet, substepsURL, nil, &body); c.err != nil {
			return
		}
		c.mu.Lock()
		for _, s := range body.Substeps {
			c.done[s.Name] = s.Output
		}
		c.mu.Unlock()
	})
	if c.err != nil {
		return nil, false, c.err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	raw, ok := c.done[name]
	return raw, ok, nil
}

// report journals a sub-step's start or completion. done reports that
// the sub-step was already completed; raw is then its journaled output.
func (c *client) report(ctx context.Context, name, status string, output json.RawMessage) (raw json.RawMessage, done bool, err error) {
	req := map[string]any{"step_id": c.stepID, "name": name, "status": status}
	if output != nil {
		req["output"] = output
	}
	var ans struct {
		Completed bool            `json:"completed"`
		Output    json.RawMessage `json:"output"`
	}
	if err := c.do(ctx, http.MethodPost, reportURL, req, &ans); err != nil {
		return nil, false, err
	}
	if ans.Completed {
		c.mu.Lock()
		c.done[name] = ans.Output
		c.mu.Unlock()
	}
	return ans.Output, ans.Completed && status == "started", nil
}

func (c *client) do(ctx context.Context, method, url string, body, into any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return fmt.Errorf("pal sdk: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("pal sdk: %s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 8<<20)) // the worker answers at most 4 MiB of outputs
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pal sdk: %s %s: %s: %s", method, url, resp.Status, bytes.TrimSpace(b))
	}
	if err := json.Unmarshal(b, into); err != nil {
		return fmt.Errorf("pal sdk: %s %s: decoding the answer: %w", method, url, err)
	}
	return nil
}
