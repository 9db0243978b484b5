package limit

import (
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// clock is a time the test steps.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestParseRate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want Rate
		str  string
	}{
		{"50/s", Rate{N: 50, Per: time.Second, Burst: 50}, "50/s"},
		{"50/s:500", Rate{N: 50, Per: time.Second, Burst: 500}, "50/s:500"},
		{" 10/m:20 ", Rate{N: 10, Per: time.Minute, Burst: 20}, "10/m:20"},
		{"3/h", Rate{N: 3, Per: time.Hour, Burst: 3}, "3/h"},
		{"5/10s", Rate{N: 5, Per: 10 * time.Second, Burst: 5}, "5/10s"},
		{"off", Rate{}, "off"},
		{"0", Rate{}, "off"},
	} {
		got, err := ParseRate(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, got, tc.in)
		require.Equal(t, tc.str, got.String(), tc.in)
		back, err := ParseRate(got.String())
		require.NoError(t, err)
		require.Equal(t, got, back, "String reads back")
	}
	for _, bad := range []string{"", "50", "x/s", "0/s", "-1/s", "50/fortnight", "50/s:0", "50/s:x", "50/0s", "2000000000/s"} {
		_, err := ParseRate(bad)
		require.Error(t, err, "%q", bad)
		require.Contains(t, err.Error(), "want N/unit", "%q: the error says what to write", bad)
	}
}

// TestBuckets: a key spends its burst, is refused with the wait until its
// next token, gets it after that wait; keys do not share; a refusal
// spends nothing.
func TestBuckets(t *testing.T) {
	t.Parallel()
	c := newClock()
	b := NewBuckets(Rate{N: 2, Per: time.Second, Burst: 3}, c.now)
	for i := range 3 {
		require.Zero(t, b.Take("a"), "burst request %d", i)
	}
	require.Equal(t, 500*time.Millisecond, b.Take("a"), "2 a second: the next token in 500ms")
	require.Equal(t, 500*time.Millisecond, b.Wait("a"), "the refusal spent nothing")
	require.Zero(t, b.Take("b"), "another key has its own bucket")
	require.Zero(t, b.Wait("never-seen"))
	c.step(499 * time.Millisecond)
	require.Equal(t, time.Millisecond, b.Take("a"))
	c.step(time.Millisecond)
	require.Zero(t, b.Take("a"))
	require.Positive(t, b.Take("a"))

	off := NewBuckets(Rate{}, c.now)
	for range 10_000 {
		require.Zero(t, off.Take("a"), "the zero Rate limits nothing")
	}
	var none *Buckets
	require.Zero(t, none.Take("a"))
}

// TestBucketsBounded: keys without end (a client address each) hold at
// most MaxKeys buckets; full buckets go first, so a key that spent its
// tokens keeps its bucket while there are full ones to forget.
func TestBucketsBounded(t *testing.T) {
	t.Parallel()
	c := newClock()
	b := NewBuckets(Rate{N: 1, Per: time.Minute, Burst: 2}, c.now)
	for i := range MaxKeys - 1 {
		require.Zero(t, b.Wait("k"+strconv.Itoa(i)), "waiting makes no bucket")
		b.Take("k" + strconv.Itoa(i))
	}
	require.Equal(t, MaxKeys-1, b.size())
	c.step(time.Minute) // every bucket is full again
	require.Zero(t, b.Take("spender"))
	require.Zero(t, b.Take("spender"))
	require.Equal(t, MaxKeys, b.size())
	require.Zero(t, b.Take("one more"))
	require.Equal(t, 2, b.size(), "the full buckets went, the spender's stayed")
	require.Positive(t, b.Wait("spender"))

	// Every bucket spent: a tenth are forgotten at once, not one per key.
	d := NewBuckets(Rate{N: 1, Per: time.Hour, Burst: 1}, c.now)
	for i := range 3 * MaxKeys {
		d.Take("k" + strconv.Itoa(i))
		require.LessOrEqual(t, d.size(), MaxKeys)
	}
	d = NewBuckets(Rate{N: 1, Per: time.Hour, Burst: 1}, c.now)
	for i := range MaxKeys {
		d.Take("k" + strconv.Itoa(i))
	}
	require.Equal(t, MaxKeys, d.size())
	d.Take("one more")
	require.Equal(t, MaxKeys-MaxKeys/10+1, d.size())
}

func TestLimiter(t *testing.T) {
	t.Parallel()
	c := newClock()
	l := New(Limits{Starts: Rate{N: 1, Per: time.Second, Burst: 2}, Commands: Rate{N: 10, Per: time.Second, Burst: 1}, OpenStreams: 2}, c.now)
	require.NoError(t, l.Allow(Start, "ci"))
	require.NoError(t, l.Allow(Start, "ci"))
	err := l.Allow(Start, "ci")
	require.ErrorIs(t, err, ErrLimited)
	var le *Error
	require.ErrorAs(t, err, &le)
	require.Equal(t, time.Second, le.RetryAfter)
	require.Equal(t, 1, le.RetryAfterSeconds())
	require.Equal(t, "too many runs started (start, fork, retry) from ci (the limit is 1 a second, 2 at once): try again in 1s", err.Error())
	require.NoError(t, l.Allow(Start, "ana"), "another identity")
	require.NoError(t, l.Allow(Command, "ci"), "commands have their own bucket")
	err = l.Allow(Command, "ci")
	require.ErrorAs(t, err, &le)
	require.Equal(t, 100*time.Millisecond, le.RetryAfter)
	require.Equal(t, 1, le.RetryAfterSeconds(), "Retry-After rounds up")
	require.NoError(t, l.Allow(Stream, "ci"), "no stream rate: no limit")

	r1, err := l.OpenStream("ci")
	require.NoError(t, err)
	r2, err := l.OpenStream("ci")
	require.NoError(t, err)
	_, err = l.OpenStream("ci")
	require.ErrorIs(t, err, ErrLimited)
	require.ErrorAs(t, err, &le)
	require.True(t, le.Cap)
	require.Contains(t, err.Error(), "too many event streams open for ci (the limit is 2 at once)")
	_, err = l.OpenStream("ana")
	require.NoError(t, err)
	r1()
	r1() // once only
	r3, err := l.OpenStream("ci")
	require.NoError(t, err)
	_, err = l.OpenStream("ci")
	require.Error(t, err, "a second release of one stream frees nothing")
	r2()
	r3()
	l.mu.Lock()
	_, held := l.open["ci"]
	l.mu.Unlock()
	require.False(t, held, "nothing held, nothing kept")

	var none *Limiter
	require.NoError(t, none.Allow(Start, "ci"))
	release, err := none.OpenStream("ci")
	require.NoError(t, err)
	release()
	require.Zero(t, none.Limits())
	require.True(t, errors.Is(&Error{}, ErrLimited))
	require.Contains(t, (&Error{What: "x", Limit: "1 a second, 1 at once", RetryAfter: time.Second}).Error(), "from an unnamed caller")
}
