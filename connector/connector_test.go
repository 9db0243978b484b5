package connector_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/palrun/pal/connector"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type fakeConnector struct{ kind string }

func (f fakeConnector) Kind() string { return f.kind }

func (f fakeConnector) Deliver(context.Context, connector.Delivery) (*connector.Receipt, error) {
	return &connector.Receipt{Status: 200}, nil
}

func TestRegistryGet(t *testing.T) {
	t.Parallel()

	reg := connector.Registry{"webhook": fakeConnector{"webhook"}, "email": fakeConnector{"email"}}

	c, err := reg.Get("webhook")
	require.NoError(t, err)
	require.Equal(t, "webhook", c.Kind())

	_, err = reg.Get("sms")
	require.ErrorIs(t, err, connector.ErrUnknownConnector)
	require.EqualError(t, err, `unknown connector kind "sms" (configured: email, webhook)`)

	_, err = connector.Registry{}.Get("webhook")
	require.EqualError(t, err, `unknown connector kind "webhook" (configured: none)`)
}

func TestError(t *testing.T) {
	t.Parallel()

	cause := errors.New("boom")
	withStatus := &connector.Error{Connector: "webhook", Status: 503, Retryable: true, Err: cause}
	require.EqualError(t, withStatus, "webhook: HTTP 503: boom")
	require.ErrorIs(t, withStatus, cause)

	noStatus := &connector.Error{Connector: "webhook", Err: context.Canceled}
	require.EqualError(t, noStatus, "webhook: context canceled")
	require.ErrorIs(t, noStatus, context.Canceled)

	var ce *connector.Error
	require.ErrorAs(t, error(withStatus), &ce)
	require.True(t, ce.Retryable)
}

func TestValidateHeaders(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		headers map[string]string
		wantErr string
	}{
		{name: "nil", headers: nil},
		{name: "ordinary", headers: map[string]string{"Authorization": "Bearer x", "X-Trace": "a\tb", "content-type": "application/cloudevents+json"}},
		{name: "idempotency key", headers: map[string]string{"Idempotency-Key": "mine"}, wantErr: `header "Idempotency-Key" is set by PAL`},
		{name: "idempotency key lower case", headers: map[string]string{"idempotency-key": "mine"}, wantErr: `header "idempotency-key" is set by PAL`},
		{name: "run id", headers: map[string]string{"PAL-RUN-ID": "run_x"}, wantErr: `header "PAL-RUN-ID" is set by PAL`},
		{name: "step id", headers: map[string]string{"pal-step-id": "s"}, wantErr: `header "pal-step-id" is set by PAL`},
		{name: "empty name", headers: map[string]string{"": "x"}, wantErr: `header "": invalid header name`},
		{name: "space in name", headers: map[string]string{"X Bad": "x"}, wantErr: `header "X Bad": invalid header name`},
		{name: "colon in name", headers: map[string]string{"X:Bad": "x"}, wantErr: `header "X:Bad": invalid header name`},
		{name: "newline in value", headers: map[string]string{"X-Bad": "a\r\nInjected: 1"}, wantErr: `header "X-Bad": value contains control characters`},
		{name: "nul in value", headers: map[string]string{"X-Bad": "a\x00"}, wantErr: `header "X-Bad": value contains control characters`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := connector.ValidateHeaders(tt.headers)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
}
