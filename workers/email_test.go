package workers_test

// The email connector under the worker: a rendered message goes out once
// with the claim around it, and kill -9 of a real `pal worker` process at
// either side of the send never sends a second email.

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/connector/connectortest"
	"github.com/palrun/pal/connector/email"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
)

// emailWorkflow drafts with the fake LLM and mails the draft.
const emailWorkflow = `{"name":"mail","nodes":[{"id":"start","type":"trigger"},
	{"id":"draft","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"Summarise {{input.topic}}"}},
	{"id":"mail","type":"connector","data":{"kind":"email","from":"PAL <pal@example.test>","to":"{{input.to}}",
	 "cc":"ops@example.test","subject":"Summary: {{input.topic}}","text":"{{steps.draft.output.text}}"}},
	{"id":"after","type":"tool","data":{"tool":"echo","input":{"ok":true}}}],
	"edges":[{"from":"start","to":"draft"},{"from":"draft","to":"mail"},{"from":"mail","to":"after"}]}`

const emailInput = `{"topic":"tides","to":"Ann <ann@example.test>"}`

func TestEmailStepSendsTheRenderedMessage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	smtp := connectortest.NewSMTPReceiver(t)
	b.Worker(t, "w1", paltest.SMTP(smtp.URL()))
	runID := b.Start(t, emailWorkflow, emailInput)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)

	k := key(runID, "mail", 1)
	msgs := smtp.Messages()
	require.Len(t, msgs, 1)
	m := msgs[0]
	require.Equal(t, "pal@example.test", m.From)
	require.Equal(t, []string{"ann@example.test", "ops@example.test"}, m.To)
	require.Equal(t, "Summary: tides", m.Header.Get("Subject"))
	require.Equal(t, "<"+email.MessageID(k)+">", m.Header.Get("Message-Id"))
	require.Equal(t, runID, m.Header.Get("Pal-Run-Id"))

	evs := b.Events(t, runID)
	claims := find(evs, event.SideEffectClaimed, "mail")
	require.Len(t, claims, 1)
	c := data[event.SideEffectClaimedData](t, claims[0])
	require.Equal(t, "email", c.Connector)
	require.Equal(t, "mailto:Ann <ann@example.test>", c.Target)
	require.Equal(t, k, c.IdempotencyKey)
	del := find(evs, event.SideEffectDelivered, "mail")
	require.Len(t, del, 1)
	require.Equal(t, 250, data[event.SideEffectDeliveredData](t, del[0]).Status)
	require.Less(t, claims[0].Seq, del[0].Seq)
}

func TestEmailHeaderInjectionFailsTheStepAndSendsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	smtp := connectortest.NewSMTPReceiver(t)
	b.Worker(t, "w1", paltest.SMTP(smtp.URL()))
	runID := b.Start(t, emailWorkflow, `{"topic":"x\r\nBcc: victim@example.test","to":"ann@example.test"}`)
	require.Equal(t, event.RunFailed, b.WaitEnd(t, runID).Kind)
	require.Empty(t, smtp.Messages())
	failed := find(b.Events(t, runID), event.StepFailed, "mail")
	require.Len(t, failed, 1)
	require.Contains(t, data[event.StepFailedData](t, failed[0]).Error, "subject contains a control character")
}

// emailCrash kills the worker while the SMTP server holds the session at
// stage, lets a second worker finish the run, and returns the run's events.
func emailCrash(t *testing.T, stage connectortest.Stage) (*connectortest.SMTPReceiver, string, []event.Event) {
	t.Helper()
	p := setupProc(t, time.Second)
	smtp := connectortest.NewSMTPReceiver(t)
	hold := smtp.Hold(stage)
	w1 := p.palWorker(t, "w1", "PAL_SMTP_URL="+smtp.URL())
	runID := p.startWithID(t, emailWorkflow, emailInput)
	require.NoError(t, hold.Wait(ctxFor(t, 30*time.Second)), "w1 never reached the SMTP server:\n%s", w1.Output())
	w1.Kill()
	p.palWorker(t, "w2", "PAL_SMTP_URL="+smtp.URL())
	hold.Release()

	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)
	evs := p.Events(t, runID)
	require.Len(t, find(evs, event.SideEffectClaimed, "mail"), 1)
	require.Empty(t, find(evs, event.SideEffectDelivered, "mail"))
	done := find(evs, event.StepCompleted, "mail")
	require.Len(t, done, 1)
	require.Equal(t, event.DeliveryUnconfirmed, data[event.StepCompletedData](t, done[0]).Delivery)
	return smtp, key(runID, "mail", 1), evs
}

func TestEmailCrashBetweenClaimAndSend(t *testing.T) {
	t.Parallel()
	smtp, k, _ := emailCrash(t, connectortest.HoldBeforeMail)
	require.Empty(t, smtp.Messages(), "the killed worker's message never went out, and nobody sent another")
	require.Zero(t, smtp.Count(email.MessageID(k)))
}

func TestEmailCrashAfterSendBeforeDelivered(t *testing.T) {
	t.Parallel()
	smtp, k, _ := emailCrash(t, connectortest.HoldAfterData)
	require.Len(t, smtp.Messages(), 1, "one email, from the killed worker")
	require.Equal(t, 1, smtp.Count(email.MessageID(k)))
}
