package workflow_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/workflow"
)

func TestParseCached(t *testing.T) {
	t.Parallel()
	raw := []byte(`{"name":"cached","nodes":[{"id":"start","type":"trigger"}],"edges":[]}`)
	a, err := workflow.ParseCached(raw)
	require.NoError(t, err)
	b, err := workflow.ParseCached(raw)
	require.NoError(t, err)
	require.Same(t, a, b, "the same bytes parse once")
	fresh, err := workflow.Parse(raw)
	require.NoError(t, err)
	require.Equal(t, fresh.Hash(), a.Hash())

	bad := []byte(`{"name":"cached","nodes":[]}`)
	_, err1 := workflow.ParseCached(bad)
	_, err2 := workflow.ParseCached(bad)
	require.ErrorIs(t, err1, workflow.ErrInvalid)
	require.Equal(t, err1.Error(), err2.Error())

	// Many callers, many workflows (more than the cache holds): every
	// answer is right.
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				name := fmt.Sprintf("w%d", (g*200+i)%700)
				wf, err := workflow.ParseCached([]byte(`{"name":"` + name + `","nodes":[{"id":"start","type":"trigger"}],"edges":[]}`))
				require.NoError(t, err)
				require.Equal(t, name, wf.Name)
			}
		}()
	}
	wg.Wait()
}
