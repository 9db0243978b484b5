package event_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
)

func TestExternalizeAndResolve(t *testing.T) {
	value := json.RawMessage(`{"text":"` + strings.Repeat("a", 2000) + `"}`)
	ev := event.MustNew(event.StepCompleted, "s", 1, event.StepCompletedData{Output: value, DurationMs: 3})
	ev.RunID, ev.Seq = "run_x", 2

	// At the threshold the value stays; above it, it goes.
	same, kept, err := event.Externalize(ev, len(value))
	require.NoError(t, err)
	require.Nil(t, kept)
	require.Equal(t, ev.Data, same.Data)
	st, kept, err := event.Externalize(ev, len(value)-1)
	require.NoError(t, err)
	require.Equal(t, []byte(value), kept)
	again, _, _ := event.Externalize(ev, len(value)-1)
	require.Equal(t, st.Data, again.Data, "the same event gives the same bytes")
	var d event.StepCompletedData
	require.NoError(t, st.DecodeData(&d))
	require.Nil(t, d.Output)
	require.Equal(t, &event.BlobRef{Blob: event.BlobSum(value), Size: int64(len(value))}, d.OutputBlob)
	require.Equal(t, int64(3), d.DurationMs)

	back, err := event.Resolve(st, kept)
	require.NoError(t, err)
	d = event.StepCompletedData{}
	require.NoError(t, back.DecodeData(&d))
	require.Equal(t, string(value), string(d.Output))
	require.Nil(t, d.OutputBlob)

	// Other bytes, or bytes that are not JSON, are refused.
	_, err = event.Resolve(st, append([]byte(nil), kept[:len(kept)-1]...))
	require.ErrorIs(t, err, event.ErrBlob)
	other := []byte(strings.Replace(string(kept), "a", "b", 1))
	_, err = event.Resolve(st, other)
	require.ErrorIs(t, err, event.ErrBlob)

	// Kinds without a blob field are left alone, however big.
	f := event.MustNew(event.StepFailed, "s", 1, event.StepFailedData{Error: strings.Repeat("e", 5000)})
	out, kept, err := event.Externalize(f, 1024)
	require.NoError(t, err)
	require.Nil(t, kept)
	require.Equal(t, f.Data, out.Data)

	// A value over MaxBlobBytes cannot be kept.
	huge := event.MustNew(event.StepStarted, "s", 1, event.StepStartedData{Input: json.RawMessage(`"` + strings.Repeat("h", event.MaxBlobBytes) + `"`)})
	_, _, err = event.Externalize(huge, 1024)
	require.ErrorContains(t, err, "at most")
}
