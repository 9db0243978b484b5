package palcli

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
)

// TestDevFakeSetting: with PAL_DEV_FAKE=1 the providers send a request's
// fake block to a base URL on loopback (pal dev's fake answers from it);
// unset, they do not; a base URL elsewhere never gets it (onLoopback); a
// bad value is refused with exit 2, naming the variable.
func TestDevFakeSetting(t *testing.T) {
	t.Parallel()
	srv := providertest.NewServer(t)
	ctx := context.Background()
	req := provider.Request{Model: "m", IdempotencyKey: "k", Messages: []provider.Message{{Role: provider.RoleUser, Content: "hi"}},
		Fake: &provider.Fake{Script: `{"turns":[{"text":"scripted"}]}`, Step: "run/ask"}}
	for _, c := range []struct {
		fake, want string
	}{{"1", "scripted"}, {"true", "scripted"}, {"", "echo: hi"}, {"0", "echo: hi"}} {
		env := map[string]string{envDevFake: c.fake, "OPENAI_BASE_URL": srv.OpenAIBaseURL(), "OPENAI_API_KEY": "k",
			"ANTHROPIC_BASE_URL": srv.AnthropicBaseURL(), "ANTHROPIC_API_KEY": "k"}
		reg, err := providersOf(func(k string) string { return env[k] })
		require.NoError(t, err)
		for _, name := range []string{"openai", "anthropic"} {
			p, err := reg.Get(name)
			require.NoError(t, err)
			resp, err := p.Complete(ctx, req, nil)
			require.NoError(t, err)
			require.Equal(t, c.want, resp.Text, "%s=%q %s", envDevFake, c.fake, name)
		}
	}

	for base, want := range map[string]bool{
		"http://127.0.0.1:8080/v1": true, "http://localhost:9/v1": true, "http://[::1]:9": true, "http://127.1.2.3": true,
		"https://api.openai.com/v1": false, "": false, "http://10.0.0.1/v1": false, "http://localhost.example.com": false, "::": false,
	} {
		require.Equal(t, want, onLoopback(base), base)
	}

	_, err := providersOf(func(k string) string { return map[string]string{envDevFake: "yes"}[k] })
	require.Error(t, err)
	require.Equal(t, ExitBadInput, codeOf(err))
	require.Contains(t, err.Error(), `PAL_DEV_FAKE="yes": want 1 or 0`)
}
