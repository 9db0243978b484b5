package natsauth_test

import (
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore/natsauth"
)

var update = flag.Bool("update", false, "rewrite deploy/nats/roles.conf from the Go definitions")

const rolesConf = "../../deploy/nats/roles.conf"

// setPasswords sets each role's and client user's password variable to
// "pw-<name>".
func setPasswords(t *testing.T) {
	for _, r := range natsauth.Roles {
		t.Setenv(natsauth.PasswordVar(r), "pw-"+string(r))
	}
	for _, u := range natsauth.DeployUsers() {
		t.Setenv(natsauth.UserPasswordVar(u.Name), "pw-"+u.Name)
	}
}

// TestDeployRoles: deploy/nats/roles.conf is what Conf renders, and every
// server config in deploy/nats includes it and gives each role of PAL's
// account and each client user exactly the account and permissions of
// its Go definition.
func TestDeployRoles(t *testing.T) {
	if *update {
		require.NoError(t, os.WriteFile(rolesConf, []byte(natsauth.Conf(natsauth.DeployUsers())), 0o644))
	}
	raw, err := os.ReadFile(rolesConf)
	require.NoError(t, err)
	require.Equal(t, natsauth.Conf(natsauth.DeployUsers()), string(raw), "deploy/nats/roles.conf is stale: run go generate ./eventstore/natsauth")

	setPasswords(t)
	confs, err := filepath.Glob("../../deploy/nats/*.conf")
	require.NoError(t, err)
	cluster, err := filepath.Glob("../../deploy/nats/cluster/*.conf")
	require.NoError(t, err)
	confs = append(confs, cluster...)
	n := 0
	for _, path := range confs {
		if filepath.Base(path) == "roles.conf" {
			continue
		}
		n++
		t.Run(strings.TrimPrefix(path, "../../"), func(t *testing.T) {
			opts, err := server.ProcessConfigFile(path)
			require.NoError(t, err)
			users := natsauth.DeployUsers()
			require.Len(t, opts.Users, len(natsauth.Roles)+len(users))
			byName := map[string]*server.User{}
			for _, u := range opts.Users {
				byName[u.Username] = u
			}
			for _, r := range natsauth.Roles {
				u := byName[string(r)]
				require.NotNil(t, u, "role %s", r)
				require.Equal(t, "pw-"+string(r), u.Password)
				require.Equal(t, natsauth.PALAccount, u.Account.Name)
				require.Equal(t, natsauth.For(r).Server(), u.Permissions, "role %s", r)
			}
			for _, cu := range users {
				u := byName[cu.Name]
				require.NotNil(t, u, "client user %s", cu.Name)
				require.Equal(t, "pw-"+cu.Name, u.Password)
				require.Equal(t, natsauth.ClientAccount, u.Account.Name)
				require.Equal(t, natsauth.UserPermissions(cu).Server(), u.Permissions, "client user %s", cu.Name)
			}
		})
	}
	require.Equal(t, 5, n, "server configs in deploy/nats")
}

// TestDeployConfigServes: a server started from deploy/nats/single.conf
// refuses an anonymous client, takes a role's user and password from the
// URL, and enforces the role.
func TestDeployConfigServes(t *testing.T) {
	setPasswords(t)
	opts, err := server.ProcessConfigFile("../../deploy/nats/single.conf")
	require.NoError(t, err)
	opts.Host, opts.Port, opts.HTTPPort, opts.StoreDir = "127.0.0.1", server.RANDOM_PORT, 0, t.TempDir()
	opts.NoSigs, opts.NoLog = true, true
	srv, err := server.NewServer(opts)
	require.NoError(t, err)
	srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	require.True(t, srv.ReadyForConnections(10*time.Second))
	addr := srv.Addr().(*net.TCPAddr)
	url := func(user string) string {
		if user == "" {
			return fmt.Sprintf("nats://127.0.0.1:%d", addr.Port)
		}
		return fmt.Sprintf("nats://%s:pw-%s@127.0.0.1:%d", user, user, addr.Port)
	}
	_, err = nats.Connect(url(""))
	require.ErrorIs(t, err, nats.ErrAuthorization)

	viol := make(chan error, 1)
	nc, err := nats.Connect(url("client"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { viol <- err }))
	require.NoError(t, err)
	defer nc.Close()
	require.NoError(t, nc.Publish("pal.events.run_x", nil))
	require.NoError(t, nc.Flush())
	select {
	case err := <-viol:
		require.ErrorIs(t, err, nats.ErrPermissionViolation)
	case <-time.After(10 * time.Second):
		t.Fatal("the client role published to pal.events")
	}
	// The client may call the service (no responder here: the server says so).
	_, err = nc.Request("pal.api.runs.get", []byte(`{}`), 2*time.Second)
	require.ErrorIs(t, err, nats.ErrNoResponders)
}
