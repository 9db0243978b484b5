package api

import (
	_ "embed"
	"net/http"
)

// openAPI is the REST API as an OpenAPI 3.1 document. It is written by
// hand and held to the routes table by TestOpenAPIMatchesRoutes: each
// route's path and method, the JSON fields of the type its body decodes
// into (handling.body), its statuses (Route.Statuses) and its scope are
// written once, in routes; the document must say the same.
//
//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the REST API's OpenAPI 3.1 document (GET
// /v1/openapi.json), as JSON.
func OpenAPI() []byte { return append([]byte(nil), openAPI...) }

// serveOpenAPI answers GET /v1/openapi.json.
func serveOpenAPI(_ *handler, w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(openAPI)
}
