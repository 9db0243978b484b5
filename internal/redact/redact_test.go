package redact_test

import (
	"errors"
	"io/fs"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/internal/redact"
)

func TestURL(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"https://api.example.com/v1/x?api_key=SECRET&b=2":     "https://api.example.com/v1/x?api_key=REDACTED&b=REDACTED",
		"https://user:SECRET@host/":                           "https://REDACTED@host/",
		"https://SECRET@host":                                 "https://REDACTED@host",
		"http://u:p@h:8080/a/b?SECRET#frag":                   "http://REDACTED@h:8080/a/b?REDACTED#REDACTED",
		"https://host/p?a=&&b=SECRET":                         "https://host/p?a=REDACTED&&b=REDACTED",
		"https://host/path/only":                              "https://host/path/only",
		"https://host/p?":                                     "https://host/p?",
		"https://host/p/@x?t=SECRET":                          "https://host/p/@x?t=REDACTED",
		"not a url":                                           "not a url",
		"/relative?token=SECRET":                              "/relative?token=REDACTED",
		"https://a@b@host/?x=SECRET%26y":                      "https://REDACTED@host/?x=REDACTED",
		"https://host/#access_token=SECRET":                   "https://host/#REDACTED",
		"postgres://pal:SECRET@localhost:5432/pal?sslmode=no": "postgres://REDACTED@localhost:5432/pal?sslmode=REDACTED",
	} {
		require.Equal(t, want, redact.URL(in), in)
	}
}

func TestStringAndError(t *testing.T) {
	t.Parallel()
	raw := "https://u:SECRET@api.example.com/v1?api_key=SECRET"
	_, err := http.Get(raw + "\x7f") // an invalid URL: net/url quotes it whole
	require.ErrorContains(t, err, "SECRET")
	red := redact.Error(err)
	require.NotContains(t, red.Error(), "SECRET")
	require.Contains(t, red.Error(), `"https://REDACTED@api.example.com/v1?api_key=REDACTED`)
	var ue *url.Error
	require.ErrorAs(t, red, &ue, "the original error stays reachable")

	require.Equal(t, `GET "https://h/x?k=REDACTED": dial: refused; then 'ftp://REDACTED@f/' and https://h2/y?z=REDACTED.`,
		redact.String(`GET "https://h/x?k=SECRET": dial: refused; then 'ftp://a:SECRET@f/' and https://h2/y?z=SECRET.`))
	require.Equal(t, "GET https://h/x?k=REDACTED: HTTP 403", redact.String("GET https://h/x?k=SECRET: HTTP 403"))
	require.Equal(t, "token REDACTED in https://h/REDACTED/x?a=REDACTED",
		redact.Error(errors.New("token SECRET in https://h/SECRET/x?a=b"), "SECRET", "").Error())
	plain := errors.New("no url here")
	require.Same(t, plain, redact.Error(plain))
	require.NoError(t, redact.Error(nil))
	require.ErrorIs(t, redact.Error(&fs.PathError{Op: "open", Path: "https://x/?k=v", Err: fs.ErrNotExist}), fs.ErrNotExist)
}
