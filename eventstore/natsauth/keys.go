package natsauth

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Keys holds one nkey user per role: its public key and its seed.
type Keys struct {
	pub  map[Role]string
	seed map[Role][]byte
}

// NewKeys makes a fresh nkey user for every role.
func NewKeys() (*Keys, error) {
	k := &Keys{pub: map[Role]string{}, seed: map[Role][]byte{}}
	for _, r := range Roles {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, fmt.Errorf("making the %s nkey: %w", r, err)
		}
		if err := k.add(r, kp); err != nil {
			return nil, err
		}
	}
	return k, nil
}

func (k *Keys) add(r Role, kp nkeys.KeyPair) error {
	pub, err := kp.PublicKey()
	if err != nil {
		return err
	}
	seed, err := kp.Seed()
	if err != nil {
		return err
	}
	k.pub[r], k.seed[r] = pub, seed
	return nil
}

// SeedFile is the name of role's seed file in a directory written by
// LoadOrCreate.
func SeedFile(role Role) string { return "nats-" + string(role) + ".nk" }

// LoadOrCreate reads each role's seed from dir (SeedFile), making and
// writing the ones that are missing, mode 0600, so a client context saved
// once keeps working across restarts.
func LoadOrCreate(dir string) (*Keys, error) {
	k := &Keys{pub: map[Role]string{}, seed: map[Role][]byte{}}
	for _, r := range Roles {
		path := filepath.Join(dir, SeedFile(r))
		raw, err := os.ReadFile(path)
		var kp nkeys.KeyPair
		switch {
		case err == nil:
			if kp, err = nkeys.FromSeed(bytes.TrimSpace(raw)); err != nil {
				return nil, fmt.Errorf("%s: not an nkey seed: %w", path, err)
			}
		case errors.Is(err, os.ErrNotExist):
			if kp, err = nkeys.CreateUser(); err != nil {
				return nil, fmt.Errorf("making the %s nkey: %w", r, err)
			}
			seed, err := kp.Seed()
			if err != nil {
				return nil, err
			}
			if err := writePrivate(path, append(seed, '\n')); err != nil {
				return nil, fmt.Errorf("writing %s: %w", path, err)
			}
		default:
			return nil, err
		}
		if err := k.add(r, kp); err != nil {
			return nil, err
		}
		// An older file may have been made with a wider mode.
		if err := os.Chmod(path, 0o600); err != nil {
			return nil, err
		}
	}
	return k, nil
}

func writePrivate(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Seed returns role's nkey seed.
func (k *Keys) Seed(role Role) []byte { return bytes.Clone(k.seed[role]) }

// Public returns role's public nkey.
func (k *Keys) Public(role Role) string { return k.pub[role] }

// Users returns the nkey users for server.Options.Nkeys, each with its
// role's permissions.
func (k *Keys) Users() []*server.NkeyUser {
	out := make([]*server.NkeyUser, 0, len(Roles))
	for _, r := range Roles {
		out = append(out, &server.NkeyUser{Nkey: k.pub[r], Permissions: For(r).Server()})
	}
	return out
}

// Option returns the connect option of role: it authenticates with the
// role's nkey, and PAL's own roles use PAL's Inbox.
func (k *Keys) Option(role Role) nats.Option {
	kp, _ := nkeys.FromSeed(k.seed[role]) // made or checked when k was
	auth := nats.Nkey(k.pub[role], func(nonce []byte) ([]byte, error) { return kp.Sign(nonce) })
	if role == Client || role == Admin {
		return auth
	}
	return func(o *nats.Options) error {
		if err := auth(o); err != nil {
			return err
		}
		return InboxOption()(o)
	}
}

// CredsOption reads PAL_NATS_CREDS-style credentials from path: a NATS
// creds file (a user JWT and its seed) or an nkey seed file.
func CredsOption(path string) (nats.Option, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if bytes.Contains(raw, []byte("BEGIN NATS USER JWT")) {
		return nats.UserCredentials(path), nil
	}
	opt, err := nats.NkeyOptionFromSeed(path)
	if err != nil {
		return nil, fmt.Errorf("%s: neither a creds file nor an nkey seed file: %w", path, err)
	}
	return opt, nil
}
