package natsauth

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// DefaultUser is the client account's own user of pal dev and the tests
// (the Client role): it has ClientScopes, so it starts, approves and
// cancels runs of deployed workflows and deploys none. Its seed is
// SeedFile(Client).
const DefaultUser = "client"

// Keys holds an nkey per role of PAL's account and per client user.
type Keys struct {
	pub  map[string]string // by keyName
	seed map[string][]byte
}

// keyName is the key of role, or of user name with role "".
func keyName(role Role, user string) string {
	if role == Client {
		user = DefaultUser
	}
	if user != "" {
		return "user:" + user
	}
	return string(role)
}

// keyNames lists the keys of the roles, the default user and users.
func keyNames(users []string) []string {
	var out []string
	for _, r := range Roles {
		out = append(out, keyName(r, ""))
	}
	out = append(out, keyName(Client, ""))
	for _, u := range users {
		if n := keyName("", u); !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// fileOf is the seed file of a key name.
func fileOf(name string) string {
	if user, ok := cutUser(name); ok {
		return UserSeedFile(user)
	}
	return SeedFile(Role(name))
}

func cutUser(name string) (string, bool) {
	if len(name) > 5 && name[:5] == "user:" {
		return name[5:], true
	}
	return "", false
}

// NewKeys makes a fresh nkey for every role, DefaultUser and the users
// named.
func NewKeys(users ...string) (*Keys, error) {
	k := &Keys{pub: map[string]string{}, seed: map[string][]byte{}}
	for _, n := range keyNames(users) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, fmt.Errorf("making the %s nkey: %w", n, err)
		}
		if err := k.add(n, kp); err != nil {
			return nil, err
		}
	}
	return k, nil
}

func (k *Keys) add(name string, kp nkeys.KeyPair) error {
	pub, err := kp.PublicKey()
	if err != nil {
		return err
	}
	seed, err := kp.Seed()
	if err != nil {
		return err
	}
	k.pub[name], k.seed[name] = pub, seed
	return nil
}

// SeedFile is the name of role's seed file in a directory written by
// LoadOrCreate; SeedFile(Client) is DefaultUser's.
func SeedFile(role Role) string { return "nats-" + string(role) + ".nk" }

// UserSeedFile is the name of a client user's seed file.
func UserSeedFile(name string) string {
	if name == DefaultUser {
		return SeedFile(Client)
	}
	return "nats-user-" + name + ".nk"
}

// LoadOrCreate reads each role's, DefaultUser's and the named users' seeds
// from dir (SeedFile, UserSeedFile), making and writing the ones that are
// missing, mode 0600, so a client context saved once keeps working across
// restarts.
func LoadOrCreate(dir string, users ...string) (*Keys, error) {
	k := &Keys{pub: map[string]string{}, seed: map[string][]byte{}}
	for _, n := range keyNames(users) {
		path := filepath.Join(dir, fileOf(n))
		raw, err := os.ReadFile(path)
		var kp nkeys.KeyPair
		switch {
		case err == nil:
			if kp, err = nkeys.FromSeed(bytes.TrimSpace(raw)); err != nil {
				return nil, fmt.Errorf("%s: not an nkey seed: %w", path, err)
			}
		case errors.Is(err, os.ErrNotExist):
			if kp, err = nkeys.CreateUser(); err != nil {
				return nil, fmt.Errorf("making the %s nkey: %w", n, err)
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
		if err := k.add(n, kp); err != nil {
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

// Seed returns role's nkey seed (Client: DefaultUser's).
func (k *Keys) Seed(role Role) []byte { return bytes.Clone(k.seed[keyName(role, "")]) }

// Public returns role's public nkey (Client: DefaultUser's).
func (k *Keys) Public(role Role) string { return k.pub[keyName(role, "")] }

// UserPublic returns a client user's public nkey ("" when k has none).
func (k *Keys) UserPublic(name string) string { return k.pub[keyName("", name)] }

// Users returns DefaultUser, with ClientScopes, and users, each with its
// nkey from k unless it has one: the client users of an embedded server
// (ServerOptions) and of PAL's processes beside it (PAL_NATS_USERS).
// Errors: a user k holds no key for.
func (k *Keys) Users(users Users) (Users, error) {
	out := Users{{Name: DefaultUser, Scopes: ClientScopes, Nkey: k.UserPublic(DefaultUser)}}
	for _, u := range users {
		if u.Name == DefaultUser {
			continue
		}
		if u.Nkey == "" {
			u.Nkey = k.UserPublic(u.Name)
		}
		if u.Nkey == "" {
			return nil, fmt.Errorf("client user %s: no nkey made for it", u.Name)
		}
		out = append(out, u)
	}
	return out, nil
}

// Option returns the connect option of role: it authenticates with the
// role's nkey, and PAL's own roles (admin too) use PAL's Inbox. Client
// connects as DefaultUser.
func (k *Keys) Option(role Role) nats.Option {
	if role == Client {
		return k.UserOption(DefaultUser)
	}
	return k.option(keyName(role, ""), true)
}

// UserOption returns the connect option of a client user: its nkey, and
// the standard inbox (_INBOX), which the client account imports.
func (k *Keys) UserOption(name string) nats.Option { return k.option(keyName("", name), false) }

func (k *Keys) option(name string, palInbox bool) nats.Option {
	kp, err := nkeys.FromSeed(k.seed[name]) // made or checked when k was
	auth := nats.Nkey(k.pub[name], func(nonce []byte) ([]byte, error) {
		if err != nil {
			return nil, fmt.Errorf("no nkey for %s", name)
		}
		return kp.Sign(nonce)
	})
	if !palInbox {
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

// LoadUsers is LoadOrCreate for the roles, DefaultUser and users, whose
// given nkeys are ignored: it returns the keys and the client users
// (Keys.Users) with the nkeys of their seed files in dir. pal dev and its
// cluster's nodes make the same users from the same directory this way.
func LoadUsers(dir string, users Users) (*Keys, Users, error) {
	names := make([]string, len(users))
	bare := make(Users, len(users))
	for i, u := range users {
		names[i] = u.Name
		u.Nkey = ""
		bare[i] = u
	}
	k, err := LoadOrCreate(dir, names...)
	if err != nil {
		return nil, nil, err
	}
	all, err := k.Users(bare)
	if err != nil {
		return nil, nil, err
	}
	return k, all, nil
}
