package workers

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Settings of model calls.
const (
	// EnvProviderConcurrency names the per-provider, per-model limits of
	// model calls in flight in one worker (ParseProviderConcurrency).
	EnvProviderConcurrency = "PAL_PROVIDER_CONCURRENCY"
	// EnvRetryAfterMax names the cap on the wait a provider may ask for.
	EnvRetryAfterMax = "PAL_RETRY_AFTER_MAX"
	// DefaultRetryAfterMax is that cap when the setting is unset.
	DefaultRetryAfterMax = 60 * time.Second
)

// maxConcurrencyEntries bounds the setting: a handful of providers and
// models, not a table.
const maxConcurrencyEntries = 64

// ParseProviderConcurrency reads PAL_PROVIDER_CONCURRENCY:
// comma-separated name=N pairs, where name is a provider ("openai") or a
// provider and a model ("openai/gpt-4o") and N ≥ 1 is how many calls to it
// may be in flight at once in one worker. "" is no limit.
func ParseProviderConcurrency(s string) (map[string]int, error) {
	out := map[string]int{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	parts := strings.Split(s, ",")
	if len(parts) > maxConcurrencyEntries {
		return nil, fmt.Errorf("%s has %d entries, at most %d are allowed", EnvProviderConcurrency, len(parts), maxConcurrencyEntries)
	}
	for _, part := range parts {
		name, n, ok := strings.Cut(strings.TrimSpace(part), "=")
		name = strings.TrimSpace(name)
		v, err := strconv.Atoi(strings.TrimSpace(n))
		if !ok || name == "" || err != nil || v < 1 || v > 1<<20 {
			return nil, fmt.Errorf("%s: %q is not provider=N or provider/model=N with N ≥ 1 (example: openai=16,anthropic=8,openai/gpt-4o=4)",
				EnvProviderConcurrency, part)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("%s names %q twice", EnvProviderConcurrency, name)
		}
		out[name] = v
	}
	return out, nil
}

// slots are the concurrency limits of model calls: one semaphore per
// configured provider or provider/model. Their keys are fixed at start, so
// the map is read without a lock.
type slots struct {
	sem map[string]chan struct{}
}

func newSlots(limits map[string]int) *slots {
	s := &slots{sem: make(map[string]chan struct{}, len(limits))}
	for k, n := range limits {
		s.sem[k] = make(chan struct{}, n)
	}
	return s
}

// acquire waits for a slot of the provider's limit and then of the
// model's (always in that order, so two calls never hold one each and wait
// for the other's), and returns the function that frees them. It returns
// ctx's cause if ctx ends first.
func (s *slots) acquire(ctx context.Context, prov, model string) (func(), error) {
	var held []chan struct{}
	release := func() {
		for _, c := range held {
			<-c
		}
	}
	for _, key := range []string{prov, prov + "/" + model} {
		c, ok := s.sem[key]
		if !ok {
			continue
		}
		select {
		case c <- struct{}{}:
			held = append(held, c)
		case <-ctx.Done():
			release()
			return nil, context.Cause(ctx)
		}
	}
	return release, nil
}
