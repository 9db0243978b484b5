package provider_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/provider"
)

func TestRegistry(t *testing.T) {
	t.Parallel()
	reg := provider.Registry{"openai": nil, "anthropic": nil}
	_, err := reg.Get("nope")
	require.ErrorIs(t, err, provider.ErrUnknownProvider)
	require.EqualError(t, err, `unknown provider "nope" (configured: anthropic, openai)`)
}
