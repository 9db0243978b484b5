package python_test

import (
	"archive/zip"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/internal/limit"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/projections"
)

// The tokens of the test's API: "ci" with the default scopes (all but
// admin) and "viewer" with scope read.
const (
	ciToken     = "ci-token-0123456789"
	viewerToken = "viewer-token-0123456789"
)

// TestPythonClient runs tests/test_client.py, the Python client's test,
// against a real PAL: embedded JetStream, Postgres, a worker, the
// projector and the REST API behind a proxy that cuts the first event
// stream of a cut- run short (cutProxy), and a second API whose tokens
// may open one event stream an hour, for a 429. python3 must be on PATH.
func TestPythonClient(t *testing.T) {
	python, err := exec.LookPath("python3")
	require.NoError(t, err, "the Python client's test needs python3 on PATH")
	ctx := context.Background()
	pool := testenv.Postgres(t).Pool(t)
	_, err = projections.Migrate(ctx, pool)
	require.NoError(t, err)
	st := paltest.New(t)
	st.Worker(t, "w1")
	st.Serve(t, "the projector", projections.New(pool, st.Store, projections.Config{Logger: paltest.Logger(t)}))
	tokens := []api.Token{{Name: "ci", Secret: ciToken}, {Name: "viewer", Secret: viewerToken, Scopes: api.ScopeRead}}
	serve := func(name string, lim *limit.Limiter) string {
		srv := api.NewServer("127.0.0.1:0", api.NewHandler(api.HandlerConfig{Store: st.Store, NC: st.NC,
			Runs: projections.NewReader(pool), Tokens: tokens, Limiter: lim, Logger: paltest.Logger(t)}), paltest.Logger(t))
		st.Serve(t, name, srv)
		return srv.URL()
	}
	rest := serve("the REST API", nil)
	// On a clock that stands still, so the one stream an hour stays spent.
	now := time.Now()
	few := limit.Defaults()
	few.Streams = limit.Rate{N: 1, Per: time.Hour, Burst: 1}
	limited := serve("the REST API with few streams", limit.New(few, func() time.Time { return now }))
	proxy := newCutProxy(t, strings.TrimPrefix(rest, "http://"))

	dir, err := filepath.Abs(".")
	require.NoError(t, err)
	pctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(pctx, python, "-B", filepath.Join("tests", "test_client.py"), "-v")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PYTHONPATH="+dir, "PYTHONDONTWRITEBYTECODE=1",
		"PAL_URL=http://"+proxy.addr(), "PAL_TOKEN="+ciToken, "PAL_READ_TOKEN="+viewerToken,
		"PAL_LIMITED_URL="+limited, "PAL_CUT_PREFIX="+cutPrefix)
	out, err := cmd.CombinedOutput()
	t.Logf("python3 tests/test_client.py:\n%s", out)
	require.NoError(t, err, "python3 tests/test_client.py failed:\n%s", out)

	// The client was cut off after event 2 and asked again from there.
	streams := proxy.streams()
	require.GreaterOrEqual(t, len(streams), 2, "event streams of the cut- run")
	require.Equal(t, []string{"", "2"}, streams[:2], "Last-Event-ID of the first two streams of the cut- run")
}

// versionIn is the first submatch of re (a version) in file.
func versionIn(t *testing.T, file, re string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	m := regexp.MustCompile(re).FindSubmatch(data)
	require.NotNil(t, m, "%s: no %s", file, re)
	return string(m[1])
}

// The SDK's version is the same in pyproject.toml, the build backend and
// the client's User-Agent, and pip builds the wheel of ./sdk/python with
// the in-tree backend, with no package index, holding the client (the
// README's `pip install ./sdk/python`). It needs pip for python3, which
// .ci/run installs from Debian's packages when missing.
func TestPipBuildsTheWheel(t *testing.T) {
	t.Parallel()
	version := versionIn(t, "pyproject.toml", `(?m)^version = "([^"]+)"$`)
	require.Equal(t, version, versionIn(t, filepath.Join("_backend", "palsdk_build.py"), `(?m)^VERSION = "([^"]+)"$`))
	require.Equal(t, version, versionIn(t, filepath.Join("palsdk", "client.py"), `(?m)^VERSION = "([^"]+)"$`))
	python, err := exec.LookPath("python3")
	require.NoError(t, err, "the Python SDK's test needs python3 on PATH")
	require.NoError(t, exec.Command(python, "-m", "pip", "--version").Run(),
		"the wheel's build needs pip for python3 (python3 -m pip; Debian's python3-pip)")
	dir, err := filepath.Abs(".")
	require.NoError(t, err)
	out := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-m", "pip", "wheel", "--no-deps", "--no-index", "--no-cache-dir",
		"--disable-pip-version-check", "-w", out, dir)
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	msg, err := cmd.CombinedOutput()
	require.NoError(t, err, "pip wheel ./sdk/python:\n%s", msg)
	wheels, err := filepath.Glob(filepath.Join(out, "palsdk-"+version+"-py3-none-any.whl"))
	require.NoError(t, err)
	require.Len(t, wheels, 1, "pip wheel wrote:\n%s", msg)
	z, err := zip.OpenReader(wheels[0])
	require.NoError(t, err)
	defer z.Close()
	var names []string
	for _, f := range z.File {
		names = append(names, f.Name)
	}
	require.Contains(t, names, "palsdk/__init__.py")
	require.Contains(t, names, "palsdk/client.py")
}
