package workers

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore"
)

// TestDriveOutcomes pins how every way a drive can end is classified, what
// it does with the work message and the lease, and what the drive reports.
func TestDriveOutcomes(t *testing.T) {
	boom := errors.New("nats: no responders available")
	broken := fmt.Errorf("run r: %w", errJournal)
	fenced := fmt.Errorf("%w: conflict", errOwnership)
	crashed := &panicError{value: "tool bug", counted: true}
	panicked := &panicError{value: "fold bug"}
	notFound := fmt.Errorf("reading: %w", eventstore.ErrRunNotFound)
	cases := []struct {
		name    string
		end     driveEnd
		want    driveOutcome
		msg     fate
		release bool  // the lease is given up (one never taken cannot be)
		failure error // nil: the drive reports success
	}{
		{"terminal", driveEnd{acquired: true}, driveDone, ackMsg, true, nil},
		{"done although a stop came after", driveEnd{acquired: true, cause: errShutdown, stopped: context.Canceled},
			driveDone, ackMsg, true, nil},
		{"parked", driveEnd{acquired: true, err: errParked}, driveParked, ackMsg, true, nil},
		{"cancelled by another writer", driveEnd{acquired: true, err: errRunEnded}, driveEnded, ackMsg, true, nil},
		{"cancel notice interrupted the drive", driveEnd{acquired: true, err: boom, cause: errRunEnded},
			driveEnded, ackMsg, true, nil},
		{"no journal", driveEnd{acquired: true, err: notFound}, driveNoJournal, ackMsg, true, nil},
		{"a start's work before its run_created", driveEnd{acquired: true, err: notFound, journalDue: true},
			driveJournalDue, nakSoonMsg, true, notFound},
		{"journal does not fold", driveEnd{acquired: true, err: broken}, driveBroken, deadMsg, true, broken},
		{"panicked after resuming", driveEnd{acquired: true, err: crashed}, driveCrashed, nakLaterMsg, true, crashed},
		{"panicked before resuming", driveEnd{acquired: true, err: panicked}, drivePanicked, poisonMsg, true, panicked},
		{"graceful stop", driveEnd{acquired: true, err: errShutdown, cause: errShutdown, stopped: context.Canceled},
			driveStopping, nakMsg, true, errShutdown},
		{"caller's context ended", driveEnd{acquired: true, err: context.Canceled, cause: context.Canceled, stopped: context.Canceled},
			driveStopping, nakMsg, true, errShutdown},
		{"stopped while acquiring", driveEnd{err: boom, stopped: context.Canceled}, driveStopping, nakMsg, false, context.Canceled},
		{"lease lost", driveEnd{acquired: true, err: boom, cause: errLeaseLost}, driveLeaseLost, leaveMsg, false, errLeaseLost},
		{"lease expired in the keeper", driveEnd{acquired: true, err: boom, cause: errLeaseExpired},
			driveLeaseLost, leaveMsg, false, errLeaseExpired},
		{"lease expired at a flush", driveEnd{acquired: true, err: errLeaseExpired}, driveLeaseLost, leaveMsg, false, errLeaseExpired},
		{"fenced", driveEnd{acquired: true, err: fenced, cause: errOwnership}, driveFenced, leaveMsg, false, errOwnership},
		{"fenced without a cancel", driveEnd{acquired: true, err: fenced}, driveFenced, leaveMsg, false, fenced},
		{"lease held by another worker", driveEnd{err: eventstore.ErrLeaseHeld}, driveBusy, nakLaterMsg, false, eventstore.ErrLeaseHeld},
		{"NATS unavailable", driveEnd{acquired: true, err: boom}, driveRetryLater, nakLaterMsg, true, boom},
		{"a bug cancelled the drive", driveEnd{acquired: true, err: boom, cause: boom}, driveRetryLater, nakLaterMsg, true, boom},
	}
	seen := map[driveOutcome]bool{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := classifyDrive(c.end)
			require.Equal(t, c.want, got, "outcome")
			seen[got] = true
			disp, ok := dispositions[got]
			require.True(t, ok, "no disposition for %s", got)
			require.Equal(t, c.msg, disp.msg, "work message")
			require.Equal(t, c.release, disp.release && c.end.acquired, "lease release")
			end := c.end
			end.outcome = got
			if c.failure == nil {
				require.NoError(t, end.failure())
				require.True(t, got.over())
			} else {
				require.ErrorIs(t, end.failure(), c.failure)
				require.False(t, got.over())
			}
		})
	}
	for o := driveOutcome(0); o < numOutcomes; o++ {
		require.True(t, seen[o], "no case covers outcome %s", o)
		require.NotEqual(t, fmt.Sprintf("driveOutcome(%d)", int(o)), o.String())
	}
	require.Len(t, dispositions, int(numOutcomes))
}
