package receipt

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Settings that name the keys (docs/architecture.md §14).
const (
	// EnvSigningKey names the current private key file: PEM "PRIVATE
	// KEY" (PKCS#8) holding an Ed25519 key, as openssl genpkey -algorithm
	// ed25519 writes it.
	EnvSigningKey = "PAL_SIGNING_KEY"
	// EnvOldKeys lists older public key files (PEM "PUBLIC KEY", PKIX),
	// comma-separated: keys retired by a rotation, served by GET /v1/keys
	// so receipts they signed stay verifiable.
	EnvOldKeys = "PAL_SIGNING_KEYS_OLD"
)

// maxKeyFile bounds a key file read.
const maxKeyFile = 16 << 10

// PublicKey is a verification key and its id.
type PublicKey struct {
	ID     string
	Public ed25519.PublicKey
}

// Key is a signing key.
type Key struct {
	PublicKey
	Private ed25519.PrivateKey
}

// KeyID is the id of a public key: the first 16 hex digits of the sha256
// of its 32 raw bytes.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// NewKey wraps a private key.
func NewKey(priv ed25519.PrivateKey) *Key {
	pub := priv.Public().(ed25519.PublicKey)
	return &Key{PublicKey: PublicKey{ID: KeyID(pub), Public: pub}, Private: priv}
}

func readPEM(path, want string) ([]byte, error) {
	b, err := readBounded(path)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != want {
		return nil, fmt.Errorf("%s is not a PEM %q block", path, want)
	}
	return blk.Bytes, nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, maxKeyFile+1)
	n, _ := f.Read(b)
	if n > maxKeyFile {
		return nil, fmt.Errorf("%s is larger than %d bytes: not a key file", path, maxKeyFile)
	}
	return b[:n], nil
}

// LoadKey reads a PEM PKCS#8 Ed25519 private key file.
func LoadKey(path string) (*Key, error) {
	der, err := readPEM(path, "PRIVATE KEY")
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", path, err)
	}
	priv, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("signing key %s is a %T, want Ed25519", path, k)
	}
	return NewKey(priv), nil
}

// LoadPublicKey reads a PEM PKIX Ed25519 public key file (the file
// WriteKey writes next to the private key, or openssl pkey -pubout).
func LoadPublicKey(path string) (PublicKey, error) {
	der, err := readPEM(path, "PUBLIC KEY")
	if err != nil {
		return PublicKey{}, fmt.Errorf("public key: %w", err)
	}
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return PublicKey{}, fmt.Errorf("public key %s: %w", path, err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return PublicKey{}, fmt.Errorf("public key %s is a %T, want Ed25519", path, k)
	}
	return PublicKey{ID: KeyID(pub), Public: pub}, nil
}

// PEMPublic encodes a public key as a PEM "PUBLIC KEY" block.
func PEMPublic(pub ed25519.PublicKey) []byte {
	der, _ := x509.MarshalPKIXPublicKey(pub) // cannot fail for Ed25519
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// WriteKey generates a key and writes it to priv (mode 0600) and its
// public half to priv's name with .pub for .key (mode 0644). It refuses to
// replace an existing file.
func WriteKey(priv string) (*Key, error) {
	_, sk, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(sk)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(priv), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(priv, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if err := errors.Join(pem.Encode(f, &pem.Block{Type: "PRIVATE KEY", Bytes: der}), f.Close()); err != nil {
		return nil, err
	}
	k := NewKey(sk)
	if err := os.WriteFile(PublicPath(priv), PEMPublic(k.Public), 0o644); err != nil {
		return nil, err
	}
	return k, nil
}

// PublicPath is where WriteKey puts the public key of priv.
func PublicPath(priv string) string { return strings.TrimSuffix(priv, ".key") + ".pub" }

// Keys is a signer's key set: the current key and the public keys of
// retired ones.
type Keys struct {
	Current *Key
	Old     []PublicKey
}

// LoadKeys reads PAL_SIGNING_KEY and PAL_SIGNING_KEYS_OLD as getenv gives
// them. No PAL_SIGNING_KEY gives nil and no error: nothing is signed.
func LoadKeys(getenv func(string) string) (*Keys, error) {
	path := getenv(EnvSigningKey)
	if path == "" {
		if getenv(EnvOldKeys) != "" {
			return nil, fmt.Errorf("%s is set but %s is not; set the current key too", EnvOldKeys, EnvSigningKey)
		}
		return nil, nil
	}
	cur, err := LoadKey(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", EnvSigningKey, err)
	}
	ks := &Keys{Current: cur}
	for _, p := range strings.Split(getenv(EnvOldKeys), ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		pk, err := LoadPublicKey(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvOldKeys, err)
		}
		ks.Old = append(ks.Old, pk)
	}
	return ks, nil
}

// Public lists every public key, the current one first.
func (ks *Keys) Public() []PublicKey {
	if ks == nil {
		return nil
	}
	return append([]PublicKey{ks.Current.PublicKey}, ks.Old...)
}

// KeyDoc is one key as GET /v1/keys serves it.
type KeyDoc struct {
	ID  string `json:"id"`
	Alg string `json:"alg"`
	// PublicKey is base64 (standard) of the 32 raw key bytes.
	PublicKey string `json:"public_key"`
	// PEM is the same key as a PEM "PUBLIC KEY" block, the --pubkey file
	// format of pal receipt verify.
	PEM     string `json:"pem"`
	Current bool   `json:"current"`
}

// Docs lists ks's public keys for GET /v1/keys.
func (ks *Keys) Docs() []KeyDoc {
	out := []KeyDoc{}
	for i, k := range ks.Public() {
		out = append(out, KeyDoc{ID: k.ID, Alg: Alg, PublicKey: base64.StdEncoding.EncodeToString(k.Public),
			PEM: string(PEMPublic(k.Public)), Current: i == 0})
	}
	return out
}
