package providertest

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/palrun/pal/provider"
)

// wire is one provider's wire format.
type wire interface {
	name() string
	// parse fills the call's parsed fields from its body.
	parse(c *Call) error
	// reply encodes a successful answer; id numbers it.
	reply(c Call, r Reply, id int) []byte
	// frames encodes a successful answer as the server-sent events of a
	// streamed one, a delta of text (or thinking) per word.
	frames(c Call, r Reply, id int) []frame
	// fail encodes an error answer.
	fail(status int, msg string) []byte
}

// frame is one server-sent event of a streamed answer.
type frame struct {
	event string // the SSE event name ("" for none)
	data  []byte
	// delta: the frame carries a piece of the answer's text or thinking
	// (the frames the pace spaces and a mid-stream hold counts).
	delta bool
}

// wordRE cuts text into the pieces a stream sends: each word with the
// whitespace before it, so the pieces concatenate to the text exactly.
var wordRE = regexp.MustCompile(`\s*\S+\s*$|\s*\S+`)

// pieces cuts text into words with their leading whitespace (trailing
// whitespace stays with the last word).
func pieces(text string) []string {
	if text == "" {
		return nil
	}
	out := wordRE.FindAllString(text, -1)
	if strings.Join(out, "") != text {
		return []string{text} // whitespace only
	}
	return out
}

// toolCallID returns tc's ID, or a made-up one that is unique in the server.
func toolCallID(tc provider.ToolCall, prefix string, id, i int) string {
	if tc.ID != "" {
		return tc.ID
	}
	return fmt.Sprintf("%s_fake%d_%d", prefix, id, i)
}

// argumentsObject returns tool arguments as a JSON value, {} when empty or
// not JSON.
func argumentsObject(raw json.RawMessage) json.RawMessage {
	if len(raw) == 0 || !json.Valid(raw) {
		return json.RawMessage("{}")
	}
	return raw
}

// rawJSON returns s if it is JSON, else s as a JSON string.
func rawJSON(s string) json.RawMessage {
	if json.Valid([]byte(s)) {
		return json.RawMessage(s)
	}
	return mustJSON(s)
}

// dataURL reads a data: URL's media type and bytes; ok is false for any
// other URL.
func dataURL(u string) (provider.Image, bool, error) {
	rest, ok := strings.CutPrefix(u, "data:")
	if !ok {
		return provider.Image{}, false, nil
	}
	meta, data, ok := strings.Cut(rest, ",")
	mediaType, isBase64 := strings.CutSuffix(meta, ";base64")
	if !ok || !isBase64 {
		return provider.Image{}, true, fmt.Errorf("image data URL is not data:<type>;base64,<bytes>")
	}
	b, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		return provider.Image{}, true, fmt.Errorf("image data URL: %w", err)
	}
	return provider.Image{MediaType: mediaType, Data: b}, true, nil
}

// mustJSON encodes v, which holds only types that always encode.
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return []byte(`{"error":{"message":"fake provider: encoding the answer failed"}}`)
	}
	return b
}
