package natsauth

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// EnvUsers names PAL_NATS_USERS, the client users PAL's processes know
// (ParseUsers): who a NATS caller is and what it may do.
const EnvUsers = "PAL_NATS_USERS"

// User is a person, script or service in the client account. Its name
// is what PAL records of it (the starter of run_created, the approver of
// approval_received, …) and a subject token of its durable commands
// (CommandSubject); its scopes render into its NATS permissions.
type User struct {
	Name   string
	Scopes Scopes
	// Nkey is the user's public nkey (pal dev, the tests); empty for a
	// user that logs in with its name and a password (deploy/nats).
	Nkey string
}

// Users is the client account's users.
type Users []User

// maxUserName bounds a user's name.
const maxUserName = 64

// validUserName reports whether name can be a user: 1 to 64 of A-Z a-z
// 0-9 _ -, a single subject token.
func validUserName(name string) bool {
	if name == "" || len(name) > maxUserName {
		return false
	}
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
		default:
			return false
		}
	}
	return true
}

// ParseUsers reads PAL_NATS_USERS: comma-separated entries, each
// name[=NKEY][:scope+scope…], as Users.String writes them. Without scopes
// a user gets DefaultScopes; with an nkey it logs in with that key, else
// with its name and a password. Blank entries are ignored.
func ParseUsers(s string) (Users, error) {
	var out Users
	for i, raw := range strings.Split(s, ",") {
		entry := strings.TrimSpace(raw)
		if entry == "" {
			continue
		}
		u := User{Scopes: DefaultScopes}
		if who, scopes, ok := strings.Cut(entry, ":"); ok {
			ss, err := ParseScopes(scopes)
			if err != nil {
				return nil, fmt.Errorf("%s: user %d: %w", EnvUsers, i+1, err)
			}
			entry, u.Scopes = who, ss
		}
		u.Name, u.Nkey, _ = strings.Cut(entry, "=")
		if !validUserName(u.Name) {
			return nil, fmt.Errorf("%s: user %d: name %q: use 1 to %d letters, digits, '_' and '-'", EnvUsers, i+1, u.Name, maxUserName)
		}
		if u.Nkey != "" && !nkeys.IsValidPublicUserKey(u.Nkey) {
			return nil, fmt.Errorf("%s: user %s: %q is not a public user nkey (U…)", EnvUsers, u.Name, u.Nkey)
		}
		if _, dup := out.ByName(u.Name); dup {
			return nil, fmt.Errorf("%s: user %s is listed twice", EnvUsers, u.Name)
		}
		out = append(out, u)
	}
	return out, nil
}

// String writes us as PAL_NATS_USERS, which ParseUsers reads back.
func (us Users) String() string {
	parts := make([]string, len(us))
	for i, u := range us {
		parts[i] = u.Name
		if u.Nkey != "" {
			parts[i] += "=" + u.Nkey
		}
		parts[i] += ":" + u.Scopes.String()
	}
	return strings.Join(parts, ",")
}

// ByName returns the user called name.
func (us Users) ByName(name string) (User, bool) {
	for _, u := range us {
		if u.Name == name {
			return u, true
		}
	}
	return User{}, false
}

// CommandPrefix is where the client account's durable commands go:
// pal.cmd.runs.<kind>.<user>, captured by PAL_CMDS. The server lets a
// user publish only under its own name, so the subject says who sent it.
const CommandPrefix = "pal.cmd.runs."

// CommandSubject is the subject on which user sends durable commands of
// kind.
func CommandSubject(kind, user string) string { return CommandPrefix + kind + "." + user }

// requestInfo is the part of the server's Nats-Request-Info header PAL
// reads: the account a request came from and, as the client account's
// imports share it, the user that sent it (an nkey, or a name).
type requestInfo struct {
	Account string `json:"acc"`
	User    string `json:"user"`
}

// RequestInfoHeader is the header the server sets on a request that
// crossed an import into PAL's account. A client cannot forge it: the
// server replaces whatever the request carried.
const RequestInfoHeader = "Nats-Request-Info"

// ErrUnknownUser is a request from a client user PAL_NATS_USERS does not
// list.
var ErrUnknownUser = errors.New("a NATS user PAL does not know")

// Requester returns the client user that sent a request to PAL's account,
// as the server says in Nats-Request-Info. fromClient is false for a
// request from PAL's own account, which crossed no import (no header).
// Errors: ErrUnknownUser for a user us does not list, or a request from
// another account.
func (us Users) Requester(h nats.Header) (u User, fromClient bool, err error) {
	raw := h.Get(RequestInfoHeader)
	if raw == "" {
		return User{}, false, nil
	}
	var ri requestInfo
	if err := json.Unmarshal([]byte(raw), &ri); err != nil {
		return User{}, true, fmt.Errorf("%w: unreadable %s header", ErrUnknownUser, RequestInfoHeader)
	}
	if ri.Account != ClientAccount {
		return User{}, true, fmt.Errorf("%w: a request from account %q", ErrUnknownUser, ri.Account)
	}
	for _, u := range us {
		if (u.Nkey != "" && u.Nkey == ri.User) || (u.Nkey == "" && u.Name == ri.User) {
			return u, true, nil
		}
	}
	return User{}, true, fmt.Errorf("%w: %q is not in %s", ErrUnknownUser, clip(ri.User, 64), EnvUsers)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
