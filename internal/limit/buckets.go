package limit

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// MaxKeys bounds the buckets one Buckets holds, whatever its keys: a
// caller that names a new key per request (a client address, a body's
// by) cannot grow it without end.
const MaxKeys = 10_000

// Buckets is a token bucket per key, all of one Rate. A bucket that is
// full again holds nothing a new one would not, so it is forgotten first
// when MaxKeys are held; if none is, a tenth of them go (whoever loses
// its bucket starts again from a full one).
type Buckets struct {
	rate Rate
	now  func() time.Time

	mu sync.Mutex
	m  map[string]*rate.Limiter
}

// NewBuckets returns the buckets of r; now is the clock (time.Now when
// nil). A zero Rate allows everything.
func NewBuckets(r Rate, now func() time.Time) *Buckets {
	if now == nil {
		now = time.Now
	}
	return &Buckets{rate: r, now: now, m: map[string]*rate.Limiter{}}
}

// Rate returns the buckets' rate.
func (b *Buckets) Rate() Rate { return b.rate }

// Take spends one token of key's bucket and returns 0, or, when it has
// none, spends nothing and returns how long until it has one.
func (b *Buckets) Take(key string) time.Duration {
	if b == nil || b.rate.Off() {
		return 0
	}
	now := b.now()
	lim := b.bucket(key, now)
	if lim.AllowN(now, 1) {
		return 0
	}
	return untilOne(lim, now)
}

// Wait returns how long until key's bucket has a token (0: it has one
// now), spending nothing.
func (b *Buckets) Wait(key string) time.Duration {
	if b == nil || b.rate.Off() {
		return 0
	}
	now := b.now()
	b.mu.Lock()
	lim, ok := b.m[key]
	b.mu.Unlock()
	if !ok {
		return 0
	}
	return untilOne(lim, now)
}

// untilOne is how long until lim holds a whole token, rounded up to the
// millisecond.
func untilOne(lim *rate.Limiter, now time.Time) time.Duration {
	missing := 1 - lim.TokensAt(now)
	if missing <= 0 {
		return 0
	}
	// To the microsecond first: the float's last bits are no wait.
	d := time.Duration(missing / float64(lim.Limit()) * float64(time.Second)).Round(time.Microsecond)
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}

// bucket returns key's bucket, making it (full) if there is none.
func (b *Buckets) bucket(key string, now time.Time) *rate.Limiter {
	b.mu.Lock()
	defer b.mu.Unlock()
	if lim, ok := b.m[key]; ok {
		return lim
	}
	if len(b.m) >= MaxKeys {
		b.forget(now)
	}
	lim := rate.NewLimiter(rate.Limit(b.rate.perSecond()), b.rate.Burst)
	b.m[key] = lim
	return lim
}

// forget drops the buckets that are full again and, if that is not
// enough, a tenth of the others (any: map order), so the next MaxKeys/10
// new keys find room without another sweep.
func (b *Buckets) forget(now time.Time) {
	for k, lim := range b.m {
		if lim.TokensAt(now) >= float64(b.rate.Burst) {
			delete(b.m, k)
		}
	}
	for k := range b.m {
		if len(b.m) <= MaxKeys-MaxKeys/10 {
			return
		}
		delete(b.m, k)
	}
}

// size reports how many buckets are held (for tests).
func (b *Buckets) size() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}
