package palcli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/readmodel"
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
// their real span, and the step's duration and wait to the right. When
// steps ran at once, the lane view follows (laneRows): one row per lane,
// each holding steps one after another.
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
		drawStep(row, s, col, now)
		fmt.Fprintf(&b, "%-*s |%s| %s\n", labelW, labels[i], string(row), rights[i])
	}
	b.WriteString(laneRows(v, labelW, bar, col, now))
	fmt.Fprintf(&b, "\n%c done  %c failed  %c running  %c waiting  (0 is the run's creation)\n",
		glyphDone, glyphFailed, glyphRunning, glyphWait)
	_, err := io.WriteString(w, b.String())
	return err
}

// drawStep draws step s's bar into row, col mapping a time to a column.
func drawStep(row []rune, s runs.StepView, col func(time.Time) int, now time.Time) {
	start := parseTime(s.StartedAt)
	if start.IsZero() {
		return
	}
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

// maxLaneNames is how many of a lane's steps its row names.
const maxLaneNames = 3

// laneRows is the lane view of a run whose steps ran at once (nothing
// when they ran one at a time): one row per lane (readmodel.Lanes), its
// steps' bars one after another, and the steps it held to the right.
func laneRows(v *runs.RunView, labelW, bar int, col func(time.Time) int, now time.Time) string {
	t0 := parseTime(v.CreatedAt)
	spans := make([]readmodel.Span, 0, len(v.Steps))
	var of []int // spans[k] is v.Steps[of[k]]
	for i, s := range v.Steps {
		start := parseTime(s.StartedAt)
		if start.IsZero() {
			continue
		}
		sp := readmodel.Span{StartMs: ms(start.Sub(t0)), Open: s.EndedAt == ""}
		if !sp.Open {
			sp.EndMs = ms(parseTime(s.EndedAt).Sub(t0))
		}
		spans, of = append(spans, sp), append(of, i)
	}
	lanes, n := readmodel.Lanes(spans)
	if n < 2 {
		return ""
	}
	rows := make([][]rune, n)
	names := make([][]string, n)
	for k, lane := range lanes {
		if rows[lane] == nil {
			rows[lane] = []rune(strings.Repeat(" ", bar))
		}
		s := v.Steps[of[k]]
		drawStep(rows[lane], s, col, now)
		names[lane] = append(names[lane], s.StepID)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%-*s (at most %d steps at once)\n", labelW, "LANE", n)
	for lane, row := range rows {
		list := names[lane]
		if len(list) > maxLaneNames {
			list = append(list[:maxLaneNames:maxLaneNames], fmt.Sprintf("+%d more", len(names[lane])-maxLaneNames))
		}
		fmt.Fprintf(&b, "%-*s |%s| %s\n", labelW, fmt.Sprintf("lane %d", lane+1), string(row), strings.Join(list, ", "))
	}
	return b.String()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

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
