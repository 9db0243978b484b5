package api

import (
	"encoding/json"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/runs"
)

// TestOpenAPIMatchesRoutes holds api/openapi.json to the routes table,
// where each fact is written once: every route is an operation of the
// document at its path and method and nothing else is; a route whose body
// decodes into a Go type (handling.body) documents a request schema whose
// properties are that type's JSON fields (but reply_to, which REST
// refuses), and one without documents no properties; the responses are
// the route's Statuses, every error one the shared Error schema; the
// security is the route's scope (none for the probes).
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	doc := openAPIDoc(t)
	paths := doc["paths"].(map[string]any)
	want := map[string]bool{}
	for _, rt := range routes {
		want[rt.Pattern()] = true
		op := operation(paths, rt.Route)
		require.NotNil(t, op, "api/openapi.json has no %s (paths.%q.%s): document the route", rt.Pattern(), rt.Path, strings.ToLower(rt.Method))
		requireBodyFields(t, doc, rt, op)
		requireStatuses(t, doc, rt.Route, op)
		requireSecurity(t, rt.Route, op)
	}
	for path, item := range paths {
		for method := range item.(map[string]any) {
			p := strings.ToUpper(method) + " " + path
			require.True(t, want[p], "api/openapi.json documents %s, which is not a route (api/routes.go)", p)
		}
	}
}

// TestOpenAPIIsWellFormed checks api/openapi.json's structure as
// OpenAPI 3.1 asks: the version, info, unique operation ids, each path
// template's parameters declared in the path, every $ref resolved, and
// the bearer scheme the operations name.
func TestOpenAPIIsWellFormed(t *testing.T) {
	t.Parallel()
	doc := openAPIDoc(t)
	require.Equal(t, "3.1.0", doc["openapi"])
	info, _ := doc["info"].(map[string]any)
	require.NotEmpty(t, info["title"], "info.title")
	require.NotEmpty(t, info["version"], "info.version")
	scheme := dig(doc, "components", "securitySchemes", "bearer")
	require.Equal(t, map[string]any{"type": "http", "scheme": "bearer"},
		map[string]any{"type": scheme["type"], "scheme": scheme["scheme"]}, "components.securitySchemes.bearer")

	ids := map[string]string{}
	for path, item := range doc["paths"].(map[string]any) {
		require.True(t, strings.HasPrefix(path, "/"), "path %q does not start with /", path)
		templ := regexp.MustCompile(`\{([^}]+)\}`).FindAllStringSubmatch(path, -1)
		for method, v := range item.(map[string]any) {
			where := strings.ToUpper(method) + " " + path
			require.Contains(t, []string{"get", "put", "post", "delete", "patch", "head", "options", "trace"}, method, where)
			op := v.(map[string]any)
			id, _ := op["operationId"].(string)
			require.NotEmpty(t, id, "%s has no operationId", where)
			require.Empty(t, ids[id], "operationId %s is both %s and %s", id, ids[id], where)
			ids[id] = where
			require.NotEmpty(t, op["responses"], "%s has no responses", where)
			declared := map[string]bool{}
			params, _ := op["parameters"].([]any)
			for _, p := range params {
				p := p.(map[string]any)
				require.Contains(t, []any{"path", "query", "header", "cookie"}, p["in"], where)
				require.NotEmpty(t, p["name"], where)
				if p["in"] == "path" {
					require.Equal(t, true, p["required"], "%s: path parameter %s must be required", where, p["name"])
					declared[p["name"].(string)] = true
				}
			}
			var named []string
			for _, m := range templ {
				named = append(named, m[1])
			}
			require.ElementsMatch(t, named, slices.Collect(maps.Keys(declared)), "%s: path parameters", where)
		}
	}
	raw, err := json.Marshal(doc)
	require.NoError(t, err)
	for _, m := range regexp.MustCompile(`"\$ref":"([^"]*)"`).FindAllStringSubmatch(string(raw), -1) {
		require.NotNil(t, resolve(doc, m[1]), "$ref %s resolves to nothing", m[1])
	}
}

// TestOpenAPISchemasAreTheAnswers holds the document's shared schemas to
// the Go types the handlers write: each schema's properties are the
// type's JSON fields.
func TestOpenAPISchemasAreTheAnswers(t *testing.T) {
	t.Parallel()
	schemas := dig(openAPIDoc(t), "components", "schemas")
	for name, ty := range map[string]reflect.Type{
		"Error":         reflect.TypeFor[errorBody](),
		"StartAnswer":   reflect.TypeFor[StartAnswer](),
		"OKAnswer":      reflect.TypeFor[OKAnswer](),
		"ResumeAnswer":  reflect.TypeFor[ResumeAnswer](),
		"ForkResult":    reflect.TypeFor[runs.ForkResult](),
		"Deployed":      reflect.TypeFor[runs.DeployResult](),
		"Schedule":      reflect.TypeFor[runs.ScheduleView](),
		"TriggerResult": reflect.TypeFor[runs.TriggerResult](),
		"DeletedAnswer": reflect.TypeFor[DeletedAnswer](),
	} {
		props := dig(schemas, name, "properties")
		require.Equal(t, jsonFieldsOf(ty), slices.Sorted(maps.Keys(props)),
			"api/openapi.json's schema %s is not %s's JSON fields", name, ty)
	}
}

// TestJSONFieldsOf checks the reflection TestOpenAPIMatchesRoutes trusts.
func TestJSONFieldsOf(t *testing.T) {
	t.Parallel()
	type inner struct {
		C string `json:"c"`
	}
	type outer struct {
		A string `json:"a,omitempty"`
		B int
		inner
		D string `json:"-"`
		e string
	}
	_ = outer{e: "unexported: encoding/json skips it"}
	require.Equal(t, []string{"B", "a", "c"}, jsonFieldsOf(reflect.TypeFor[outer]()))
}

func openAPIDoc(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	require.NoError(t, json.Unmarshal(openAPI, &doc), "api/openapi.json is not JSON")
	return doc
}

// operation returns the document's operation for r, nil for none.
func operation(paths map[string]any, r Route) map[string]any {
	item, _ := paths[r.Path].(map[string]any)
	op, _ := item[strings.ToLower(r.Method)].(map[string]any)
	return op
}

func requireBodyFields(t *testing.T, doc map[string]any, rt route, op map[string]any) {
	t.Helper()
	schema := dig(op, "requestBody", "content", "application/json", "schema")
	if ref, ok := schema["$ref"].(string); ok {
		schema, _ = resolve(doc, ref).(map[string]any)
	}
	props, _ := schema["properties"].(map[string]any)
	if rt.body == nil {
		require.Empty(t, props, "%s decodes no JSON object, but api/openapi.json documents body fields", rt.Pattern())
		return
	}
	want := slices.DeleteFunc(jsonFieldsOf(rt.body), func(f string) bool { return f == "reply_to" })
	require.Equal(t, want, slices.Sorted(maps.Keys(props)),
		"%s: api/openapi.json's request fields are not those of %s (but reply_to)", rt.Pattern(), rt.body)
}

func requireStatuses(t *testing.T, doc map[string]any, r Route, op map[string]any) {
	t.Helper()
	responses, _ := op["responses"].(map[string]any)
	var got []int
	for code, v := range responses {
		n, err := strconv.Atoi(code)
		require.NoError(t, err, "%s: response %q is not a status", r.Pattern(), code)
		got = append(got, n)
		if n < 400 {
			continue
		}
		resp, _ := v.(map[string]any)
		if ref, ok := resp["$ref"].(string); ok {
			resp, _ = resolve(doc, ref).(map[string]any)
		}
		require.Equal(t, "#/components/schemas/Error", dig(resp, "content", "application/json", "schema")["$ref"],
			"%s: the %d answer is not the Error schema", r.Pattern(), n)
	}
	require.ElementsMatch(t, r.Statuses, got, "%s: api/openapi.json's statuses are not the route's Statuses (api/routes.go)", r.Pattern())
}

func requireSecurity(t *testing.T, r Route, op map[string]any) {
	t.Helper()
	want := []any{}
	if r.Scope != 0 {
		want = []any{map[string]any{"bearer": []any{r.Scope.String()}}}
	}
	require.Equal(t, want, op["security"], "%s: api/openapi.json's security is not the route's scope", r.Pattern())
}

// jsonFieldsOf returns the names encoding/json gives the fields of struct
// type ty, sorted: embedded structs' fields are its own, "-" is none.
func jsonFieldsOf(ty reflect.Type) []string {
	var out []string
	for _, f := range reflect.VisibleFields(ty) {
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			continue // its fields are visited
		}
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// dig returns the object at keys under m, or nil.
func dig(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		m, _ = m[k].(map[string]any)
	}
	return m
}

// resolve returns what a local $ref ("#/a/b") points at, or nil.
func resolve(doc map[string]any, ref string) any {
	rest, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		return nil
	}
	var at any = doc
	for _, k := range strings.Split(rest, "/") {
		m, _ := at.(map[string]any)
		if at, ok = m[strings.NewReplacer("~1", "/", "~0", "~").Replace(k)]; !ok {
			return nil
		}
	}
	return at
}
