package runs

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/palrun/pal/eventstore/natsauth"
)

// Caller is who sends a command over NATS, as the server says it: a user
// of the client account (natsauth.User, its name and scopes), or a
// process of PAL's own account. A body's by or approver never says who
// the caller is; it may only repeat the caller's name, unless the caller
// has scope admin (or is PAL), which may speak for others.
type Caller struct {
	Name   string
	Scopes natsauth.Scopes
	// pal: the command came from PAL's own account (no import crossed):
	// it may name anyone, and the body's names stand as given.
	pal bool
}

// PALCaller is a command from PAL's own account, named name in what it
// journals when its body names no one.
func PALCaller(name string) Caller { return Caller{Name: name, Scopes: natsauth.ScopeAdmin, pal: true} }

// UserCaller is a command from the client account's user u.
func UserCaller(u natsauth.User) Caller { return Caller{Name: u.Name, Scopes: u.Scopes} }

// Rights is what the caller may run: start from scope start, deploy
// from scope deploy; PAL's own account and scope admin may do all.
func (c Caller) Rights() Rights {
	var r Rights
	if c.Scopes.Has(natsauth.ScopeStart) {
		r |= RightStart
	}
	if c.Scopes.Has(natsauth.ScopeDeploy) {
		r |= RightDeploy
	}
	return r
}

// Reads refuses a caller without scope read what it asks (a run's view,
// the workflows, a consumer of its own). The server already keeps such a
// user off those subjects; this holds should a permission ever widen.
func (c Caller) Reads(what string) error {
	if c.Scopes.Has(natsauth.ScopeRead) {
		return nil
	}
	return &ForbiddenError{Msg: fmt.Sprintf("NATS user %s lacks scope read, which %s needs", c.Name, what)}
}

// may refuses a command of kind the caller has no scope for.
func (c Caller) may(kind string) error {
	need, ok := natsauth.CommandScope(kind)
	if !ok || c.Scopes.Has(need) {
		return nil // an unknown kind is refused by Do itself
	}
	return &ForbiddenError{Msg: fmt.Sprintf("NATS user %s lacks scope %s, which %s needs", c.Name, need, kind)}
}

// actingAs returns the name the command acts as when its body names one
// in field (approver, by): the caller's own name when the body leaves it
// out or repeats it. Naming anyone else needs scope admin. PAL's own
// account names whom it likes; its empty name stays empty (a required
// field is then refused as before) unless keep is false.
func (c Caller) actingAs(field, named string, keep bool) (string, error) {
	switch {
	case c.pal && (named != "" || keep):
		return named, nil
	case named == "" || named == c.Name:
		return c.Name, nil
	case c.Scopes.Has(natsauth.ScopeAdmin):
		return named, nil
	}
	// The named value is not quoted: it is the client's, of any size.
	return "", &ForbiddenError{Field: field, Msg: fmt.Sprintf(
		"NATS user %s lacks scope admin, which naming another %s needs (leave %s out, or set it to %s)",
		c.Name, field, field, c.Name)}
}

// force refuses a forced resume from a caller without scope admin.
func (c Caller) force(force bool) error {
	if force && !c.Scopes.Has(natsauth.ScopeAdmin) {
		return &ForbiddenError{Field: "force", Msg: fmt.Sprintf("NATS user %s lacks scope admin, which a forced resume needs", c.Name)}
	}
	return nil
}

// WithUsers sets the client users PAL knows (PAL_NATS_USERS): a request
// from any other user of the client account is refused.
func WithUsers(users natsauth.Users) Option { return func(c *Client) { c.users = users } }

// Requester returns the caller of a request to the NATS service, from
// the headers the server set on it (natsauth.Users.Requester); name is
// what a request from PAL's own account is called. Errors: a
// *ForbiddenError for a user PAL does not know.
func (c *Client) Requester(h nats.Header, name string) (Caller, error) {
	u, fromClient, err := c.users.Requester(h)
	switch {
	case err != nil:
		return Caller{}, &ForbiddenError{Msg: err.Error() + " (list it in " + natsauth.EnvUsers + ")"}
	case !fromClient:
		return PALCaller(name), nil
	}
	return UserCaller(u), nil
}

// commandCaller returns the kind of a durable command on subject and who
// sent it: pal.cmd.runs.<kind> comes from PAL's own account (only it can
// publish there), pal.cmd.runs.<kind>.<user> from that client user (the
// server lets a user publish only under its own name).
func (c *Client) commandCaller(subject string) (string, Caller, error) {
	rest := strings.TrimPrefix(subject, natsauth.CommandPrefix)
	kind, user, fromClient := strings.Cut(rest, ".")
	if !fromClient {
		return kind, PALCaller("pal.cmd"), nil
	}
	u, ok := c.users.ByName(user)
	if !ok {
		return kind, Caller{}, &ForbiddenError{Msg: fmt.Sprintf("%v: %q is not in %s", natsauth.ErrUnknownUser, clipName(user), natsauth.EnvUsers)}
	}
	return kind, UserCaller(u), nil
}

func clipName(s string) string { return truncate(s, 64) }
