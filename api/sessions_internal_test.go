package api

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSessionsPerToken: one token's logins, however many, hold at most
// maxSessionsPerToken sessions, its oldest ended first, so they cannot
// fill the store and lock other tokens out (the store's own bound,
// maxSessions, then takes as many tokens).
func TestSessionsPerToken(t *testing.T) {
	t.Parallel()
	s := newSessionStore(time.Hour)
	clock := time.Now()
	s.now = func() time.Time { clock = clock.Add(time.Microsecond); return clock }
	alive := func(id string) bool {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.AddCookie(&http.Cookie{Name: SessionCookie, Value: id})
		_, ok := s.get(r)
		return ok
	}
	var ids []string
	for range maxSessions + 50 {
		id, _, err := s.create(principal{name: "spam"}, "tok-a")
		require.NoError(t, err)
		ids = append(ids, id)
	}
	require.Len(t, s.m, maxSessionsPerToken)
	require.False(t, alive(ids[0]), "the oldest went first")
	require.False(t, alive(ids[len(ids)-maxSessionsPerToken-1]))
	for _, id := range ids[len(ids)-maxSessionsPerToken:] {
		require.True(t, alive(id))
	}
	id, _, err := s.create(principal{name: "ana"}, "tok-b")
	require.NoError(t, err, "another token still logs in")
	require.True(t, alive(id))

	// The store's own bound still holds, over many tokens (filled here
	// as their logins would fill it).
	for i := 0; len(s.m) < maxSessions-1; i++ {
		tk := sha256.Sum256(fmt.Appendf(nil, "tok-%d", i/maxSessionsPerToken))
		s.m[sha256.Sum256(fmt.Appendf(nil, "filler-%d", i))] = &session{token: tk, created: clock, expires: clock.Add(time.Hour)}
	}
	_, _, err = s.create(principal{name: "last"}, "tok-last")
	require.NoError(t, err)
	_, _, err = s.create(principal{name: "late"}, "tok-late")
	require.ErrorIs(t, err, errTooManySessions)
}
