package registry_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/internal/registry"
)

var errUnknownTool = errors.New("unknown tool")

type tools struct{}

func (tools) Unknown() error { return errUnknownTool }

func TestGet(t *testing.T) {
	t.Parallel()
	r := registry.Registry[int, tools]{"b": 2, "a": 1}
	v, err := r.Get("b")
	require.NoError(t, err)
	require.Equal(t, 2, v)

	v, err = r.Get("c")
	require.ErrorIs(t, err, errUnknownTool)
	require.EqualError(t, err, `unknown tool "c" (configured: a, b)`)
	require.Zero(t, v)

	_, err = registry.Registry[int, tools]{}.Get("a")
	require.EqualError(t, err, `unknown tool "a" (configured: none)`)
	var nilReg registry.Registry[int, tools]
	_, err = nilReg.Get("a")
	require.ErrorIs(t, err, errUnknownTool)
}
