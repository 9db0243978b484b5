package eventstore

import (
	"errors"
	"fmt"
)

var (
	// ErrRunNotFound is returned when a run's subject holds no events.
	ErrRunNotFound = errors.New("run not found")
	// ErrConflict is matched by every *ConflictError.
	ErrConflict = errors.New("journal conflict")
	// ErrRunExists is returned when creating a run whose id is taken.
	ErrRunExists = errors.New("run already exists")
	// ErrPayloadTooLarge is returned for an event message larger than the
	// stream accepts.
	ErrPayloadTooLarge = errors.New("event payload too large")
	// ErrLeaseHeld is matched by *LeaseHeldError.
	ErrLeaseHeld = errors.New("lease held by another worker")
	// ErrLeaseLost is returned when a lease could not be renewed because
	// another owner took it or it expired.
	ErrLeaseLost = errors.New("lease lost")
)

// ConflictError reports a fenced append that lost: the run's journal moved
// past the head the writer stated.
type ConflictError struct {
	RunID string
	// Expected is the last seq the writer had seen.
	Expected uint64
	// Actual is the last seq on the subject.
	Actual uint64
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("appending to run %s: journal moved on (expected last seq %d, found %d)", e.RunID, e.Expected, e.Actual)
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// LeaseHeldError reports that another owner holds a run's lease.
type LeaseHeldError struct {
	RunID string
	Owner string
}

func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("lease on run %s held by %s", e.RunID, e.Owner)
}

// Is makes errors.Is(err, ErrLeaseHeld) true.
func (e *LeaseHeldError) Is(target error) bool { return target == ErrLeaseHeld }
