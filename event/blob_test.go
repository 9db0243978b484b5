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
	require.Equal(t, [][]byte{value}, kept)
	again, _, _ := event.Externalize(ev, len(value)-1)
	require.Equal(t, st.Data, again.Data, "the same event gives the same bytes")
	var d event.StepCompletedData
	require.NoError(t, st.DecodeData(&d))
	require.Nil(t, d.Output)
	require.Equal(t, &event.BlobRef{Blob: event.BlobSum(value), Size: int64(len(value))}, d.OutputBlob)
	require.Equal(t, int64(3), d.DurationMs)

	give := func(b []byte) func(event.BlobRef) ([]byte, error) {
		return func(event.BlobRef) ([]byte, error) { return b, nil }
	}
	back, err := event.Resolve(st, give(kept[0]))
	require.NoError(t, err)
	d = event.StepCompletedData{}
	require.NoError(t, back.DecodeData(&d))
	require.Equal(t, string(value), string(d.Output))
	require.Nil(t, d.OutputBlob)

	// Other bytes, or bytes that are not JSON, are refused.
	_, err = event.Resolve(st, give(kept[0][:len(kept[0])-1]))
	require.ErrorIs(t, err, event.ErrBlob)
	other := []byte(strings.Replace(string(kept[0]), "a", "b", 1))
	_, err = event.Resolve(st, give(other))
	require.ErrorIs(t, err, event.ErrBlob)

	// Kinds without a blob field are left alone, however big.
	f := event.MustNew(event.StepFailed, "s", 1, event.StepFailedData{Error: strings.Repeat("e", 5000)})
	out, none, err := event.Externalize(f, 1024)
	require.NoError(t, err)
	require.Nil(t, none)
	require.Equal(t, f.Data, out.Data)

	// A value over MaxBlobBytes cannot be kept.
	huge := event.MustNew(event.StepStarted, "s", 1, event.StepStartedData{Input: json.RawMessage(`"` + strings.Repeat("h", event.MaxBlobBytes) + `"`)})
	_, _, err = event.Externalize(huge, 1024)
	require.ErrorContains(t, err, "at most")
}

// A fork's run_created keeps the big outputs it copies, and its input, as
// blobs; each is put back in its place.
func TestExternalizeForkCopies(t *testing.T) {
	big := func(c string) json.RawMessage { return json.RawMessage(`"` + strings.Repeat(c, 3000) + `"`) }
	d := event.RunCreatedData{Input: big("i"), ForkedFrom: &event.ForkedFrom{RunID: "run_src", StepID: "c", Seq: 9,
		Copies: []event.CopiedStep{{StepID: "a", Output: big("a")}, {StepID: "b", Output: json.RawMessage(`{"small":1}`)}, {StepID: "c", Output: big("c")}}}}
	ev := event.MustNew(event.RunCreated, "", 0, d)
	st, kept, err := event.Externalize(ev, 2048)
	require.NoError(t, err)
	require.Len(t, kept, 3)
	require.Less(t, len(st.Data), 1200)
	refs, err := event.Blobs(st)
	require.NoError(t, err)
	var where []string
	for _, r := range refs {
		where = append(where, r.Field)
	}
	require.Equal(t, []string{"input", "forked_from.copies[0].output", "forked_from.copies[2].output"}, where)
	_, ok, err := event.BlobOf(st)
	require.NoError(t, err)
	require.True(t, ok, "the input's reference")

	byName := map[string][]byte{}
	for _, v := range kept {
		byName[event.BlobSum(v)] = v
	}
	back, err := event.Resolve(st, func(r event.BlobRef) ([]byte, error) { return byName[r.Blob], nil })
	require.NoError(t, err)
	var got event.RunCreatedData
	require.NoError(t, back.DecodeData(&got))
	require.Equal(t, d.Input, got.Input)
	require.Equal(t, d.ForkedFrom.Copies, got.ForkedFrom.Copies)

	// A forged copy is refused like any other.
	byName[event.BlobSum(kept[2])] = []byte(strings.Replace(string(kept[2]), "c", "x", 1))
	_, err = event.Resolve(st, func(r event.BlobRef) ([]byte, error) { return byName[r.Blob], nil })
	require.ErrorIs(t, err, event.ErrBlob)
	require.ErrorContains(t, err, "forked_from.copies[2].output")
}
