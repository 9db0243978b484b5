package event

import (
	"errors"
	"fmt"
)

// DefaultQueue is the work queue of a run whose workflow names none
// (docs/architecture.md §5.1): its work goes to pal.work.<run_id>.
const DefaultQueue = "default"

// MaxQueueLen bounds a queue name.
const MaxQueueLen = 32

// ErrInvalidQueue is returned for a queue name that is not a short
// lower-case NATS subject token.
var ErrInvalidQueue = errors.New("invalid queue name")

// ValidateQueue checks a work queue's name: 1 to 32 characters from
// a–z, 0–9, '_' and '-', starting with a letter or digit. The name is a
// token of the queue's work subject (pal.work.<queue>.<run_id>) and of its
// consumer's name, so nothing else is allowed.
func ValidateQueue(q string) error {
	if q == "" {
		return fmt.Errorf("%w: empty", ErrInvalidQueue)
	}
	if len(q) > MaxQueueLen {
		return fmt.Errorf("%w %q: longer than %d characters", ErrInvalidQueue, truncate(q), MaxQueueLen)
	}
	for i, r := range q {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
		case (r == '_' || r == '-') && i > 0:
		default:
			return fmt.Errorf("%w %q: character %q not allowed (use a-z, 0-9, '_' and '-', starting with a letter or digit)", ErrInvalidQueue, truncate(q), r)
		}
	}
	return nil
}

// QueueOr is q, or DefaultQueue when q is empty (a run created before
// queues, or on the default queue: run_created omits it).
func QueueOr(q string) string {
	if q == "" {
		return DefaultQueue
	}
	return q
}
