package schemas_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/schemas"
)

// The schema's labels and event.CheckLabels refuse the same label sets (the
// schema counts a value's characters, CheckLabels its bytes: the sets here
// are ASCII, where the two agree).
func TestLabelsSchemaAgreesWithCheckLabels(t *testing.T) {
	t.Parallel()
	many := map[string]string{}
	for i := range event.MaxLabels + 1 {
		many[fmt.Sprintf("k%d", i)] = "v"
	}
	sets := map[string]map[string]string{
		"two":            {"customer": "acme", "env": "prod"},
		"empty value":    {"flag": ""},
		"longest key":    {"k" + strings.Repeat("x", 62): "x"},
		"key too long":   {"k" + strings.Repeat("x", 63): "x"},
		"upper case":     {"Env": "x"},
		"digit first":    {"1a": "x"},
		"empty key":      {"": "x"},
		"longest value":  {"k": strings.Repeat("x", 256)},
		"value too long": {"k": strings.Repeat("x", 257)},
		"NUL":            {"k": "a\x00"},
		"newline":        {"k": "a\nb"},
		"too many":       many,
	}
	for name, labels := range sets {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ev, err := event.New(event.RunCreated, "", 0, event.RunCreatedData{Input: json.RawMessage(`{}`), Labels: labels})
			require.NoError(t, err)
			ev.RunID, ev.Seq, ev.WorkerID = "run_1", 1, "w1"
			body, err := json.Marshal(ev)
			require.NoError(t, err)
			schemaErr := schemas.ValidateEvent(body)
			checkErr := event.CheckLabels(labels)
			require.Equal(t, checkErr == nil, schemaErr == nil, "CheckLabels: %v; schema: %v", checkErr, schemaErr)
			if schemaErr != nil {
				// A refused key is reported at "/" by the validator, with the
				// key pattern; the other refusals at /data/labels.
				require.Regexp(t, `/data/labels|\^\[a-z\]\[a-z0-9_.-\]\{0,62\}\$`, schemaErr.Error())
			}
		})
	}
}

// Labels that are not an object of strings are refused by the schema.
func TestLabelsSchemaRefusesOtherTypes(t *testing.T) {
	t.Parallel()
	valid := `"v":1,"run_id":"run_1","seq":1,"ts":"2030-01-02T03:04:05Z","worker_id":"w1","kind":"run_created"`
	for _, labels := range []string{`[]`, `"acme"`, `{"k":1}`, `{"k":{"nested":"x"}}`, `{"k":null}`, `{"k":["x"]}`} {
		err := schemas.ValidateEvent([]byte(`{` + valid + `,"data":{"input":{},"depth":0,"labels":` + labels + `}}`))
		require.ErrorContains(t, err, "/data/labels", labels)
	}
}
