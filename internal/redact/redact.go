// Package redact keeps secrets out of what PAL stores and prints: errors,
// logs, events and receipts. A URL keeps its scheme, host and path; its
// userinfo, query values and fragment become REDACTED.
//
// Redaction is for what is written down, never for what is sent: callers
// redact a copy.
package redact

import (
	"regexp"
	"strings"
)

// Mask replaces every redacted part.
const Mask = "REDACTED"

// URL returns raw with userinfo, query values and fragment masked:
//
//	https://user:pw@api.example.com/v1/x?api_key=k&b=2#t
//	→ https://REDACTED@api.example.com/v1/x?api_key=REDACTED&b=REDACTED#REDACTED
//
// A query item without "=" is masked whole. Text without "://" is
// returned as it is but for its query and fragment.
func URL(raw string) string {
	rest, frag, hasFrag := strings.Cut(raw, "#")
	rest, query, hasQuery := strings.Cut(rest, "?")
	var b strings.Builder
	b.Grow(len(raw))
	if scheme, after, ok := strings.Cut(rest, "://"); ok {
		authority, path := after, ""
		if i := strings.IndexByte(after, '/'); i >= 0 {
			authority, path = after[:i], after[i:]
		}
		if i := strings.LastIndexByte(authority, '@'); i >= 0 {
			authority = Mask + "@" + authority[i+1:]
		}
		b.WriteString(scheme + "://" + authority + path)
	} else {
		b.WriteString(rest)
	}
	if hasQuery {
		b.WriteByte('?')
		for i, item := range strings.Split(query, "&") {
			if i > 0 {
				b.WriteByte('&')
			}
			if k, _, ok := strings.Cut(item, "="); ok {
				b.WriteString(k + "=" + Mask)
			} else if item != "" {
				b.WriteString(Mask)
			}
		}
	}
	if hasFrag && frag != "" {
		b.WriteString("#" + Mask)
	}
	return b.String()
}

// urlPattern finds URLs in text: a scheme, "://", and everything up to
// white space or a quote, less trailing punctuation ("…?k=v: HTTP 403").
var urlPattern = regexp.MustCompile("[A-Za-z][A-Za-z0-9+.-]*://[^\\s\"'`<>]*[^\\s\"'`<>.,:;)]")

// String masks every URL in s (see URL), and every occurrence of each
// of values (secrets the caller knows it used). Error messages from
// net/http quote the whole request URL; pass them through String before
// they are journaled or logged.
func String(s string, values ...string) string {
	for _, v := range values {
		if v != "" {
			s = strings.ReplaceAll(s, v, Mask)
		}
	}
	if !strings.Contains(s, "://") {
		return s
	}
	return urlPattern.ReplaceAllStringFunc(s, URL)
}

// Error is err with its message passed through String(msg, values...).
// The original stays reachable with errors.Is and errors.As.
func Error(err error, values ...string) error {
	if err == nil {
		return nil
	}
	if msg := err.Error(); String(msg, values...) != msg {
		return &redacted{err: err, msg: String(msg, values...)}
	}
	return err
}

type redacted struct {
	err error
	msg string
}

func (e *redacted) Error() string { return e.msg }
func (e *redacted) Unwrap() error { return e.err }
