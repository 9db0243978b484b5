package pgcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"
)

// PasswordFile is the file in a cluster's data directory that holds the
// postgres superuser's password, mode 0600. Init generates it; it lives as
// long as the cluster.
const PasswordFile = "pal-password"

// hbaConf is the pg_hba.conf of every cluster PAL makes: no trust, so a
// local user without the password gets nothing, on TCP or the Unix socket.
const hbaConf = `# Written by PAL (internal/pgcluster). Every connection needs the postgres
# password (scram-sha-256), which is in pal-password next to this file. The
# server listens on 127.0.0.1 only.
# TYPE  DATABASE     USER  ADDRESS       METHOD
local   all          all                 scram-sha-256
host    all          all   127.0.0.1/32  scram-sha-256
host    all          all   ::1/128       scram-sha-256
local   replication  all                 scram-sha-256
host    replication  all   127.0.0.1/32  scram-sha-256
host    replication  all   ::1/128       scram-sha-256
`

// newPassword returns a random password that needs no escaping in a URL.
func newPassword() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generating the PostgreSQL password: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// writeSecret writes content to path with mode 0600, for the server's user.
func writeSecret(u serverUser, path, content string) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	// WriteFile keeps the mode of a file that exists.
	if err := os.Chmod(path, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return u.chown(path)
}

// readPassword returns the password in dataDir's PasswordFile, or "" if the
// cluster has none (made before PAL set passwords; see secure).
func readPassword(dataDir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, PasswordFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the PostgreSQL password: %w", err)
	}
	pw := strings.TrimSpace(string(b))
	if pw == "" {
		return "", fmt.Errorf("the PostgreSQL password file %s is empty", filepath.Join(dataDir, PasswordFile))
	}
	return pw, nil
}

// secure gives a running cluster that has no password yet (made with trust
// authentication) the password and pg_hba.conf Init gives new ones, then
// restarts it so that no connection is trusted any more. The restart, not a
// reload, makes the change certain before secure returns.
func (c *Cluster) secure(ctx context.Context) error {
	pw, err := newPassword()
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return fmt.Errorf("connecting to set the postgres password: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// The password is hex: it needs no quoting beyond the quotes.
	if _, err := conn.Exec(ctx, "SET password_encryption = 'scram-sha-256'; ALTER ROLE postgres PASSWORD '"+pw+"'"); err != nil {
		return fmt.Errorf("setting the postgres password: %w", err)
	}
	if err := writeSecret(c.user, filepath.Join(c.dataDir, PasswordFile), pw+"\n"); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(c.dataDir, "pg_hba.conf"), []byte(hbaConf), 0o600); err != nil {
		return fmt.Errorf("writing pg_hba.conf: %w", err)
	}
	c.mu.Lock()
	c.password = pw
	c.mu.Unlock()
	if err := c.Stop(ctx, StopFast); err != nil {
		return err
	}
	return c.Start(ctx)
}
