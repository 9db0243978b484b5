package workers

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
)

// The runtime endpoint: the program of a process step reports its
// sub-steps over HTTP on a Unix socket that only it sees (the sandbox
// binds it at sandbox.IPCDir; PAL_REPORT_SOCKET names it). There is no
// token: holding the socket is the authority, and it names one step's
// attempt, for as long as that process runs. Reports go to the drive's
// own goroutine, which journals them with the drive's fenced writer, so a
// report from a program whose drive lost the run cannot be appended.
const (
	// ReportPath is where a program reports a sub-step.
	ReportPath = "/v1/runtime/report"
	// SubstepsPath is where a program reads the sub-steps of its step that
	// are journaled as completed.
	SubstepsPath = "/v1/runtime/substeps"
	// MaxReportBytes bounds a report's body.
	MaxReportBytes = 256 << 10
	// MaxSubstepName bounds a sub-step's name.
	MaxSubstepName = 128
	// MaxSubsteps bounds the sub-steps of one step attempt.
	MaxSubsteps = 1000
	// MaxSubstepBytes bounds the outputs of one step attempt's sub-steps
	// together: what GET SubstepsPath answers a resumed program.
	MaxSubstepBytes = 4 << 20
)

// procSession is the runtime endpoint of one running process.
type procSession struct {
	stepID string
	srv    *http.Server
	reqs   chan *reportReq
	done   chan struct{} // closed when the process has ended
	served chan struct{} // closed when the server has stopped
}

// reportReq is a program's request, answered by the drive.
type reportReq struct {
	list   bool // GET substeps
	body   reportBody
	answer chan reportAnswer
}

// reportBody is the body of POST ReportPath.
type reportBody struct {
	// StepID, when set, must be the step the socket is for.
	StepID string          `json:"step_id,omitempty"`
	Name   string          `json:"name"`
	Status string          `json:"status"`
	Output json.RawMessage `json:"output,omitempty"`
}

type reportAnswer struct {
	status int
	body   any
}

// SubstepReply is one sub-step in the runtime endpoint's answers.
type SubstepReply struct {
	Name   string          `json:"name"`
	Output json.RawMessage `json:"output"`
}

// serveSession serves the runtime endpoint of step stepID's process on ln
// until close.
func serveSession(ln net.Listener, stepID string) *procSession {
	s := &procSession{stepID: stepID, reqs: make(chan *reportReq), done: make(chan struct{}), served: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+ReportPath, s.report)
	mux.HandleFunc("GET "+SubstepsPath, s.substeps)
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second,
		MaxHeaderBytes: 16 << 10}
	go func() {
		defer close(s.served)
		_ = s.srv.Serve(ln)
	}()
	return s
}

// close ends the session: requests in flight get 410, the server stops.
func (s *procSession) close() {
	close(s.done)
	_ = s.srv.Close()
	<-s.served
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func problem(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, map[string]string{"error": fmt.Sprintf(format, args...)})
}

func (s *procSession) report(w http.ResponseWriter, r *http.Request) {
	raw, err := io.ReadAll(io.LimitReader(r.Body, MaxReportBytes+1))
	if err != nil {
		problem(w, http.StatusBadRequest, "reading the report: %v", err)
		return
	}
	if len(raw) > MaxReportBytes {
		problem(w, http.StatusRequestEntityTooLarge, "a report is at most %d bytes", MaxReportBytes)
		return
	}
	var b reportBody
	if err := json.Unmarshal(raw, &b); err != nil {
		problem(w, http.StatusBadRequest, "the report is not JSON {name, status, output}: %v", err)
		return
	}
	switch {
	case b.StepID != "" && b.StepID != s.stepID:
		problem(w, http.StatusForbidden, "this socket takes reports for step %s only, not %s", s.stepID, b.StepID)
		return
	case b.Name == "" || len(b.Name) > MaxSubstepName:
		problem(w, http.StatusBadRequest, "name must be 1 to %d bytes", MaxSubstepName)
		return
	case b.Status != "started" && b.Status != "completed":
		problem(w, http.StatusBadRequest, "status must be started or completed, not %q", b.Status)
		return
	}
	if len(b.Output) == 0 {
		b.Output = json.RawMessage("null")
	}
	s.ask(w, r, &reportReq{body: b})
}

func (s *procSession) substeps(w http.ResponseWriter, r *http.Request) {
	s.ask(w, r, &reportReq{list: true})
}

// ask hands a request to the drive running the session's process and
// writes its answer.
func (s *procSession) ask(w http.ResponseWriter, r *http.Request, req *reportReq) {
	req.answer = make(chan reportAnswer, 1)
	select {
	case s.reqs <- req:
	case <-s.done:
		problem(w, http.StatusGone, "the process step has ended")
		return
	case <-r.Context().Done():
		return
	}
	select {
	case a := <-req.answer:
		writeJSON(w, a.status, a.body)
	case <-r.Context().Done():
	}
}

// answerReport journals a child's report on the drive's goroutine:
// substep_started or substep_completed, flushed (fenced) before the
// child hears back. A sub-step already completed is not journaled again;
// the answer carries its journaled output.
func (d *drive) answerReport(p engine.StepPlan, req *reportReq) reportAnswer {
	a := d.st.Steps[p.StepID].AttemptState(p.Attempt)
	if req.list {
		out := []SubstepReply{}
		if a != nil {
			for _, s := range a.Substeps {
				if s.Status == engine.StepCompleted {
					out = append(out, SubstepReply{Name: s.Name, Output: s.Output})
				}
			}
		}
		return reportAnswer{http.StatusOK, map[string]any{"step_id": p.StepID, "substeps": out}}
	}
	b := req.body
	var sub *engine.Substep
	if a != nil {
		sub = a.Substep(b.Name)
	}
	if sub != nil && sub.Status == engine.StepCompleted {
		return reportAnswer{http.StatusOK, map[string]any{"completed": true, "output": sub.Output}}
	}
	if sub == nil && a != nil && len(a.Substeps) >= MaxSubsteps {
		return reportAnswer{http.StatusRequestEntityTooLarge, map[string]string{
			"error": fmt.Sprintf("a step reports at most %d sub-steps", MaxSubsteps)}}
	}
	if b.Status == "completed" {
		if err := d.fits(p, "sub-step output", b.Output); err != nil {
			return reportAnswer{http.StatusRequestEntityTooLarge, map[string]string{"error": err.Error()}}
		}
		total := len(b.Output)
		if a != nil {
			for _, s := range a.Substeps {
				total += len(s.Output)
			}
		}
		if total > MaxSubstepBytes {
			return reportAnswer{http.StatusRequestEntityTooLarge, map[string]string{
				"error": fmt.Sprintf("a step's sub-step outputs come to at most %d bytes together", MaxSubstepBytes)}}
		}
		d.emit(event.SubstepCompleted, p.StepID, p.Attempt, event.SubstepCompletedData{Name: b.Name, Output: b.Output})
	} else {
		d.emit(event.SubstepStarted, p.StepID, p.Attempt, event.SubstepStartedData{Name: b.Name})
	}
	if err := d.flush(); err != nil {
		// The drive cannot append (the lease is lost, the run ended): the
		// process will be stopped; the child must not go on as if
		// journaled.
		d.log.Warn("journaling a sub-step report", "step_id", p.StepID, "substep", b.Name, "err", err)
		d.reportErr = err
		return reportAnswer{http.StatusServiceUnavailable, map[string]string{"error": "the report could not be journaled: " + err.Error()}}
	}
	return reportAnswer{http.StatusOK, map[string]any{"completed": b.Status == "completed", "output": b.Output}}
}

// errReport is returned by execProcess when journaling a report failed.
var errReport = errors.New("a sub-step report could not be journaled")
