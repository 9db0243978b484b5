package natsauth

import (
	"fmt"
	"strings"
)

//go:generate go test -run TestDeployRoles -update .

// PasswordVar is the environment variable of nats-server that holds
// role's password in the deploy configs: PAL_NATS_WORKER_PASSWORD and so
// on.
func PasswordVar(role Role) string {
	return "PAL_NATS_" + strings.ToUpper(string(role)) + "_PASSWORD"
}

// Conf renders the roles as a nats-server authorization block with one
// user per role (named for the role, its password from PasswordVar), for
// deploy/nats/roles.conf. A test keeps that file equal to it.
func Conf() string {
	var b strings.Builder
	b.WriteString(`# PAL's NATS roles: one user per role. Generated from eventstore/natsauth
# (go generate ./eventstore/natsauth); do not edit by hand.
#
# nats-server reads each password from its environment:
`)
	for _, r := range Roles {
		fmt.Fprintf(&b, "#   %s\n", PasswordVar(r))
	}
	b.WriteString("# A PAL process connects as its role with nats://<role>:<password>@host:4222\n")
	b.WriteString("# in PAL_NATS_URL. Any PAL_REPLY_PREFIX must be added to the worker's and\n")
	b.WriteString("# the api's publish allow lists, and to the client's subscribe list.\n")
	b.WriteString("authorization {\n")
	for _, r := range Roles {
		p := For(r)
		fmt.Fprintf(&b, "  %s = {\n", permVar(r))
		writePerm(&b, "publish", p.PubAllow, p.PubDeny)
		writePerm(&b, "subscribe", p.SubAllow, p.SubDeny)
		b.WriteString("  }\n")
	}
	b.WriteString("  users = [\n")
	for _, r := range Roles {
		fmt.Fprintf(&b, "    { user = %q, password = $%s, permissions = $%s }\n", string(r), PasswordVar(r), permVar(r))
	}
	b.WriteString("  ]\n}\n")
	return b.String()
}

func permVar(r Role) string { return "PAL_" + strings.ToUpper(string(r)) }

func writePerm(b *strings.Builder, name string, allow, deny []string) {
	if allow == nil && deny == nil {
		return
	}
	fmt.Fprintf(b, "    %s = {\n", name)
	list := func(key string, subjects []string) {
		if subjects == nil {
			return
		}
		fmt.Fprintf(b, "      %s = [\n", key)
		for _, s := range subjects {
			fmt.Fprintf(b, "        %q\n", s)
		}
		b.WriteString("      ]\n")
	}
	list("allow", allow)
	list("deny", deny)
	b.WriteString("    }\n")
}
