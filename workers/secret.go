package workers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/egress"
	"github.com/palrun/pal/workflow"
)

// SecretEnvPrefix prefixes the worker variables that hold secrets:
// {{secrets.NAME}} reads PAL_SECRET_NAME, and it is sent only to the hosts
// PAL_SECRET_NAME_HOSTS lists (SecretHostsSuffix).
const SecretEnvPrefix = "PAL_SECRET_"

// SecretHostsSuffix ends the variable that binds a secret to the hosts it
// may be sent to: PAL_SECRET_<NAME>_HOSTS, a comma-separated list of host
// names or addresses, each alone (any port) or as host:port (IPv6 in
// brackets). A secret with no hosts bound is sent nowhere.
const SecretHostsSuffix = "_HOSTS"

// envSecret is the default Config.Secrets.
func envSecret(name string) (string, bool) { return os.LookupEnv(SecretEnvPrefix + name) }

// envSecretHosts is the default Config.SecretHosts.
func envSecretHosts(name string) (string, bool) {
	return os.LookupEnv(SecretEnvPrefix + name + SecretHostsSuffix)
}

// renderedRef is a secret reference as templates render it; definedRef is
// one as a workflow may write it.
var (
	renderedRef = regexp.MustCompile(`\{\{secrets\.([A-Za-z0-9_-]+)\}\}`)
	definedRef  = regexp.MustCompile(`\{\{\s*secrets\.([A-Za-z0-9_-]+)\s*\}\}`)
)

// secrets resolves the secret references of one step as it sends, and
// says where the values may go. A secret resolves only
//
//   - in a run of a deployed workflow (run_created names one: what runs
//     is what an operator deployed, not what a caller sent);
//   - when the node's own definition names it: a reference that arrived
//     in data (the run input, a step's output, a model's tool call) could
//     otherwise send any secret of the worker wherever that data points;
//   - towards the hosts its PAL_SECRET_<NAME>_HOSTS binds it to, checked
//     where the destination is known (allowTo): before the request, and
//     at every redirect.
type secrets struct {
	runID    string
	deployed *event.Deployed
	named    map[string]bool
	lookup   func(string) (string, bool)
	hosts    func(string) (string, bool)
	used     []string // values handed out, masked in errors
	names    []string // the names of used, for allowTo
}

// secretsFor returns the secrets of this call's step, of node.
func (c *call) secretsFor(node *workflow.Node) *secrets {
	s := &secrets{runID: c.d.runID, deployed: c.deployed, named: map[string]bool{},
		lookup: c.d.w.cfg.Secrets, hosts: c.d.w.cfg.SecretHosts}
	if node != nil {
		for _, m := range definedRef.FindAllSubmatch(node.Data, -1) {
			s.named[string(m[1])] = true
		}
	}
	return s
}

// expand replaces the secret references in v by their values.
func (s *secrets) expand(v string) (string, error) {
	var err error
	out := renderedRef.ReplaceAllStringFunc(v, func(ref string) string {
		name := renderedRef.FindStringSubmatch(ref)[1]
		if err != nil {
			return ref
		}
		switch {
		case s == nil || !s.named[name]:
			err = permanent("secret reference %s does not come from the node's definition (it arrived in data); PAL resolves only the secrets a node names itself", ref)
			return ref
		case s.deployed == nil:
			err = permanent("secret %s resolves only in a run of a deployed workflow, and run %s names none (it predates deployed workflows, or is a plain-LLM run): start a deployed workflow", ref, s.runID)
			return ref
		case strings.HasSuffix(name, SecretHostsSuffix):
			err = permanent("secret %s: a name ending in %s is taken by the hosts variable of another secret (%s%s)", ref, SecretHostsSuffix, SecretEnvPrefix, name)
			return ref
		}
		val, ok := s.lookup(name)
		if !ok {
			err = permanent("secret %s is not set on worker: set %s%s", ref, SecretEnvPrefix, name)
			return ref
		}
		if !slices.Contains(s.names, name) {
			s.names = append(s.names, name)
		}
		s.used = append(s.used, val)
		return val
	})
	return out, err
}

// expandAll expands v and every value of headers, returning new copies.
func (s *secrets) expandAll(v string, headers map[string]string) (string, map[string]string, error) {
	out, err := s.expand(v)
	if err != nil {
		return "", nil, err
	}
	if headers == nil {
		return out, nil, nil
	}
	h := make(map[string]string, len(headers))
	for k, hv := range headers {
		if h[k], err = s.expand(hv); err != nil {
			return "", nil, fmt.Errorf("header %s: %w", k, err)
		}
	}
	return out, h, nil
}

// allowTo refuses a destination that a secret this step resolved is not
// bound to: a *SecretHostError, and nothing may be sent there. A step that
// resolved no secret may go anywhere (the egress policy still applies).
func (s *secrets) allowTo(u *url.URL) error {
	if s == nil || len(s.names) == 0 {
		return nil
	}
	host, port := destination(u)
	for _, name := range s.names {
		list, _ := s.hosts(name)
		bound, err := ParseSecretHosts(list)
		if err != nil {
			return permanent("%s%s%s: %v", SecretEnvPrefix, name, SecretHostsSuffix, err)
		}
		if !slices.ContainsFunc(bound, func(b SecretHost) bool { return b.matches(host, port) }) {
			return &SecretHostError{Name: name, Host: net.JoinHostPort(host, port), Bound: bound}
		}
	}
	return nil
}

// allowToURL is allowTo for a URL as written (a connector's).
func (s *secrets) allowToURL(raw string) error {
	if s == nil || len(s.names) == 0 {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return permanent("a secret goes only to the hosts it is bound to, and this URL names no host")
	}
	return s.allowTo(u)
}

// destination is the host (lower case, no trailing dot, no brackets) and
// port a request to u goes to; the port is the scheme's when u has none.
func destination(u *url.URL) (host, port string) {
	host = strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	port = u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[strings.ToLower(u.Scheme)]
	}
	return host, port
}

// SecretHostError refuses to send a secret to a host its
// PAL_SECRET_<NAME>_HOSTS does not list. It names the secret and the
// host, never the value; the step fails without sending and without a
// retry.
type SecretHostError struct {
	// Name is the secret's, Host the destination (host:port).
	Name, Host string
	// Bound is what PAL_SECRET_<NAME>_HOSTS lists.
	Bound []SecretHost
}

func (e *SecretHostError) Error() string {
	if len(e.Bound) == 0 {
		return fmt.Sprintf("secret %s may not be sent to %s: no hosts are bound to it (set %s%s%s to the hosts it may go to); nothing was sent",
			e.Name, e.Host, SecretEnvPrefix, e.Name, SecretHostsSuffix)
	}
	bound := make([]string, len(e.Bound))
	for i, b := range e.Bound {
		bound[i] = b.String()
	}
	return fmt.Sprintf("secret %s may not be sent to %s: %s%s%s binds it to %s only; nothing was sent",
		e.Name, e.Host, SecretEnvPrefix, e.Name, SecretHostsSuffix, strings.Join(bound, ", "))
}

// Is makes the refusal permanent: no retry sends it elsewhere.
func (e *SecretHostError) Is(target error) bool { return target == errPermanent }

// SecretHost is one entry of PAL_SECRET_<NAME>_HOSTS: a host name or
// address, and a port or "" for any.
type SecretHost struct {
	Host string
	Port string
}

func (h SecretHost) String() string {
	if h.Port == "" {
		return h.Host
	}
	return net.JoinHostPort(h.Host, h.Port)
}

// matches reports whether a request to host:port may carry the secret.
// Addresses compare as addresses (::1 and 0::1 are one), names as
// written, lower case: a name does not stand for its subdomains.
func (h SecretHost) matches(host, port string) bool {
	if h.Port != "" && h.Port != port {
		return false
	}
	if a, err := netip.ParseAddr(h.Host); err == nil {
		b, err := netip.ParseAddr(host)
		return err == nil && a.Unmap() == b.Unmap()
	}
	return h.Host == host
}

// MaxSecretHosts bounds the entries of one PAL_SECRET_<NAME>_HOSTS.
const MaxSecretHosts = 64

// ParseSecretHosts reads a PAL_SECRET_<NAME>_HOSTS value: comma-separated
// host names or addresses, each alone (any port) or host:port, an IPv6
// address in brackets when it has a port. Empty is no host: the secret is
// sent nowhere.
func ParseSecretHosts(list string) ([]SecretHost, error) {
	var out []SecretHost
	for i, raw := range strings.Split(list, ",") {
		entry := strings.TrimSpace(raw)
		if entry == "" {
			continue
		}
		if len(out) == MaxSecretHosts {
			return nil, fmt.Errorf("more than %d hosts", MaxSecretHosts)
		}
		h, err := parseSecretHost(entry)
		if err != nil {
			return nil, fmt.Errorf("host %d %q: %w", i+1, clip(entry, 80), err)
		}
		out = append(out, h)
	}
	return out, nil
}

// errNotAHost says what a PAL_SECRET_<NAME>_HOSTS entry must be.
var errNotAHost = errors.New("want a host name (letters, digits, '-', '.'), an IP address, or either with :port (no scheme, path or wildcard)")

func parseSecretHost(entry string) (SecretHost, error) {
	if strings.ContainsAny(entry, "/@*?# ") {
		return SecretHost{}, errNotAHost
	}
	var h SecretHost
	if host, port, err := net.SplitHostPort(entry); err == nil {
		p, perr := strconv.Atoi(port)
		if perr != nil || p < 1 || p > 65535 || strconv.Itoa(p) != port {
			return SecretHost{}, fmt.Errorf("port %q: want 1 to 65535", port)
		}
		h = SecretHost{Host: host, Port: port}
	} else {
		h.Host = strings.TrimSuffix(strings.TrimPrefix(entry, "["), "]")
	}
	h.Host = egress.NormalHost(h.Host)
	if _, err := netip.ParseAddr(h.Host); err == nil {
		return h, nil
	}
	if !egress.ValidHost(h.Host) {
		return SecretHost{}, errNotAHost
	}
	return h, nil
}

// CheckSecretHosts parses every PAL_SECRET_<NAME>_HOSTS of environ (as
// os.Environ lists it), so a worker refuses a bad list when it starts
// rather than at the first step that sends the secret.
func CheckSecretHosts(environ []string) error {
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, SecretEnvPrefix) || !strings.HasSuffix(k, SecretHostsSuffix) {
			continue
		}
		if _, err := ParseSecretHosts(v); err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	return nil
}

type secretsKey struct{}

func secretsFromContext(ctx context.Context) *secrets {
	s, _ := ctx.Value(secretsKey{}).(*secrets)
	return s
}
