package natsauth

import (
	"fmt"
	"strings"
)

// Scopes is what a client user or a REST token (api.Scopes, the same
// type) may do, a set of Scope bits. The server enforces them by subject
// (each scope renders into the user's publish permissions, Permissions
// of User), and PAL's NATS service and command processor check them
// again, with what a subject cannot say: a forced resume, and naming
// another approver or canceller, need ScopeAdmin.
type Scopes uint8

// The scopes. ScopeAdmin implies all of them.
const (
	ScopeRead    Scopes = 1 << iota // reading: journals, leases, receipts, big values, pal.api.runs.get, the live feeds
	ScopeStart                      // making runs: start, resume, fork, retry
	ScopeApprove                    // a run's inputs: approve, budget, signal
	ScopeCancel                     // cancel
	ScopeDeploy                     // deploying workflows
	ScopeAdmin                      // all of the above, forcing a resume, and speaking for others

	// DefaultScopes is what a user or token written without scopes gets:
	// all but admin, acting only as itself.
	DefaultScopes = ScopeRead | ScopeStart | ScopeApprove | ScopeCancel | ScopeDeploy

	// ClientScopes are the client account's own user's (DefaultUser, in
	// pal dev and deploy/nats): every command on deployed workflows, but
	// no deploy, so a client starts what an operator deployed.
	ClientScopes = ScopeRead | ScopeStart | ScopeApprove | ScopeCancel
)

// scopeNames lists the scopes in the order they are written.
var scopeNames = []struct {
	s    Scopes
	name string
}{{ScopeRead, "read"}, {ScopeStart, "start"}, {ScopeApprove, "approve"}, {ScopeCancel, "cancel"},
	{ScopeDeploy, "deploy"}, {ScopeAdmin, "admin"}}

// Has reports whether ss grants s; admin grants everything.
func (ss Scopes) Has(s Scopes) bool { return ss&ScopeAdmin != 0 || ss&s == s }

// String writes ss as PAL_NATS_USERS does: "read+start".
func (ss Scopes) String() string {
	var parts []string
	for _, n := range scopeNames {
		if ss&n.s != 0 {
			parts = append(parts, n.name)
		}
	}
	return strings.Join(parts, "+")
}

// ScopeWords is how the scopes are written, for a message that lists
// them.
const ScopeWords = "read, start, approve, cancel, deploy or admin, joined by '+'"

// ScopeOf returns the scope written word; ok is false for none.
func ScopeOf(word string) (s Scopes, ok bool) {
	for _, n := range scopeNames {
		if n.name == word {
			return n.s, true
		}
	}
	return 0, false
}

// ScopeList reads the words of a list such as "read+start", each trimmed:
// their scopes; or bad, the position (from 1) of the first word that names
// no scope, of n words; or twice, a word listed again. The callers word
// their own refusals (ParseScopes, and REST's token list).
func ScopeList(list string) (ss Scopes, bad, n int, twice string) {
	words := strings.Split(list, "+")
	for i, w := range words {
		w = strings.TrimSpace(w)
		s, ok := ScopeOf(w)
		if !ok {
			return 0, i + 1, len(words), ""
		}
		if ss&s != 0 {
			return 0, 0, len(words), w
		}
		ss |= s
	}
	return ss, 0, len(words), ""
}

// ParseScopes reads "read+start". An unknown word is named by position.
func ParseScopes(list string) (Scopes, error) {
	const want = ScopeWords
	if strings.TrimSpace(list) == "" {
		return 0, fmt.Errorf("no scopes (want %s)", want)
	}
	ss, bad, n, twice := ScopeList(list)
	switch {
	case bad > 0:
		return 0, fmt.Errorf("scope %d of %d is not one of %s", bad, n, want)
	case twice != "":
		return 0, fmt.Errorf("scope %s is listed twice", twice)
	}
	return ss, nil
}

// The commands of pal.cmd.runs.<kind> and pal.api.runs.<kind> (runs.Cmd*
// names the same; a test there holds the two lists together) and the
// scope each needs. get is the service's read.
var commandScopes = []struct {
	kind  string
	scope Scopes
}{
	{"get", ScopeRead},
	{"start", ScopeStart}, {"resume", ScopeStart}, {"fork", ScopeStart}, {"retry", ScopeStart},
	{"approve", ScopeApprove}, {"budget", ScopeApprove}, {"signal", ScopeApprove},
	{"cancel", ScopeCancel},
}

// CommandScope returns the scope the command kind needs; ok is false for
// a kind PAL does not know.
func CommandScope(kind string) (s Scopes, ok bool) {
	for _, c := range commandScopes {
		if c.kind == kind {
			return c.scope, true
		}
	}
	return 0, false
}

// Commands lists the command kinds, get included, in a fixed order.
func Commands() []string {
	out := make([]string, len(commandScopes))
	for i, c := range commandScopes {
		out[i] = c.kind
	}
	return out
}
