package email_test

import (
	"context"
	"io"
	"net/mail"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/connector"
	"github.com/palrun/pal/connector/connectortest"
	"github.com/palrun/pal/connector/email"
	"github.com/palrun/pal/internal/egress"
)

var loopback = (*egress.Policy)(nil).With(egress.Loopback...)

func delivery(m connector.Email) connector.Delivery {
	return connector.Delivery{RunID: "run1", StepID: "mail", IdempotencyKey: "abc123", Email: &m}
}

func okMessage() connector.Email {
	return connector.Email{From: "PAL <pal@example.test>", To: "ann@example.test, Bob <bob@example.test>",
		Cc: "carol@example.test", Subject: "Report ready", Text: "plain body", HTML: "<p>html body</p>"}
}

func TestSendsTheRenderedMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts []connectortest.SMTPOption
	}{{"plain", nil}, {"starttls", []connectortest.SMTPOption{connectortest.WithStartTLS()}}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := connectortest.NewSMTPReceiver(t, tc.opts...)
			c := email.New(srv.URL(), email.WithEgress(loopback), email.WithTLSConfig(srv.ClientTLS()))
			rec, err := c.Deliver(context.Background(), delivery(okMessage()))
			require.NoError(t, err)
			require.Equal(t, 250, rec.Status)
			require.Contains(t, string(rec.Body), "<abc123@pal>")

			msgs := srv.Messages()
			require.Len(t, msgs, 1)
			m := msgs[0]
			require.Equal(t, tc.name == "starttls", m.TLS, "STARTTLS is used when offered")
			require.Equal(t, "pal@example.test", m.From)
			require.ElementsMatch(t, []string{"ann@example.test", "bob@example.test", "carol@example.test"}, m.To)
			require.Equal(t, "<abc123@pal>", m.Header.Get("Message-Id"))
			require.Equal(t, 1, srv.Count(email.MessageID("abc123")))
			require.Equal(t, "abc123", m.Header.Get("Idempotency-Key"))
			require.Equal(t, "run1", m.Header.Get("Pal-Run-Id"))
			require.Equal(t, "mail", m.Header.Get("Pal-Step-Id"))
			require.Equal(t, "Report ready", m.Header.Get("Subject"))
			require.Contains(t, m.Header.Get("Cc"), "carol@example.test")
			parsed, err := mail.ReadMessage(strings.NewReader(string(m.Data)))
			require.NoError(t, err)
			body, err := io.ReadAll(parsed.Body)
			require.NoError(t, err)
			require.Contains(t, string(body), "plain body")
			require.Contains(t, string(body), "<p>html body</p>")
			require.Contains(t, m.Header.Get("Content-Type"), "multipart/alternative")
		})
	}
}

func TestRefusesBeforeSending(t *testing.T) {
	t.Parallel()
	srv := connectortest.NewSMTPReceiver(t)
	c := email.New(srv.URL(), email.WithEgress(loopback))
	mod := func(f func(*connector.Email)) connector.Email { m := okMessage(); f(&m); return m }
	for name, tc := range map[string]struct {
		m    connector.Email
		want string
	}{
		"CRLF in subject": {mod(func(m *connector.Email) { m.Subject = "hi\r\nBcc: victim@example.test" }), "subject contains a control character"},
		"LF in to":        {mod(func(m *connector.Email) { m.To = "a@example.test\nBcc: v@example.test" }), "to contains a control character"},
		"CR in from":      {mod(func(m *connector.Email) { m.From = "a@example.test\r" }), "from contains a control character"},
		"LF in cc":        {mod(func(m *connector.Email) { m.Cc = "\nX: y" }), "cc contains a control character"},
		"two senders":     {mod(func(m *connector.Email) { m.From = "a@example.test, b@example.test" }), "from must be one address"},
		"bad address":     {mod(func(m *connector.Email) { m.To = "not an address" }), "to is not an address list"},
		"no recipient":    {mod(func(m *connector.Email) { m.To = " " }), "to is empty"},
		"no body":         {mod(func(m *connector.Email) { m.Text, m.HTML = "", "" }), "neither text nor html"},
		"long subject":    {mod(func(m *connector.Email) { m.Subject = strings.Repeat("s", email.MaxSubject+1) }), "subject is 999 bytes"},
		"big body":        {mod(func(m *connector.Email) { m.Text = strings.Repeat("b", email.MaxBody) }), "at most 1048576"},
		"too many recipients": {mod(func(m *connector.Email) {
			m.To = strings.Repeat("x@example.test,", email.MaxRecipients) + "y@example.test"
		}), "recipients in to and cc"},
		"long address list": {mod(func(m *connector.Email) { m.To = strings.Repeat("x", email.MaxAddressList+1) }), "to is 8193 bytes"},
	} {
		_, err := c.Deliver(context.Background(), delivery(tc.m))
		var ce *connector.Error
		require.ErrorAs(t, err, &ce, name)
		require.False(t, ce.Retryable, name)
		require.Contains(t, err.Error(), tc.want, name)
	}
	require.Empty(t, srv.Messages(), "nothing was sent")
}

func TestEgressAppliesToTheSMTPHost(t *testing.T) {
	t.Parallel()
	srv := connectortest.NewSMTPReceiver(t)
	_, err := email.New(srv.URL()).Deliver(context.Background(), delivery(okMessage()))
	var de *egress.DeniedError
	require.ErrorAs(t, err, &de)
	var ce *connector.Error
	require.ErrorAs(t, err, &ce)
	require.False(t, ce.Retryable)
	require.Empty(t, srv.Messages())
}

func TestUnknownOutcomeWhenTheAnswerNeverComes(t *testing.T) {
	t.Parallel()
	srv := connectortest.NewSMTPReceiver(t)
	hold := srv.Hold(connectortest.HoldAfterData)
	defer hold.Release()
	c := email.New(srv.URL(), email.WithEgress(loopback), email.WithTimeout(time.Second))
	_, err := c.Deliver(context.Background(), delivery(okMessage()))
	var ce *connector.Error
	require.ErrorAs(t, err, &ce)
	require.True(t, ce.Unknown, "the message was sent; only the answer is missing: %v", err)
	require.True(t, ce.Retryable)
	require.Len(t, srv.Messages(), 1)
}

func TestConfiguration(t *testing.T) {
	t.Parallel()
	s, err := email.ParseURL("smtp://u%40x:p%3Ass@mail.example.test")
	require.NoError(t, err)
	require.Equal(t, email.Server{Host: "mail.example.test", Port: 587, User: "u@x", Password: "p:ss"}, *s)
	s, err = email.ParseURL("smtps://mail.example.test")
	require.NoError(t, err)
	require.Equal(t, 465, s.Port)
	require.True(t, s.Implicit)
	for _, bad := range []string{"http://x", "smtp://", "smtp://h:0", "smtp://h:99999"} {
		_, err := email.ParseURL(bad)
		require.Error(t, err, bad)
	}
	_, err = email.New("").Deliver(context.Background(), delivery(okMessage()))
	require.ErrorContains(t, err, "PAL_SMTP_URL is not set")
	require.Error(t, email.New("").Check())
	require.NoError(t, email.New("smtp://h:25").Check())
}
