package limit

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Rate is a token bucket: N requests each Per, and up to Burst at once
// (a caller that has been quiet may send Burst at once, then N each Per).
// The zero Rate is no limit.
type Rate struct {
	N     int
	Per   time.Duration
	Burst int
}

// Off reports whether r is no limit.
func (r Rate) Off() bool { return r.N <= 0 || r.Per <= 0 }

// perSecond is r's refill in tokens a second.
func (r Rate) perSecond() float64 { return float64(r.N) / r.Per.Seconds() }

// units are the ways a Rate's Per is written.
var units = []struct {
	name string
	d    time.Duration
}{{"s", time.Second}, {"m", time.Minute}, {"h", time.Hour}}

// String writes r as ParseRate reads it: "50/s:500", or "off".
func (r Rate) String() string {
	if r.Off() {
		return "off"
	}
	per := r.Per.String()
	for _, u := range units {
		if r.Per == u.d {
			per = u.name
		}
	}
	s := strconv.Itoa(r.N) + "/" + per
	if r.Burst != r.N {
		s += ":" + strconv.Itoa(r.Burst)
	}
	return s
}

// describe writes r for an error: "50 a second, 500 at once".
func (r Rate) describe() string {
	per := "every " + r.Per.String()
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{time.Second, "a second"}, {time.Minute, "a minute"}, {time.Hour, "an hour"}} {
		if r.Per == u.d {
			per = u.name
		}
	}
	return fmt.Sprintf("%d %s, %d at once", r.N, per, r.Burst)
}

// maxRateN bounds N and Burst, so no setting overflows a bucket.
const maxRateN = 1_000_000_000

// ParseRate reads a rate setting: "N/unit" or "N/unit:burst", the unit
// s, m or h (a second, a minute, an hour) or a duration such as 10s;
// without a burst it is N. "off" (or "0") is no limit.
func ParseRate(s string) (Rate, error) {
	s = strings.TrimSpace(s)
	if s == "off" || s == "0" {
		return Rate{}, nil
	}
	const want = `want N/unit or N/unit:burst, e.g. 50/s or 10/m:20 (unit s, m, h or a duration like 10s), or "off"`
	n, rest, ok := strings.Cut(s, "/")
	if !ok {
		return Rate{}, fmt.Errorf("%q: %s", s, want)
	}
	per, burst, hasBurst := strings.Cut(rest, ":")
	r := Rate{}
	var err error
	if r.N, err = strconv.Atoi(strings.TrimSpace(n)); err != nil || r.N < 1 || r.N > maxRateN {
		return Rate{}, fmt.Errorf("%q: the count must be a whole number from 1 to %d (%s)", s, maxRateN, want)
	}
	per = strings.TrimSpace(per)
	for _, u := range units {
		if per == u.name {
			r.Per = u.d
		}
	}
	if r.Per == 0 {
		if r.Per, err = time.ParseDuration(per); err != nil || r.Per < time.Millisecond {
			return Rate{}, fmt.Errorf("%q: unit %q: %s", s, per, want)
		}
	}
	r.Burst = r.N
	if hasBurst {
		if r.Burst, err = strconv.Atoi(strings.TrimSpace(burst)); err != nil || r.Burst < 1 || r.Burst > maxRateN {
			return Rate{}, fmt.Errorf("%q: the burst must be a whole number from 1 to %d (%s)", s, maxRateN, want)
		}
	}
	return r, nil
}
