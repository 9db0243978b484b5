package natsauth

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

//go:generate go test -run TestDeployRoles -update .

// PasswordVar is the environment variable of nats-server that holds
// role's password in the deploy configs: PAL_NATS_WORKER_PASSWORD and so
// on (PAL_NATS_CLIENT_PASSWORD for the client account's DefaultUser).
func PasswordVar(role Role) string {
	return "PAL_NATS_" + strings.ToUpper(string(role)) + "_PASSWORD"
}

// UserPasswordVar is the variable that holds a client user's password in
// a config rendered with passwords: PasswordVar(Client) for DefaultUser,
// PAL_NATS_USER_<NAME>_PASSWORD for another.
func UserPasswordVar(name string) string {
	if name == DefaultUser {
		return PasswordVar(Client)
	}
	return "PAL_NATS_USER_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")) + "_PASSWORD"
}

// DeployUsers are the client users of deploy/nats: DefaultUser with
// ClientScopes, logging in with a password. PAL's processes know them
// when PAL_NATS_USERS is not set.
func DeployUsers() Users { return Users{{Name: DefaultUser, Scopes: ClientScopes}} }

// Conf renders the accounts as a nats-server config: PAL's roles (named
// for the role, the password from PasswordVar) and users (named, the
// password from UserPasswordVar), for deploy/nats/roles.conf, which is
// Conf(DeployUsers()) (a test keeps it so). A user with an Nkey logs in
// with it instead.
func Conf(users Users) string {
	var b strings.Builder
	b.WriteString(`# PAL's NATS accounts: PAL's processes, one user per role, in account PAL;
# people, scripts and services in account PAL_CLIENTS, which reaches PAL
# only through its imports. Generated from eventstore/natsauth
# (go generate ./eventstore/natsauth); do not edit by hand.
#
# nats-server reads each password from its environment:
`)
	for _, r := range Roles {
		fmt.Fprintf(&b, "#   %s\n", PasswordVar(r))
	}
	for _, u := range users {
		if u.Nkey == "" {
			fmt.Fprintf(&b, "#   %s (client user %s: %s)\n", UserPasswordVar(u.Name), u.Name, u.Scopes)
		}
	}
	b.WriteString(`# A PAL process connects as its role with nats://<role>:<password>@host:4222
# in PAL_NATS_URL, and knows the client users from PAL_NATS_USERS (unset:
# client with read+start+approve+cancel, as here). Any PAL_REPLY_PREFIX
# must be added to the worker's and the api's publish allow lists, to the
# client users' subscribe lists, and as a stream export and import.
`)
	render(&b, func(r Role) string {
		return fmt.Sprintf("user = %q, password = $%s", string(r), PasswordVar(r))
	}, users)
	return b.String()
}

// Conf renders the accounts with k's nkeys, PAL's roles and users, for an
// embedded server (ServerOptions).
func (k *Keys) Conf(users Users) string {
	var b strings.Builder
	b.WriteString("# PAL's NATS accounts with nkey users (eventstore/natsauth).\n")
	render(&b, func(r Role) string { return fmt.Sprintf("nkey = %q", k.Public(r)) }, users)
	return b.String()
}

// ServerOptions returns the options of a server with PAL's accounts, k's
// nkeys for the roles, and users (their Nkey set: Keys.Users), to which
// the caller adds where to listen and store.
func (k *Keys) ServerOptions(users Users) (*server.Options, error) {
	for _, u := range users {
		if u.Nkey == "" {
			return nil, fmt.Errorf("client user %s has no nkey", u.Name)
		}
	}
	var opts server.Options
	if err := opts.ProcessConfigString(k.Conf(users)); err != nil {
		return nil, fmt.Errorf("PAL's NATS accounts: %w", err)
	}
	return &opts, nil
}

// render writes the permission variables of the roles and the two
// accounts; roleLogin is how a role logs in.
func render(b *strings.Builder, roleLogin func(Role) string, users Users) {
	for _, r := range Roles {
		p := For(r)
		fmt.Fprintf(b, "%s = {\n", permVar(r))
		writePerm(b, "  ", "publish", p.PubAllow, p.PubDeny)
		writePerm(b, "  ", "subscribe", p.SubAllow, p.SubDeny)
		b.WriteString("}\n")
	}
	links := Links()
	fmt.Fprintf(b, "accounts {\n  %s {\n    jetstream = enabled\n    users = [\n", PALAccount)
	for _, r := range Roles {
		fmt.Fprintf(b, "      { %s, permissions = $%s }\n", roleLogin(r), permVar(r))
	}
	b.WriteString("    ]\n    exports = [\n")
	for _, l := range links {
		kind, extra := "service", ""
		switch {
		case l.Stream:
			kind = "stream"
		case l.Many:
			extra = ", response_type = stream"
		}
		fmt.Fprintf(b, "      { %s = %q, accounts = [%s]%s }\n", kind, l.Subject, ClientAccount, extra)
	}
	fmt.Fprintf(b, "    ]\n  }\n  %s {\n    users = [\n", ClientAccount)
	for _, u := range users {
		login := fmt.Sprintf("user = %q, password = $%s", u.Name, UserPasswordVar(u.Name))
		if u.Nkey != "" {
			login = fmt.Sprintf("nkey = %q", u.Nkey)
		}
		fmt.Fprintf(b, "      # %s: %s\n      { %s, permissions = {\n", u.Name, u.Scopes, login)
		p := UserPermissions(u)
		writePerm(b, "        ", "publish", p.PubAllow, p.PubDeny)
		writePerm(b, "        ", "subscribe", p.SubAllow, p.SubDeny)
		b.WriteString("      } }\n")
	}
	b.WriteString("    ]\n    imports = [\n")
	for _, l := range links {
		kind := "service"
		if l.Stream {
			kind = "stream"
		}
		fmt.Fprintf(b, "      { %s = { account = %s, subject = %q }", kind, PALAccount, l.Subject)
		if l.To != "" {
			fmt.Fprintf(b, ", to = %q", l.To)
		}
		if l.Share {
			b.WriteString(", share = true")
		}
		b.WriteString(" }\n")
	}
	b.WriteString("    ]\n  }\n}\n")
}

func permVar(r Role) string { return "PAL_" + strings.ToUpper(string(r)) }

func writePerm(b *strings.Builder, indent, name string, allow, deny []string) {
	if allow == nil && deny == nil {
		return
	}
	fmt.Fprintf(b, "%s%s = {\n", indent, name)
	list := func(key string, subjects []string) {
		if subjects == nil {
			return
		}
		fmt.Fprintf(b, "%s  %s = [\n", indent, key)
		for _, s := range subjects {
			fmt.Fprintf(b, "%s    %q\n", indent, s)
		}
		fmt.Fprintf(b, "%s  ]\n", indent)
	}
	list("allow", allow)
	list("deny", deny)
	fmt.Fprintf(b, "%s}\n", indent)
}
