package schemas_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/schemas"
)

const personSchema = `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0}},
  "required":["name","age"],"additionalProperties":false}`

func TestAnswerSchemaValidates(t *testing.T) {
	t.Parallel()
	s, err := schemas.CompileAnswer(json.RawMessage(personSchema))
	require.NoError(t, err)

	got, err := s.Validate([]byte(" {\"name\": \"Ada\", \"age\": 36}\n"))
	require.NoError(t, err)
	require.Equal(t, `{"name":"Ada","age":36}`, string(got), "compacted")

	for answer, want := range map[string]string{
		`{"name":"Ada"}`:                  "missing property 'age'",
		`{"name":"Ada","age":-1}`:         "/age",
		`{"name":"Ada","age":1,"x":true}`: "additional properties 'x'",
		`Sure! {"name":"Ada","age":1}`:    "the answer is not JSON",
	} {
		_, err := s.Validate([]byte(answer))
		require.ErrorContains(t, err, want, answer)
	}
}

func TestAnswerSchemaSelfReference(t *testing.T) {
	t.Parallel()
	s, err := schemas.CompileAnswer(json.RawMessage(`{"$schema":"https://json-schema.org/draft/2020-12/schema",
	  "$defs":{"n":{"type":"integer"}},"type":"array","items":{"$ref":"#/$defs/n"}}`))
	require.NoError(t, err)
	_, err = s.Validate([]byte(`[1,2,3]`))
	require.NoError(t, err)
	_, err = s.Validate([]byte(`[1,"2"]`))
	require.Error(t, err)
}

// TestAnswerSchemaBounds: a responseSchema comes from whoever starts a run;
// what it may cost to compile, and what it may reach, is bounded.
func TestAnswerSchemaBounds(t *testing.T) {
	t.Parallel()
	secret := filepath.Join(t.TempDir(), "secret.json")
	require.NoError(t, os.WriteFile(secret, []byte(`{"type":"string"}`), 0o600))

	deep := strings.Repeat(`{"items":`, schemas.MaxAnswerSchemaDepth+1) + `{}` + strings.Repeat(`}`, schemas.MaxAnswerSchemaDepth+1)
	big := `{"description":"` + strings.Repeat("x", schemas.MaxAnswerSchemaBytes) + `"}`
	for name, raw := range map[string]string{
		"too big":       big,
		"too deep":      deep,
		"not an object": `[{"type":"string"}]`,
		"not JSON":      `{"type":`,
		"file ref":      `{"$ref":"file://` + secret + `"}`,
		"remote ref":    `{"$ref":"https://example.com/schema.json"}`,
		"bad keyword":   `{"type":"strin"}`,
	} {
		_, err := schemas.CompileAnswer(json.RawMessage(raw))
		require.ErrorIs(t, err, schemas.ErrAnswerSchema, name)
	}

	// Just within the bounds compiles.
	ok := strings.Repeat(`{"items":`, schemas.MaxAnswerSchemaDepth-1) + `{}` + strings.Repeat(`}`, schemas.MaxAnswerSchemaDepth-1)
	_, err := schemas.CompileAnswer(json.RawMessage(ok))
	require.NoError(t, err)
}
