package event_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
)

// FuzzDecode feeds Decode arbitrary message bodies. It must never panic, and
// whatever it accepts must survive a re-encode: Encode then Decode gives the
// same events (data compared as JSON, since Encode compacts it).
func FuzzDecode(f *testing.F) {
	batch := sampleBatch(f)
	one, err := event.Encode(batch[0])
	if err != nil {
		f.Fatal(err)
	}
	packed, err := event.Encode(batch...)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(one)
	f.Add(packed)
	for _, s := range []string{
		`{"v":1,"run_id":"run_a","seq":1,"kind":"run_created","ts":"2025-01-15T10:00:00Z","worker_id":"pal",` +
			`"data":{"workflow":{"name":"w","nodes":[{"id":"start","type":"trigger"}],"edges":[]},"input":{"text":"hi"},"depth":0}}`,
		`[{"v":1,"run_id":"run_a","seq":2,"kind":"run_resumed","ts":"2025-01-15T10:00:01+02:00","worker_id":"w1","data":{"worker":"w1","resume_count":1,"crashed":false}},` +
			`{"v":1,"run_id":"run_a","seq":3,"kind":"step_started","ts":"2025-01-15T10:00:01.5Z","step_id":"draft","attempt":1,"worker_id":"w1","data":{}}]`,
		`{"v":1,"run_id":"run_a","seq":18446744073709551615,"kind":"x","ts":"0001-01-01T00:00:00Z","worker_id":"","data":null}`,
		`{"v":1,"run_id":"run_a","seq":1,"kind":"k"}`,
		`  {"v":1,"run_id":"r","seq":1,"kind":"k","data":{ "a" : [1, 2.50, "\u00e9"] }}  `,
		`[{"v":1,"run_id":"r","seq":18446744073709551615,"kind":"k"},{"v":1,"run_id":"r","seq":0,"kind":"k"}]`,
		`{"V":1,"RUN_ID":"r","Seq":1,"KIND":"k","attempt":-3}`,
		`[]`, `{}`, `null`, `[null]`, ``, `[`, `{"v":2}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		evs, err := event.Decode(body)
		if err != nil {
			require.ErrorIs(t, err, event.ErrMalformed)
			require.Nil(t, evs)
			return
		}
		require.NotEmpty(t, evs)
		again, err := event.Encode(evs...)
		require.NoError(t, err, "Encode refuses what Decode accepted")
		evs2, err := event.Decode(again)
		require.NoError(t, err, "Decode refuses what Encode wrote: %s", again)
		require.Len(t, evs2, len(evs))
		for i := range evs {
			requireSameEvent(t, evs[i], evs2[i])
		}
	})
}

// requireSameEvent compares two events, their data as JSON values (absent
// data and null are the same: both decode to nothing).
func requireSameEvent(t *testing.T, want, got event.Event) {
	t.Helper()
	require.JSONEq(t, jsonOrNull(want.Data), jsonOrNull(got.Data))
	want.Data, got.Data = nil, nil
	require.True(t, want.TS.Equal(got.TS), "ts %v != %v", want.TS, got.TS)
	_, wantOff := want.TS.Zone()
	_, gotOff := got.TS.Zone()
	require.Equal(t, wantOff, gotOff, "ts offset")
	want.TS = got.TS
	require.Equal(t, want, got)
}

func jsonOrNull(raw json.RawMessage) string {
	if len(bytes.TrimSpace(raw)) == 0 {
		return "null"
	}
	return string(raw)
}
