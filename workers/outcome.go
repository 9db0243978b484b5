package workers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/telemetry"
)

// observeDrive is where a drive's end is measured: its trace ends with
// the outcome, and pal_drives_total and pal_drive_duration_seconds count
// it.
func observeDrive(d *drive, end driveEnd, start time.Time) {
	d.token.trace.End(end.outcome.String(), end.failure())
	telemetry.DriveEnded(end.outcome.String(), time.Since(start))
}

// driveOutcome is how a drive ended. classifyDrive decides it once; the
// dispositions table says what each one does with the work message and
// the lease.
type driveOutcome int

const (
	// driveDone: the run is terminal, or became so in this drive (a crash
	// loop fails it when resumed).
	driveDone driveOutcome = iota
	// driveParked: the run waits for an outside input (an approval, a child).
	driveParked
	// driveEnded: another writer ended the run (run_cancelled) meanwhile.
	driveEnded
	// driveNoJournal: work for a run that has no journal.
	driveNoJournal
	// driveJournalDue: a start's work message that came before its
	// run_created, which the start publishes beside it: look again
	// shortly (startlag.go).
	driveJournalDue
	// driveBroken: the journal does not fold (the run is failed with code
	// internal if it can be); driving it again would not help.
	driveBroken
	// driveStopping: the worker stops, or the caller's context ended:
	// hand the run to another worker at once.
	driveStopping
	// driveLeaseLost: the lease was lost or expired before it was renewed.
	driveLeaseLost
	// driveFenced: another worker resumed the run (a journal conflict).
	driveFenced
	// driveBusy: the lease could not be taken; another worker drives the run.
	driveBusy
	// driveCrashed: the drive panicked after its run_resumed was
	// journaled: the next drive counts it toward crash_loop.
	driveCrashed
	// drivePanicked: the drive panicked before that, where the journal
	// cannot count it: the work message counts its deliveries instead.
	drivePanicked
	// driveRetryLater: anything else (NATS unavailable for longer than the
	// retries, a bug): let go and have the run driven again after a TTL.
	driveRetryLater
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"done", "parked", "ended", "no_journal", "journal_due", "broken",
	"stopping", "lease_lost", "fenced", "busy", "crashed", "panicked", "retry_later"}

func (o driveOutcome) String() string {
	if o < 0 || o >= numOutcomes {
		return fmt.Sprintf("driveOutcome(%d)", int(o))
	}
	return outcomeNames[o]
}

// over reports whether the drive is done with the run's work: nothing
// to retry, the caller may look at the run.
func (o driveOutcome) over() bool {
	return dispositions[o].msg == ackMsg
}

// driveEnd is what is known when a drive ends.
type driveEnd struct {
	acquired bool  // the lease was taken and the run driven
	err      error // from acquire, or returned by the drive
	cause    error // why the drive's context was cancelled, if it was
	stopped  error // the caller's context's error, if it ended
	// journalDue: the work message is a start's, delivered few enough
	// times that its run_created may still be on the way (startMayLag).
	journalDue bool
	outcome    driveOutcome
}

// classifyDrive is the one place a drive's end becomes an outcome. The order
// matters: a drive that finished its work counts as finished even if a
// stop came just after.
func classifyDrive(e driveEnd) driveOutcome {
	if !e.acquired {
		if e.stopped != nil {
			return driveStopping
		}
		return driveBusy
	}
	err := e.err
	var pe *panicError
	switch {
	case errors.Is(e.cause, errRunEnded), errors.Is(err, errRunEnded):
		return driveEnded
	case errors.Is(err, eventstore.ErrRunNotFound):
		if e.journalDue {
			return driveJournalDue
		}
		return driveNoJournal
	case errors.Is(err, errParked):
		return driveParked
	case err == nil:
		return driveDone
	case errors.Is(err, errJournal):
		return driveBroken
	case errors.As(err, &pe):
		if pe.counted {
			return driveCrashed
		}
		return drivePanicked
	case errors.Is(e.cause, errShutdown), e.stopped != nil:
		return driveStopping
	case errors.Is(e.cause, errLeaseLost), errors.Is(e.cause, errLeaseExpired):
		return driveLeaseLost
	case errors.Is(e.cause, errOwnership), errors.Is(err, errOwnership):
		return driveFenced
	case errors.Is(err, errLeaseExpired):
		return driveLeaseLost
	default:
		return driveRetryLater
	}
}

// failure is the error the drive reports: nil when its work is over.
func (e driveEnd) failure() error {
	if e.outcome.over() {
		return nil
	}
	switch e.outcome {
	case driveStopping:
		if !e.acquired {
			return e.stopped
		}
		return errShutdown
	case driveLeaseLost, driveFenced:
		if e.cause != nil {
			return e.cause
		}
	}
	return e.err
}

// fate is what becomes of a drive's work message.
type fate int

const (
	// leaveMsg: leave it alone; the run's new owner settles it.
	leaveMsg fate = iota
	ackMsg
	// nakMsg: redeliver at once.
	nakMsg
	// nakLaterMsg: redeliver after one lease TTL.
	nakLaterMsg
	// nakSoonMsg: redeliver after journalDueDelay (20 ms, doubling).
	nakSoonMsg
	// termMsg: never redeliver.
	termMsg
	// deadMsg: copy to PAL_DEAD with the reason, then term.
	deadMsg
	// poisonMsg: nakLaterMsg until the message's eventstore.MaxDeliveries-th
	// delivery, then deadMsg.
	poisonMsg
)

var fateNames = [...]string{"leave", "ack", "nak", "nak_later", "nak_soon", "term", "dead", "poison"}

func (f fate) String() string { return fateNames[f] }

// disposition is what a drive's outcome does with its work message and
// the run's lease, and how it is logged.
type disposition struct {
	msg     fate
	release bool // give the lease up (a lease lost or never taken is not ours)
	level   slog.Level
	note    string // log message; none when empty
}

var dispositions = map[driveOutcome]disposition{
	driveDone:       {msg: ackMsg, release: true},
	driveParked:     {msg: ackMsg, release: true, level: slog.LevelInfo, note: "run parked"},
	driveEnded:      {msg: ackMsg, release: true, level: slog.LevelInfo, note: "run ended by another writer; letting it go"},
	driveNoJournal:  {msg: ackMsg, release: true, level: slog.LevelWarn, note: "work for a run with no journal; dropping it"},
	driveJournalDue: {msg: nakSoonMsg, release: true, level: slog.LevelDebug, note: "start's work came before its run_created; looking again"},
	driveBroken:     {msg: deadMsg, release: true, level: slog.LevelError, note: "cannot drive the run"},
	driveStopping:   {msg: nakMsg, release: true, level: slog.LevelInfo, note: "handed run back"},
	driveLeaseLost:  {msg: leaveMsg, level: slog.LevelWarn, note: "drive interrupted"},
	driveFenced:     {msg: leaveMsg, level: slog.LevelWarn, note: "drive interrupted"},
	driveBusy:       {msg: nakLaterMsg, level: slog.LevelInfo, note: "run is leased by another worker; retrying later"},
	driveCrashed:    {msg: nakLaterMsg, release: true, level: slog.LevelWarn, note: "drive crashed; the next counts it toward crash_loop"},
	drivePanicked:   {msg: poisonMsg, release: true, level: slog.LevelWarn, note: "drive failed before resuming the run"},
	driveRetryLater: {msg: nakLaterMsg, release: true, level: slog.LevelWarn, note: "drive interrupted"},
}

// dispose settles the work message and the lease (held, nil if none was
// taken) as the outcome's disposition says. A nak frees the lease first,
// so the worker the work goes to finds it free; an ack or a term settles
// the message first.
func (w *Worker) dispose(ctx context.Context, d *drive, msg jetstream.Msg, end driveEnd, held *eventstore.Lease) {
	disp := dispositions[end.outcome]
	if disp.note != "" {
		args := []any{"outcome", end.outcome, "seq", d.head.Seq}
		if err := end.failure(); err != nil {
			args = append(args, "err", err)
		}
		d.log.Log(ctx, disp.level, disp.note, args...)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	release := func() {
		if held == nil || !disp.release {
			return
		}
		if err := w.leases.Release(rctx, held); err != nil {
			d.log.Warn("releasing lease", "err", err)
		}
	}
	if disp.msg == nakMsg || disp.msg == nakLaterMsg || disp.msg == nakSoonMsg || disp.msg == poisonMsg {
		release()
		w.applyFate(rctx, d.log, msg, disp.msg, end.failure())
		return
	}
	w.applyFate(rctx, d.log, msg, disp.msg, end.failure())
	release()
}

// applyFate gives the work message its fate; a nil message (a drive outside
// the work queue) has none.
func (w *Worker) applyFate(ctx context.Context, log *slog.Logger, msg jetstream.Msg, f fate, reason error) {
	if msg == nil {
		return
	}
	var err error
	switch f {
	case ackMsg:
		err = msg.DoubleAck(ctx)
	case nakMsg:
		err = msg.Nak()
	case nakLaterMsg:
		err = msg.NakWithDelay(w.leases.TTL())
	case nakSoonMsg:
		err = msg.NakWithDelay(journalDueDelay(msg))
	case termMsg:
		err = msg.Term()
	case deadMsg, poisonMsg:
		err = w.deadLetter(ctx, log, msg, f, reason)
	}
	if err != nil {
		log.Warn("giving the work message its fate", "fate", f, "err", err)
	}
}
