package palcli

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/runs"
)

// Output helpers shared by the pal run subcommands: human output by
// default, one JSON document (or one JSON line per event) with --json.

func addJSONFlag(cmd *cobra.Command, what string) {
	cmd.Flags().Bool("json", false, what)
}

func jsonFlag(cmd *cobra.Command) bool {
	v, _ := cmd.Flags().GetBool("json")
	return v
}

// printJSON writes v as one line of JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// cliErrorBody is what --json prints on stdout for an error, the same
// shape as the REST API's errors.
type cliErrorBody struct {
	Error  string `json:"error"`
	Detail string `json:"detail"`
	Field  string `json:"field,omitempty"`
}

// jsonErrors wraps a RunE so that with --json an error is also printed on
// stdout as {"error": code, "detail": message}; the exit code and the
// message on stderr stay as they are.
func (e *env) jsonErrors(run func(cmd *cobra.Command, args []string) error) func(cmd *cobra.Command, args []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := e.explain(run(cmd, args))
		if err == nil || !jsonFlag(cmd) {
			return err
		}
		exit, code := answerOf(err)
		if exit == ExitRunFailed {
			// A run that failed is an outcome, not an error of the command.
			return err
		}
		// The field at fault, as the REST API names it.
		_, field, _ := runs.Classify(err)
		_ = printJSON(e.stdout, cliErrorBody{Error: code, Detail: err.Error(), Field: field})
		return err
	}
}

// fmtDuration renders a duration for people: 420µs, 850ms, 12.3s, 3m05s,
// 2h03m.
func fmtDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "-"
	case d == 0:
		return "0ms"
	case d < time.Millisecond:
		return fmt.Sprintf("%dµs", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%dms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	default:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
}

// fmtTime renders a timestamp in local time with how long ago it was: in
// milliseconds under a second, whole seconds under a minute, "just now"
// for a time a skewed clock puts ahead of now.
func fmtTime(t time.Time, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	ago := now.Sub(t)
	var s string
	switch {
	case ago < 0:
		s = "just now"
	case ago < time.Second:
		s = fmt.Sprintf("%dms ago", ago.Milliseconds())
	case ago < time.Minute:
		s = fmt.Sprintf("%ds ago", int(ago.Seconds()))
	default:
		s = fmtDuration(ago) + " ago"
	}
	return fmt.Sprintf("%s (%s)", t.Local().Format("2006-01-02 15:04:05"), s)
}

// fmtShortTime renders a timestamp for a table column.
func fmtShortTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04:05")
}

// fmtUSD renders dollars with decimals places, and an amount too small
// to show so (under $0.0001 with 4) with two significant digits instead,
// so a limit of $0.00001 does not read $0.0000: $0.00001, $0.0000012.
func fmtUSD(v float64, decimals int) string {
	if v <= 0 || v >= math.Pow10(-decimals) || math.IsInf(v, 0) || math.IsNaN(v) {
		return "$" + strconv.FormatFloat(v, 'f', decimals, 64)
	}
	sig := 1 - int(math.Floor(math.Log10(v)))
	s := strings.TrimRight(strconv.FormatFloat(v, 'f', sig, 64), "0")
	return "$" + s
}

func fmtTokens(n int64) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
}
