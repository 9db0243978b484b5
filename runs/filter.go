package runs

import (
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/readmodel"
)

// ListParams are the query parameters of a listing (GET /v1/runs; pal run
// list builds the same from its flags), in the order the docs give them.
var ListParams = []string{"status", "workflow", "queue", "schedule", "label", "thread", "since", "until", "error_code", "q", "limit", "before"}

// MaxSearchBytes bounds a listing's free text (q).
const MaxSearchBytes = 200

var errorCode = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// ParseRunFilter reads a listing's query: status, workflow, queue, schedule, label (KEY=VALUE,
// repeatable: every label must match), thread (runs started on it), since and until (RFC 3339, on the
// creation time: since ≤ created_at < until), error_code, q (text the
// error message contains, ignoring case; at most MaxSearchBytes), limit
// and before (a cursor from an earlier page's next). Every parameter but
// label is given at most once.
//
// Errors: *InputError naming the parameter, for one it does not know and
// a value out of its bounds.
func ParseRunFilter(q url.Values) (readmodel.RunFilter, error) {
	f := readmodel.RunFilter{Limit: readmodel.DefaultListLimit}
	for _, k := range slices.Sorted(maps.Keys(q)) { // the same query, the same first error
		vs := q[k]
		if k != "label" && len(vs) > 1 {
			return f, &InputError{Field: k, Msg: "given more than once"}
		}
		for _, v := range vs {
			if err := queryValue(k, v); err != nil {
				return f, err
			}
			if err := setFilter(&f, k, v); err != nil {
				return f, err
			}
		}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Until.After(f.Since) {
		return f, &InputError{Field: "until", Msg: "not after since: the range holds no time"}
	}
	return f, nil
}

// queryValue refuses a value Postgres would refuse as text (SQLSTATE
// 22021): invalid UTF-8 or a NUL byte is the caller's mistake, not a
// failure of the projection.
func queryValue(field, v string) error {
	switch {
	case !utf8.ValidString(v):
		return &InputError{Field: field, Msg: "not valid UTF-8"}
	case strings.IndexByte(v, 0) >= 0:
		return &InputError{Field: field, Msg: "holds a NUL byte"}
	}
	return nil
}

// setFilter sets the filter of parameter k to v.
func setFilter(f *readmodel.RunFilter, k, v string) error {
	switch k {
	case "status":
		st, err := ParseStatus(v)
		f.Status = st
		return err
	case "workflow":
		f.Workflow = v
		return checkLen("workflow", v, MaxNameBytes)
	case "queue":
		if err := event.ValidateQueue(v); err != nil {
			return &InputError{Field: k, Msg: err.Error()}
		}
		f.Queue = v
	case "schedule":
		if err := event.ValidateWorkflowName(v); err != nil {
			return &InputError{Field: k, Msg: strings.Replace(err.Error(), "workflow name", "schedule name", 1)}
		}
		f.Schedule = v
	case "label":
		return addLabel(f, v)
	case "thread":
		if err := event.ValidateThreadID(v); err != nil {
			return &InputError{Field: k, Msg: err.Error()}
		}
		f.Thread = v
	case "since", "until":
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil || t.Year() < 1 {
			return &InputError{Field: k, Msg: fmt.Sprintf("%q: want an RFC 3339 time, e.g. 2026-03-01T00:00:00Z", truncate(v, 80))}
		}
		if k == "since" {
			f.Since = t
		} else {
			f.Until = t
		}
	case "error_code":
		if !errorCode.MatchString(v) {
			return &InputError{Field: k, Msg: fmt.Sprintf("%q: want an error code, e.g. step_failed or budget_exceeded", truncate(v, 80))}
		}
		f.ErrorCode = v
	case "q":
		if v == "" {
			return &InputError{Field: k, Msg: "empty: give the text to find in error messages"}
		}
		f.Text = v
		return checkLen(k, v, MaxSearchBytes)
	case "limit":
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > readmodel.MaxListLimit {
			return &InputError{Field: k, Msg: fmt.Sprintf("%q: want a whole number from 1 to %d", truncate(v, 40), readmodel.MaxListLimit)}
		}
		f.Limit = n
	case "before":
		if _, _, err := readmodel.ParseCursor(v); err != nil {
			return &InputError{Field: k, Msg: "not a cursor from an earlier listing's \"next\""}
		}
		f.Before = v
	default:
		return &InputError{Field: k, Msg: "unknown query parameter (want " + strings.Join(ListParams, ", ") + ")"}
	}
	return nil
}

// ParseLabel reads one label written KEY=VALUE (GET /v1/runs?label=,
// pal run start --label, pal run list --label), split at the first '='.
// Errors: *InputError (field label).
func ParseLabel(s string) (key, value string, err error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return "", "", &InputError{Field: "label", Msg: fmt.Sprintf("%q: want KEY=VALUE, e.g. customer=acme", truncate(s, 80))}
	}
	if err := event.CheckLabelKey(k); err != nil {
		return "", "", &InputError{Field: "label", Msg: err.Error()}
	}
	if err := event.CheckLabelValue(k, v); err != nil {
		return "", "", &InputError{Field: "label", Msg: err.Error()}
	}
	return k, v, nil
}

// addLabel adds label filter KEY=VALUE to f.
func addLabel(f *readmodel.RunFilter, v string) error {
	k, val, err := ParseLabel(v)
	if err != nil {
		return err
	}
	if old, dup := f.Labels[k]; dup {
		return &InputError{Field: "label", Msg: fmt.Sprintf("%s given twice (%q and %q): a run has one value per label", k, truncate(old, 40), truncate(val, 40))}
	}
	if len(f.Labels) == event.MaxLabels {
		return &InputError{Field: "label", Msg: fmt.Sprintf("more than %d labels; a run has at most %d", event.MaxLabels, event.MaxLabels)}
	}
	if f.Labels == nil {
		f.Labels = map[string]string{}
	}
	f.Labels[k] = val
	return nil
}
