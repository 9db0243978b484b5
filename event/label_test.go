package event_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
)

func TestCheckLabels(t *testing.T) {
	t.Parallel()
	many := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("k%d", i)] = "v"
		}
		return m
	}
	tests := []struct {
		name   string
		labels map[string]string
		want   string // part of the error; "" for none
	}{
		{"none", nil, ""},
		{"two", map[string]string{"customer": "acme", "env": "prod"}, ""},
		{"empty value", map[string]string{"flag": ""}, ""},
		{"every key character", map[string]string{"a.b_c-9": "x"}, ""},
		{"longest key", map[string]string{"k" + strings.Repeat("x", 62): "x"}, ""},
		{"longest value", map[string]string{"k": strings.Repeat("é", event.MaxLabelValueBytes/2)}, ""},
		{"most labels", many(event.MaxLabels), ""},
		{"one too many", many(event.MaxLabels + 1), "17 labels; the limit is 16"},
		{"key too long", map[string]string{"k" + strings.Repeat("x", 63): "x"}, "want 1 to 63 of a-z"},
		{"empty key", map[string]string{"": "x"}, `label key ""`},
		{"upper case key", map[string]string{"Env": "x"}, `label key "Env"`},
		{"key starts with a digit", map[string]string{"1a": "x"}, `label key "1a"`},
		{"key with a slash", map[string]string{"a/b": "x"}, `label key "a/b"`},
		{"key with an equals sign", map[string]string{"a=b": "x"}, `label key "a=b"`},
		{"value a byte too long", map[string]string{"k": strings.Repeat("x", event.MaxLabelValueBytes+1)}, "value is 257 bytes; the limit is 256"},
		{"value with NUL", map[string]string{"k": "a\x00b"}, "control character U+0000"},
		{"value with a newline", map[string]string{"k": "a\nb"}, "control character U+000A"},
		{"value with DEL", map[string]string{"k": "a\x7f"}, "control character U+007F"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := event.CheckLabels(tt.labels)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
		})
	}
}
