package natsauth

import (
	"github.com/palrun/pal/eventstore"
)

// The two accounts. PAL's processes (the worker, projector, api and admin
// roles) live in PALAccount with PAL's streams; people, scripts and
// services connect to ClientAccount, which reaches PAL only through the
// imports Links lists.
const (
	PALAccount    = "PAL"
	ClientAccount = "PAL_CLIENTS"
)

// Link is one subject PAL's account exports and the client account
// imports. Across a service import the server gives each request a reply
// subject of its own (_R_.…) that leads back only to the importing
// account, so no answer of a responder in PAL's account can be aimed at
// PAL's subjects; a stream import carries what PAL's account publishes on
// the subject to the client account's subscribers.
type Link struct {
	// Subject is the subject in PAL's account.
	Subject string
	// To is the subject clients use, when it is not Subject.
	To string
	// Stream: PAL publishes, clients subscribe. Otherwise a service:
	// clients request, PAL answers.
	Stream bool
	// Many: a service request may be answered with several messages
	// (discovery, batched Direct Get, a pull).
	Many bool
	// Share: the request carries the requesting user in
	// Nats-Request-Info (Users.Requester).
	Share bool
}

// readStreams are the streams clients read: stream info, message get and
// Direct Get. PAL_DELTAS: a watch that begins mid-step reads the text so
// far there (eventstore.Store.WatchDeltas). PAL_THREADS: pal thread get
// (eventstore.Store.ReadThread).
var readStreams = []string{eventstore.EventsStream, leaseStream, receiptStream, blobStream, workflowStream,
	eventstore.DeltasStream, eventstore.ThreadsStream}

// consumeStreams are the streams clients may consume, with consumers of
// their own made through PAL's guard (Guard): nats sub --stream PAL_EVENTS,
// nats kv watch PAL_LEASES, an object's chunks, nats kv ls PAL_WORKFLOWS.
var consumeStreams = []string{eventstore.EventsStream, leaseStream, blobStream, workflowStream}

// GuardPrefix is where PAL's guard answers the client account's consumer
// creates: pal.guard.CONSUMER.CREATE.<stream>[.…], imported as
// $JS.API.CONSUMER.CREATE.<stream>[.…].
const GuardPrefix = "pal.guard."

// Links lists what crosses from PAL's account to the client account.
func Links() []Link {
	links := []Link{
		// Durable commands: the JetStream ack comes back across the import.
		{Subject: eventstore.CommandPrefix + "*.*"},
		// The NATS service and its discovery.
		{Subject: "pal.api.>", Share: true},
		{Subject: "$SRV.>", Many: true},
		// Account info also keeps the server's own JetStream import out of
		// the client account, which has no JetStream of its own.
		{Subject: jsAPI + "INFO"},
		{Subject: jsAPI + "STREAM.NAMES"},
	}
	for _, s := range readStreams {
		links = append(links,
			Link{Subject: jsAPI + "STREAM.INFO." + s},
			Link{Subject: jsAPI + "STREAM.MSG.GET." + s},
			Link{Subject: jsAPI + "DIRECT.GET." + s, Many: true},
			Link{Subject: jsAPI + "DIRECT.GET." + s + ".>", Many: true})
	}
	for _, s := range consumeStreams {
		links = append(links,
			Link{Subject: GuardPrefix + "CONSUMER.CREATE." + s, To: jsAPI + "CONSUMER.CREATE." + s, Share: true},
			Link{Subject: GuardPrefix + "CONSUMER.CREATE." + s + ".>", To: jsAPI + "CONSUMER.CREATE." + s + ".>", Share: true},
			Link{Subject: jsAPI + "CONSUMER.INFO." + s + ".*"},
			Link{Subject: jsAPI + "CONSUMER.DELETE." + s + ".*"},
			Link{Subject: jsAPI + "CONSUMER.MSG.NEXT." + s + ".*", Many: true},
			Link{Subject: "$JS.FC." + s + ".>"})
	}
	return append(links,
		// Push consumers deliver to the client's inbox, and durable
		// commands are answered there. PAL's own processes use
		// _PAL_INBOX, which stays in PAL's account.
		Link{Subject: inbox, Stream: true},
		Link{Subject: eventstore.WatchPrefix + "*", Stream: true},
		// LLM steps' text as it streams (eventstore.DeltaSubject).
		Link{Subject: eventstore.DeltaPrefix + "*", Stream: true},
		Link{Subject: eventstore.RejectedSubject, Stream: true},
	)
}

// UserPermissions is what u may do in the client account, from its
// scopes: read renders the journal, leases, receipts, big values, the
// deployed workflows, the deltas PAL_DELTAS keeps, the threads, the live feeds
// (pal.watch.*, pal.deltas.*), pal.api.runs.get and
// pal.api.workflows.get and list, pal.api.schedules.get and list; deploy
// renders pal.api.workflows.deploy and pal.api.schedules.create, pause,
// resume and delete; start pal.api.schedules.trigger; each command's scope renders the
// command on the service (pal.api.runs.<kind>) and as a durable command
// under u's own name (CommandSubject), so a durable command's subject
// says who sent it.
func UserPermissions(u User) Permissions {
	var pub []string
	sub := []string{inbox}
	if u.Scopes.Has(ScopeRead) {
		pub = append(pub, "$SRV.>", jsAPI+"INFO", jsAPI+"STREAM.NAMES")
		pub = append(pub, read(readStreams...)...)
		for _, s := range consumeStreams {
			pub = append(pub, ordered(s)...)
			pub = append(pub, jsAPI+"CONSUMER.CREATE."+s) // the legacy ephemeral create
		}
		sub = append(sub, eventstore.WatchPrefix+"*", eventstore.DeltaPrefix+"*", eventstore.RejectedSubject)
		pub = append(pub, workflowsPrefix+"get", workflowsPrefix+"list", schedulesPrefix+"get", schedulesPrefix+"list")
	}
	if u.Scopes.Has(ScopeDeploy) {
		pub = append(pub, eventstore.WorkflowDeploySubject)
		for _, ep := range []string{"create", "pause", "resume", "delete"} {
			pub = append(pub, schedulesPrefix+ep)
		}
	}
	if u.Scopes.Has(ScopeStart) {
		pub = append(pub, schedulesPrefix+"trigger")
	}
	for _, kind := range Commands() {
		if s, _ := CommandScope(kind); u.Scopes.Has(s) {
			pub = append(pub, "pal.api.runs."+kind)
			if kind != "get" {
				pub = append(pub, CommandSubject(kind, u.Name))
			}
		}
	}
	return Permissions{PubAllow: pub, PubDeny: projectorNames(), SubAllow: sub}
}
