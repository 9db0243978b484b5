package schemas_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/schemas"
)

// The schema's run_created.thread and event.ValidateThreadID refuse the
// same ids.
func TestThreadSchemaAgreesWithValidateThreadID(t *testing.T) {
	t.Parallel()
	for _, id := range []string{"support-42", "A_b", strings.Repeat("t", 128), strings.Repeat("t", 129), "a.b", "a b", "a*", "a>", "é"} {
		ev, err := event.New(event.RunCreated, "", 0, event.RunCreatedData{Input: json.RawMessage(`{}`), Thread: id})
		require.NoError(t, err)
		ev.RunID, ev.Seq, ev.WorkerID = "run_1", 1, "w1"
		body, err := json.Marshal(ev)
		require.NoError(t, err)
		schemaErr := schemas.ValidateEvent(body)
		checkErr := event.ValidateThreadID(id)
		require.Equal(t, checkErr == nil, schemaErr == nil, "%q: ValidateThreadID: %v; schema: %v", id, checkErr, schemaErr)
		if schemaErr != nil {
			require.ErrorContains(t, schemaErr, "/data/thread", id)
		}
	}
}
