// Package python holds PAL's Python SDK, palsdk (pip install ./sdk/python,
// standard library only): the helpers of process steps (palsdk.step,
// resumed, idempotency_key) and palsdk.Client, a client of the REST API
// (palsdk/client.py).
//
// The Go package has no code of its own, only the SDK's test:
// TestPythonClient starts a real PAL (embedded JetStream, Postgres, a
// worker, the projector and the REST API, with tokens of several scopes)
// and runs tests/test_client.py against it with python3, through a proxy
// that cuts an event stream short so that the client must resume it with
// Last-Event-ID.
package python
