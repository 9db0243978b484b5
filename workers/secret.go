package workers

import (
	"context"
	"fmt"
	"os"
	"regexp"

	"github.com/palrun/pal/workflow"
)

// SecretEnvPrefix prefixes the worker variables that hold secrets:
// {{secrets.NAME}} reads PAL_SECRET_NAME.
const SecretEnvPrefix = "PAL_SECRET_"

// envSecret is the default Config.Secrets.
func envSecret(name string) (string, bool) { return os.LookupEnv(SecretEnvPrefix + name) }

// renderedRef is a secret reference as templates render it; definedRef is
// one as a workflow may write it.
var (
	renderedRef = regexp.MustCompile(`\{\{secrets\.([A-Za-z0-9_-]+)\}\}`)
	definedRef  = regexp.MustCompile(`\{\{\s*secrets\.([A-Za-z0-9_-]+)\s*\}\}`)
)

// secrets resolves the secret references of one step as it sends. Only
// names the node's own definition names resolve: a reference that arrived
// in data (the run input, a step's output, a model's tool call) could
// otherwise send any secret of the worker wherever that data points.
type secrets struct {
	named  map[string]bool
	lookup func(string) (string, bool)
	used   []string // values handed out, masked in errors
}

func (w *Worker) secretsFor(node *workflow.Node) *secrets {
	s := &secrets{named: map[string]bool{}, lookup: w.cfg.Secrets}
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
		if s == nil || !s.named[name] {
			err = permanent("secret reference %s does not come from the node's definition (it arrived in data); PAL resolves only the secrets a node names itself", ref)
			return ref
		}
		val, ok := s.lookup(name)
		if !ok {
			err = permanent("secret %s is not set on worker: set %s%s", ref, SecretEnvPrefix, name)
			return ref
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

type secretsKey struct{}

func secretsFromContext(ctx context.Context) *secrets {
	s, _ := ctx.Value(secretsKey{}).(*secrets)
	return s
}
