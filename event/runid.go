package event

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
)

// MaxRunIDLen bounds run ids so subjects and keys stay short.
const MaxRunIDLen = 128

// ErrInvalidRunID is wrapped by every error of ValidateRunID.
var ErrInvalidRunID = errors.New("invalid run id")

// NewRunID returns a fresh run id: "run_" followed by a ULID, so ids sort by
// creation time and are safe as a NATS subject token.
func NewRunID() string {
	return "run_" + ulid.MustNew(ulid.Timestamp(time.Now()), rand.Reader).String()
}

// ChildRunID derives a child run's id from its parent run and the parent's
// step, so a re-driven parent finds the child it created before a crash.
func ChildRunID(parentRunID, parentStepID string) string {
	sum := sha256.Sum256([]byte(parentRunID + "|" + parentStepID))
	return fmt.Sprintf("run_c%x", sum[:13])
}

// ScheduleRunID derives the run id of schedule name's tick at tick (the
// time the tick was due, to the nanosecond, in UTC), so a tick fired twice
// (by two workers, or again after a crash) names one run, which is created
// once.
func ScheduleRunID(name string, tick time.Time) string {
	sum := sha256.Sum256([]byte("schedule|" + name + "|" + FormatTick(tick)))
	return fmt.Sprintf("run_s%x", sum[:13])
}

// FormatTick is how run_created's tick is written: RFC 3339 with
// nanoseconds, in UTC.
func FormatTick(tick time.Time) string { return tick.UTC().Format(time.RFC3339Nano) }

// ValidateRunID checks that id can be used as one NATS subject token and KV
// key: 1 to 128 characters from A–Z, a–z, 0–9, '_' and '-'. Anything else
// (dots, spaces, '*', '>') could widen a subject and is refused.
func ValidateRunID(id string) error {
	if reason := tokenProblem(id, MaxRunIDLen); reason != "" {
		return fmt.Errorf("%w%s", ErrInvalidRunID, reason)
	}
	return nil
}

// tokenProblem says what keeps id from being one subject token of at
// most max characters of A–Z, a–z, 0–9, '_' and '-' (": …"), or "".
func tokenProblem(id string, max int) string {
	if id == "" {
		return ": empty"
	}
	if len(id) > max {
		return fmt.Sprintf(" %q: longer than %d characters", truncate(id), max)
	}
	for _, r := range id {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
		default:
			return fmt.Sprintf(" %q: character %q not allowed (use letters, digits, '_' and '-'; "+
				"dots, spaces, '*' and '>' would change the NATS subject)", truncate(id), r)
		}
	}
	return ""
}

func truncate(s string) string {
	if len(s) > 40 {
		return strings.ToValidUTF8(s[:40], "") + "…"
	}
	return s
}
