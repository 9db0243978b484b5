package palcli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/runs"
)

// Waterfall glyphs: each column of a step's bar is one of these.
const (
	glyphDone    = '#'
	glyphFailed  = 'x'
	glyphRunning = '='
	glyphWait    = '~'
)

// minBar is the narrowest time axis drawn, whatever the width.
const minBar = 10

// printWaterfall draws the run's steps against one time axis scaled to
// width columns: one row per step in journal order, its bar from the
// step's start to its end (now, while it runs), waits drawn with ~ over
// their real span, and the step's duration and wait to the right.
func printWaterfall(w io.Writer, v *runs.RunView, width int, now time.Time) error {
	t0 := parseTime(v.CreatedAt)
	tEnd := parseTime(v.EndedAt)
	if tEnd.IsZero() {
		tEnd = now
	}
	total := tEnd.Sub(t0)
	if total <= 0 {
		total = time.Millisecond
	}
	labels := make([]string, len(v.Steps))
	labelW := len("STEP")
	for i, s := range v.Steps {
		labels[i] = truncate(s.StepID+" "+dash(s.NodeType), 32)
		labelW = max(labelW, len([]rune(labels[i])))
	}
	rights := make([]string, len(v.Steps))
	rightW := 0
	for i, s := range v.Steps {
		rights[i] = waterfallRight(s, now)
		rightW = max(rightW, len([]rune(rights[i])))
	}
	bar := max(minBar, width-labelW-rightW-4)
	col := func(t time.Time) int {
		c := int(float64(t.Sub(t0)) / float64(total) * float64(bar))
		return min(max(c, 0), bar-1)
	}

	var b strings.Builder
	fmt.Fprintf(&b, "%-*s %s\n", labelW, "STEP", axis(bar, total))
	for i, s := range v.Steps {
		row := []rune(strings.Repeat(" ", bar))
		start := parseTime(s.StartedAt)
		if !start.IsZero() {
			end := parseTime(s.EndedAt)
			if end.IsZero() {
				end = now
			}
			glyph := glyphRunning
			switch s.Status {
			case engine.StepCompleted:
				glyph = glyphDone
			case engine.StepFailed:
				glyph = glyphFailed
			}
			for c := col(start); c <= col(end); c++ {
				row[c] = glyph
			}
			if ws := parseTime(s.WaitingSince); !ws.IsZero() {
				we := now
				if s.EndedAt != "" {
					we = ws.Add(time.Duration(s.WaitMs) * time.Millisecond)
				}
				for c := col(ws); c <= col(we); c++ {
					row[c] = glyphWait
				}
			}
		}
		fmt.Fprintf(&b, "%-*s |%s| %s\n", labelW, labels[i], string(row), rights[i])
	}
	fmt.Fprintf(&b, "\n%c done  %c failed  %c running  %c waiting  (0 is the run's creation)\n",
		glyphDone, glyphFailed, glyphRunning, glyphWait)
	_, err := io.WriteString(w, b.String())
	return err
}

// axis labels the time axis at its start, middle and end.
func axis(bar int, total time.Duration) string {
	left, mid, right := "0", fmtDuration(total/2), fmtDuration(total)
	line := []rune(strings.Repeat(" ", bar+1))
	put := func(at int, s string) {
		for i, r := range s {
			if at+i >= 0 && at+i < len(line) {
				line[at+i] = r
			}
		}
	}
	put(1, left)
	put(1+bar/2-len([]rune(mid))/2, mid)
	put(1+bar-len([]rune(right)), right)
	return strings.TrimRight(string(line), " ")
}

// waterfallRight is what follows a step's bar: its status, duration and
// wait, and the model an LLM step's latest attempt called (which
// answered, once it completed).
func waterfallRight(s runs.StepView, now time.Time) string {
	out := string(s.Status)
	switch {
	case s.EndedAt != "":
		out += " " + fmtDuration(time.Duration(s.DurationMs)*time.Millisecond)
		if s.WaitingSince != "" {
			out += " (waited " + fmtDuration(time.Duration(s.WaitMs)*time.Millisecond) + ")"
		}
	case s.StartedAt != "":
		out += " " + fmtDuration(now.Sub(parseTime(s.StartedAt))) + "…"
	}
	if s.Attempts > 1 {
		out += fmt.Sprintf(" %d attempts", s.Attempts)
	}
	if s.Model != "" {
		out += " " + s.Model
	}
	return out
}

// printWaiting tells, for each approval step that waits, what it asks,
// who may decide, and the commands that decide it.
func printWaiting(w io.Writer, v *runs.RunView, now time.Time) error {
	for _, s := range v.Steps {
		if s.Status != engine.StepWaiting || s.NodeType != "approval" {
			continue
		}
		var in engine.ApprovalInput
		_ = json.Unmarshal(s.Input, &in)
		who := "anyone whose token has scope approve"
		if len(in.Approvers) > 0 {
			who = strings.Join(in.Approvers, ", ")
		}
		since := ""
		if ws := parseTime(s.WaitingSince); !ws.IsZero() {
			since = " for " + fmtDuration(now.Sub(ws))
		}
		approver := "NAME"
		if len(in.Approvers) == 1 {
			approver = in.Approvers[0]
		}
		fmt.Fprintf(w, "\nStep %s waits for approval%s.\n", s.StepID, since)
		if in.Prompt != "" {
			fmt.Fprintf(w, "  Prompt:    %s\n", truncate(in.Prompt, 500))
		}
		fmt.Fprintf(w, "  Who:       %s\n", who)
		fmt.Fprintf(w, "  Approve:   pal run approve %s --step %s --approver %s\n", v.RunID, s.StepID, approver)
		if _, err := fmt.Fprintf(w, "  Reject:    pal run approve %s --step %s --approver %s --reject\n", v.RunID, s.StepID, approver); err != nil {
			return err
		}
	}
	return nil
}
