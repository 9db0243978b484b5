package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/readmodel"
	"github.com/palrun/pal/runs"
)

// Answer codes of the API's own, beside runs' (runs.Classify).
const (
	// codeTooLarge: a request body or its headers over the limit.
	codeTooLarge = "too_large"
	// codeJournalRemoved: the event feed of a run whose journal retention
	// removed (§13.1); its rows still read.
	codeJournalRemoved = "journal_removed"
	// codeForbidden: what the request's token may not do
	// (*forbiddenError, a route's scope it lacks, or runs'
	// *ForbiddenError).
	codeForbidden = runs.CodeForbidden
)

// transportCode is how one answer code goes out on each transport.
type transportCode struct {
	http int // REST, and the NATS service's error header
	grpc codes.Code
}

// answerCodes is the one table of how an answer code goes out: REST's
// status, the NATS service's, and gRPC's code. A code it does not list
// goes out as unavailable.
var answerCodes = map[string]transportCode{
	runs.CodeBadInput:    {http.StatusBadRequest, codes.InvalidArgument},
	runs.CodeNotFound:    {http.StatusNotFound, codes.NotFound},
	runs.CodeConflict:    {http.StatusConflict, codes.FailedPrecondition},
	runs.CodeLeaseHeld:   {http.StatusConflict, codes.FailedPrecondition},
	codeJournalRemoved:   {http.StatusGone, codes.FailedPrecondition},
	codeForbidden:        {http.StatusForbidden, codes.PermissionDenied},
	codeReceiptInvalid:   {http.StatusInternalServerError, codes.DataLoss},
	codeTooLarge:         {http.StatusRequestEntityTooLarge, codes.ResourceExhausted},
	runs.CodeRateLimited: {http.StatusTooManyRequests, codes.ResourceExhausted},
	runs.CodeInternal:    {http.StatusInternalServerError, codes.Internal},
	runs.CodeUnavailable: {http.StatusServiceUnavailable, codes.Unavailable},
}

// transportOf returns how code goes out (unavailable's for a code the
// table does not list).
func transportOf(code string) (string, transportCode) {
	if tc, ok := answerCodes[code]; ok {
		return code, tc
	}
	return runs.CodeUnavailable, answerCodes[runs.CodeUnavailable]
}

// answerCode classifies err as runs.Classify does, and the API's own
// errors (journalRemovedError, *http.MaxBytesError, *forbiddenError) too.
func answerCode(err error) (code, field string) {
	var jr *journalRemovedError
	var mbe *http.MaxBytesError
	var fe *forbiddenError
	switch {
	case errors.As(err, &jr):
		return codeJournalRemoved, ""
	case errors.As(err, &mbe):
		return codeTooLarge, ""
	case errors.As(err, &fe):
		return codeForbidden, fe.field
	}
	code, field, _ = runs.Classify(err)
	code, _ = transportOf(code)
	return code, field
}

// journalRemovedError is the event feed's answer for a run whose journal
// retention removed: there are no events to send, but its rows read.
type journalRemovedError struct {
	runID string
	at    time.Time
}

func (e *journalRemovedError) Error() string {
	return fmt.Sprintf("run %s: its journal was removed by retention (PAL_RETENTION) at %s; GET /v1/runs/%s (gRPC GetRun) reads its kept rows",
		e.runID, runs.FormatTime(e.at), e.runID)
}

// runView returns the run's read model: the fold of its journal or, for a
// run whose journal retention removed, its rows from rr (nil: there is no
// read side). REST GET /v1/runs/{id}, gRPC GetRun and pal.api.runs.get
// answer with it, so the three read the same. Errors: runs.Client.Get's.
func runView(ctx context.Context, client *runs.Client, rr RunReader, log *slog.Logger, id string) (*runs.RunView, error) {
	v, err := client.Get(ctx, id)
	if errors.Is(err, eventstore.ErrRunNotFound) {
		if d, ok := removedRun(ctx, rr, log, id); ok {
			return runs.ViewOfDetail(d), nil
		}
	}
	return v, err
}

// removedRun returns the rows of a run with no journal whose journal
// retention removed (PAL_RETENTION), if rr has them.
func removedRun(ctx context.Context, rr RunReader, log *slog.Logger, id string) (readmodel.RunDetail, bool) {
	if rr == nil {
		return readmodel.RunDetail{}, false
	}
	d, err := rr.GetRun(ctx, id)
	if err != nil {
		if !errors.Is(err, projections.ErrRunNotFound) {
			log.Warn("reading a run from the projection", "run_id", id, "err", err)
		}
		return readmodel.RunDetail{}, false
	}
	return d, !d.Run.JournalRemovedAt.IsZero()
}
