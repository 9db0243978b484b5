package workers

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseProviderConcurrency(t *testing.T) {
	t.Parallel()
	m, err := ParseProviderConcurrency(" openai=16, anthropic=8 ,openai/gpt-4o=4")
	require.NoError(t, err)
	require.Equal(t, map[string]int{"openai": 16, "anthropic": 8, "openai/gpt-4o": 4}, m)
	m, err = ParseProviderConcurrency("")
	require.NoError(t, err)
	require.Empty(t, m)
	for _, bad := range []string{"openai", "openai=0", "openai=-1", "=3", "openai=x", "openai=1,openai=2", "openai=99999999999"} {
		_, err := ParseProviderConcurrency(bad)
		require.ErrorContains(t, err, EnvProviderConcurrency, bad)
	}
	long := "a=1"
	for i := 0; i < maxConcurrencyEntries; i++ {
		long += ",a=1"
	}
	_, err = ParseProviderConcurrency(long)
	require.ErrorContains(t, err, "at most")
}

// TestSlotsLimitProviderAndModel: a call takes a slot of its provider's
// limit and of its model's; a wait ends with its context.
func TestSlotsLimitProviderAndModel(t *testing.T) {
	t.Parallel()
	s := newSlots(map[string]int{"openai": 2, "openai/big": 1})
	ctx := context.Background()
	r1, err := s.acquire(ctx, "openai", "big")
	require.NoError(t, err)

	short, cancel := context.WithTimeoutCause(ctx, 50*time.Millisecond, errors.New("lease lost"))
	defer cancel()
	_, err = s.acquire(short, "openai", "big")
	require.EqualError(t, err, "lease lost", "the model's one slot is taken")

	r2, err := s.acquire(ctx, "openai", "small")
	require.NoError(t, err, "the provider has a second slot")
	short2, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	_, err = s.acquire(short2, "openai", "small")
	require.ErrorIs(t, err, context.DeadlineExceeded, "both provider slots are taken")

	r3, err := s.acquire(ctx, "anthropic", "any")
	require.NoError(t, err, "no limit for anthropic")
	r3()
	r1()
	r2()
	r4, err := s.acquire(ctx, "openai", "big")
	require.NoError(t, err, "released slots are free again")
	r4()
	require.Empty(t, s.sem["openai"])
}
