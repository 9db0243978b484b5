// Package natsauth defines PAL's NATS accounts, roles and client users
// once: for the embedded server of pal dev and the tests (nkey users,
// Keys) and for the configs in deploy/nats (user/password users, Conf).
//
// Two accounts. PAL's own processes live in PALAccount with PAL's streams,
// each as its role:
//
//   - worker: writes the journal, drives runs (work, timers, leases), signs
//     run receipts (PAL_RECEIPTS, create only: one key per run), publishes
//     LLM steps' text as it streams (pal.deltas.*, kept in PAL_DELTAS),
//     runs the command processor and answers the NATS service, appends
//     threads' turns (pal.threads.*, kept in PAL_THREADS); it also
//     creates PAL's streams and its durable consumers (eventstore.Setup).
//     It watches journals and deltas too: pal dev's dev.env gives the pal
//     commands run beside it (pal run watch, start --wait) the worker's
//     seed.
//   - projector: reads the journal through its durable consumer and writes
//     dead letters; with PAL_RETENTION it purges finished runs' journals.
//   - api: what pal server needs: appends inputs (run_created,
//     approval_received, run_cancelled), enqueues runs, announces cancels,
//     answers the NATS service, reads and watches journals and deltas,
//     reads threads (GET /v1/threads/{id}).
//   - admin: everything in PAL's account, bar reading _INBOX (what crosses
//     to the clients): an operator's tools use PAL's Inbox.
//
// People, scripts and services connect to ClientAccount as Users, each
// with Scopes. That account has no JetStream of its own and imports only
// Links: durable commands under the user's own name, the NATS service
// (which learns the user from the server's Nats-Request-Info), reading
// the journal, leases, receipts, big values and the deltas PAL_DELTAS
// keeps, and the live feeds (pal.watch.*, pal.deltas.*). No client may
// publish a delta: the deltas cross one way, as a stream import.
// Across a service import the server answers on a reply subject of its
// own that leads back to the client account, so no responder in PAL's
// account (the JetStream API, a stream's Direct Get, the service, the
// command processor's ack) can be aimed at PAL's subjects.
//
// NATS checks subjects, not bodies, and a consumer create says in its
// body whether it is durable and where a push consumer delivers (the
// server delivers there itself, in the stream's account). So the client
// account's consumer creates are imported from PAL's Guard, which refuses
// durable, direct and sourcing consumers and any delivery outside the
// client's inbox, and holds each stream to MaxClientConsumers consumers
// made by clients (docs/architecture.md §5.6).
package natsauth

import (
	"slices"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/palrun/pal/eventstore"
)

// Role is one of PAL's NATS roles.
type Role string

// The roles.
const (
	Worker    Role = "worker"
	Projector Role = "projector"
	API       Role = "api"
	Admin     Role = "admin"
	// Client is not a role of PAL's account but the client account's
	// default user, DefaultUser: pal dev's and the tests' own, with
	// ClientScopes.
	Client Role = "client"
)

// Roles lists the roles of PAL's account, in the order configs and files
// list them.
var Roles = []Role{Worker, Projector, API, Admin}

// Names PAL's permissions refer to. projectorConsumer is
// projections.DefaultName (projections sits above this package; a test
// checks they agree). deadStream and deadPrefix are the dead-letter stream.
const (
	projectorConsumer = "pal-projector"
	deadStream        = eventstore.DeadStream
	deadPrefix        = eventstore.DeadPrefix
	leaseStream       = "KV_" + eventstore.LeaseBucket
	leasePrefix       = "$KV." + eventstore.LeaseBucket + "."
	receiptStream     = "KV_" + eventstore.ReceiptBucket
	receiptPrefix     = "$KV." + eventstore.ReceiptBucket + "."
	inflightStream    = "KV_" + eventstore.InflightBucket
	inflightPrefix    = "$KV." + eventstore.InflightBucket + "."
	blobStream        = eventstore.BlobStream
	blobPrefix        = "$O." + eventstore.BlobBucket + "."
	snapshotStream    = eventstore.SnapshotStream
	snapshotPrefix    = "$O." + eventstore.SnapshotBucket + "."
	inbox             = "_INBOX.>"
	palInbox          = Inbox + ".>"
	jsAPI             = "$JS.API."
)

// Inbox is the inbox prefix of PAL's long-running processes (worker,
// projector, API). Only their roles may subscribe under it, so a client,
// which subscribes _INBOX.> for its own replies, cannot read theirs (the
// JetStream API's answers name PAL's consumers, which a client could then
// change or delete).
const Inbox = "_PAL_INBOX"

// InboxOption makes a connection use Inbox.
func InboxOption() nats.Option { return nats.CustomInboxPrefix(Inbox) }

// Permissions is what one role may publish and subscribe to. Deny wins
// over allow, as in NATS.
type Permissions struct {
	PubAllow []string
	PubDeny  []string
	SubAllow []string
	SubDeny  []string
}

// Server returns the permissions in nats-server's form.
func (p Permissions) Server() *server.Permissions {
	sp := func(allow, deny []string) *server.SubjectPermission {
		if allow == nil && deny == nil {
			return nil
		}
		return &server.SubjectPermission{Allow: slices.Clone(allow), Deny: slices.Clone(deny)}
	}
	return &server.Permissions{Publish: sp(p.PubAllow, p.PubDeny), Subscribe: sp(p.SubAllow, p.SubDeny)}
}

// For returns the permissions of a role of PAL's account; any other role
// (Client included: see UserPermissions) gets none.
func For(role Role) Permissions {
	switch role {
	case Worker:
		return worker()
	case Projector:
		return projector()
	case API:
		return api()
	case Admin:
		// What PAL's account publishes on _INBOX crosses to the clients
		// (Links): an operator's replies are not for them.
		return Permissions{PubAllow: []string{">"}, SubAllow: []string{">"}, SubDeny: []string{inbox}}
	}
	return Permissions{PubDeny: []string{">"}, SubDeny: []string{">"}}
}

// palStreams are the streams the worker sets up.
var palStreams = []string{eventstore.EventsStream, eventstore.WorkStream, eventstore.CommandsStream,
	eventstore.TimersStream, deadStream, leaseStream, receiptStream, inflightStream, blobStream, snapshotStream,
	eventstore.BlobRefsStream, workflowStream, eventstore.DeltasStream, scheduleStream, eventstore.ThreadsStream}

// readBlobs is what reading PAL_BLOBS takes (eventstore.Store.Read puts big
// step values back, §6.4).
func readBlobs() []string { return readObjects(blobStream) }

// readObjects is what reading an object store's objects takes: the
// object's meta (read) and its chunks, which nats.go reads with an ordered
// push consumer (ordered, and the legacy ephemeral create endpoint it may
// use).
func readObjects(stream string) []string {
	out := read(stream)
	out = append(out, ordered(stream)...)
	return append(out, jsAPI+"CONSUMER.CREATE."+stream)
}

// read is what reading a stream takes: its info, Direct Get (by sequence,
// by subject, batched) and the stream's message get.
func read(streams ...string) []string {
	var out []string
	for _, s := range streams {
		out = append(out, jsAPI+"STREAM.INFO."+s, jsAPI+"STREAM.MSG.GET."+s,
			jsAPI+"DIRECT.GET."+s, jsAPI+"DIRECT.GET."+s+".>")
	}
	return out
}

// durable is what consuming through a named durable pull consumer takes:
// create (with or without a filter in the subject), info, next, ack.
func durable(stream, name string) []string {
	p := jsAPI + "CONSUMER."
	return []string{p + "CREATE." + stream + "." + name, p + "CREATE." + stream + "." + name + ".>",
		p + "INFO." + stream + "." + name, p + "MSG.NEXT." + stream + "." + name,
		"$JS.ACK." + stream + "." + name + ".>"}
}

// ordered is what ordered (ephemeral, named) consumers on stream take:
// create under any name, info, next (pull), delete (nats.go deletes the
// old consumer each time it resets one), and flow control replies (push,
// as KV watches use).
func ordered(stream string) []string {
	p := jsAPI + "CONSUMER."
	return []string{p + "CREATE." + stream + ".*", p + "CREATE." + stream + ".*.>",
		p + "INFO." + stream + ".*", p + "MSG.NEXT." + stream + ".*", p + "DELETE." + stream + ".*",
		"$JS.FC." + stream + ".>"}
}

// serviceSub is what answering the NATS micro service pal takes: its
// requests, discovery on $SRV, and the client account's consumer creates
// (Guard).
var serviceSub = []string{"pal.api.>", "$SRV.>", GuardPrefix + ">"}

// importReplies is where the answers to the client account's requests go:
// the reply subject the server gave each request that crossed an import,
// which leads back only to the client account.
const importReplies = "_R_.>"

// guard is what answering the client account takes: the replies of its
// imports, and for the Guard counting the consumers clients made on a
// stream and forwarding a create without a consumer name (a named one
// is ordered's).
func guard() []string {
	out := []string{importReplies}
	for _, s := range consumeStreams {
		out = append(out, jsAPI+"CONSUMER.LIST."+s, jsAPI+"CONSUMER.CREATE."+s)
	}
	return out
}

func worker() Permissions {
	pub := []string{
		eventstore.EventsPrefix + "*", eventstore.WorkPrefix + "*", eventstore.WorkPrefix + "*.*", "pal.timer.>", leasePrefix + ">",
		receiptPrefix + "*", eventstore.CancelPrefix + "*", eventstore.RejectedSubject, deadPrefix + ">", inbox,
		jsAPI + "INFO", inflightPrefix + ">", eventstore.WorkPinSubject,
		// Presence (instant takeover): probing peers, answering their
		// probes (to their _PAL_INBOX), and deleting a departed peer's
		// work message to requeue its run.
		eventstore.PresencePrefix + "*", palInbox, jsAPI + "STREAM.MSG.DELETE." + eventstore.WorkStream,
		// LLM steps' text as it streams (PAL_DELTAS, read with the
		// other streams below).
		eventstore.DeltaPrefix + "*",
		// Threads' turns (PAL_THREADS, read with the other streams
		// below): thread steps append them.
		eventstore.ThreadsPrefix + "*",
	}
	for _, s := range palStreams {
		pub = append(pub, jsAPI+"STREAM.CREATE."+s, jsAPI+"STREAM.UPDATE."+s)
	}
	pub = append(pub, read(palStreams...)...)
	// A resume (the command processor, the service) replaces a run's
	// pending work message so a worker takes it at once.
	pub = append(pub, jsAPI+"STREAM.MSG.DELETE."+eventstore.WorkStream)
	// Every queue's durable: pal-workers, pal-workers-<queue> (a subject
	// token has no prefix match, so any name on PAL_WORK).
	pub = append(pub, durable(eventstore.WorkStream, "*")...)
	pub = append(pub, durable(eventstore.CommandsStream, eventstore.CommandConsumer)...)
	pub = append(pub, durable(eventstore.TimersStream, eventstore.TimerConsumer)...)
	pub = append(pub, ordered(eventstore.EventsStream)...)
	pub = append(pub, ordered(leaseStream)...)
	pub = append(pub, ordered(inflightStream)...) // the sweep lists the runs in flight
	// Big step values: put (chunks and meta under $O.PAL_BLOBS.), read, and
	// purge a put's chunks when it failed half way; each referenced for
	// its run (PAL_BLOB_REFS, read with the other streams above).
	pub = append(pub, blobPrefix+">", jsAPI+"STREAM.PURGE."+blobStream, eventstore.BlobRefPrefix+"*.*")
	pub = append(pub, readBlobs()...)
	// Snapshots of run states (PAL_SNAPSHOTS): put, read, and delete
	// (a put or delete purges the object's old chunks).
	pub = append(pub, snapshotPrefix+">", jsAPI+"STREAM.PURGE."+snapshotStream)
	pub = append(pub, readObjects(snapshotStream)...)
	// Deployed workflows: read with the other streams above; listed and
	// written here.
	pub = append(pub, workflowPrefix+">")
	pub = append(pub, ordered(workflowStream)...)
	// Schedules: every worker fires their ticks (runs.Scheduler).
	pub = append(pub, schedules()...)
	pub = append(pub, guard()...)
	return Permissions{
		PubAllow: pub,
		// Not even a worker may take the projector's consumer.
		PubDeny: projectorNames(),
		// pal.watch.*: the journal's republished copies, for watches
		// (eventstore.Store.Watch). The worker writes the journal, so
		// reading its copies grants it nothing new.
		SubAllow: append([]string{inbox, palInbox, eventstore.CancelPrefix + "*", eventstore.PresencePrefix + "*",
			eventstore.WatchPrefix + "*", eventstore.DeltaPrefix + "*"}, serviceSub...),
	}
}

func projector() Permissions {
	pub := []string{deadPrefix + ">", jsAPI + "INFO"}
	pub = append(pub, read(eventstore.EventsStream, eventstore.WorkStream, deadStream, receiptStream)...)
	pub = append(pub, durable(eventstore.EventsStream, projectorConsumer)...)
	// The run_receipts projection watches PAL_RECEIPTS.
	pub = append(pub, ordered(receiptStream)...)
	// The projector repositions its consumer at start by recreating it.
	pub = append(pub, jsAPI+"CONSUMER.DELETE."+eventstore.EventsStream+"."+projectorConsumer)
	// pal projections rebuild reads the journal with an ordered consumer.
	pub = append(pub, ordered(eventstore.EventsStream)...)
	// steps.output gets the values of big outputs (PAL_BLOBS).
	pub = append(pub, readBlobs()...)
	// Retention (PAL_RETENTION) purges finished runs' journals by
	// subject. NATS cannot check a purge's subject filter, so this role may
	// purge all of PAL_EVENTS; no other PAL role may purge it at all.
	pub = append(pub, jsAPI+"STREAM.PURGE."+eventstore.EventsStream)
	// It releases the removed runs' blob references (PAL_BLOB_REFS: mark,
	// drop, look for others) and deletes the blobs no run references (a
	// deleted meta under $O.PAL_BLOBS.M., a purge of the chunks).
	pub = append(pub, read(eventstore.BlobRefsStream)...)
	pub = append(pub, eventstore.BlobReclaimPrefix+"*", jsAPI+"STREAM.MSG.DELETE."+eventstore.BlobRefsStream,
		blobPrefix+"M.>", jsAPI+"STREAM.PURGE."+blobStream)
	return Permissions{PubAllow: pub, SubAllow: []string{inbox, palInbox}}
}

func api() Permissions {
	pub := []string{
		eventstore.EventsPrefix + "*", eventstore.WorkPrefix + "*", eventstore.WorkPrefix + "*.*", eventstore.CancelPrefix + "*",
		eventstore.RejectedSubject, inbox, jsAPI + "INFO",
		// Starts index their run, ends (a cancel) remove it (PAL_INFLIGHT).
		inflightPrefix + ">",
	}
	pub = append(pub, read(eventstore.EventsStream, eventstore.WorkStream, eventstore.CommandsStream, leaseStream, receiptStream,
		eventstore.DeltasStream, eventstore.ThreadsStream)...)
	pub = append(pub, ordered(eventstore.EventsStream)...)
	pub = append(pub, ordered(leaseStream)...)
	// GET /v1/runs/{id} shows big values; a start's big input and a
	// fork's big copies are kept there too (run_created, §6.4).
	pub = append(pub, readBlobs()...)
	pub = append(pub, blobPrefix+">", jsAPI+"STREAM.PURGE."+blobStream, eventstore.BlobRefPrefix+"*.*")
	pub = append(pub, read(eventstore.BlobRefsStream)...)
	// POST /v1/runs/{id}/resume: a forced resume purges the run's lease,
	// and every resume replaces the run's pending work message.
	pub = append(pub, leasePrefix+"*", jsAPI+"STREAM.MSG.DELETE."+eventstore.WorkStream)
	pub = append(pub, deployWorkflows()...)
	pub = append(pub, schedules()...) // /v1/schedules
	pub = append(pub, guard()...)
	return Permissions{
		PubAllow: pub,
		PubDeny:  projectorNames(),
		// pal.watch.*: watches (the REST event feeds) take the journal's
		// republished copies there; pal.deltas.*: LLM steps' text as it
		// streams (the feeds with deltas).
		SubAllow: append([]string{inbox, palInbox, eventstore.WatchPrefix + "*", eventstore.DeltaPrefix + "*"}, serviceSub...),
	}
}

// projectorNames are the subjects that would create, change, delete or
// pull from the projector's durable consumer.
func projectorNames() []string {
	p := jsAPI + "CONSUMER."
	s := eventstore.EventsStream + "." + projectorConsumer
	return []string{p + "CREATE." + s, p + "CREATE." + s + ".>", p + "DELETE." + s, p + "MSG.NEXT." + s}
}

// Deployed workflows (PAL_WORKFLOWS, eventstore.WorkflowBucket). The
// worker and api roles deploy: their processes serve PUT
// /v1/workflows/{name} (pal server), the NATS service's
// pal.api.workflows.deploy (both), and pal workflow deploy under dev.env
// (the worker's seed). Every role that reads journals may read the
// registry: a deployed definition is in the run_created of each of its
// runs anyway, and so may a client user with scope read. Only a client
// user with scope deploy may request pal.api.workflows.deploy, and the
// service checks the requester's scopes again.
const (
	// workflowsPrefix is the NATS service's group of the registry.
	workflowsPrefix = "pal.api.workflows."
	workflowStream  = eventstore.WorkflowStream
	workflowPrefix  = "$KV." + eventstore.WorkflowBucket + "."
)

// readWorkflows is reading the registry: a version by Direct Get, a
// listing with an ordered consumer (a KV watch).
func readWorkflows() []string { return append(read(workflowStream), ordered(workflowStream)...) }

// deployWorkflows is reading and writing the registry (KV create and
// revision-checked update).
func deployWorkflows() []string { return append(readWorkflows(), workflowPrefix+">") }

// Schedules (PAL_SCHEDULES, eventstore.ScheduleBucket). The worker and
// api roles read and write them: their processes serve /v1/schedules and
// pal.api.schedules.*, and every worker fires the ticks, moving each
// schedule's last tick (a revision-checked update). A client user reaches
// them only through the service: scope read for get and list, deploy for
// create, pause, resume and delete, start for trigger.
const (
	schedulesPrefix = "pal.api.schedules."
	scheduleStream  = eventstore.ScheduleStream
	schedulePrefix  = "$KV." + eventstore.ScheduleBucket + "."
)

// schedules is reading (Direct Get, a KV watch) and writing the schedules.
func schedules() []string {
	return append(append(read(scheduleStream), ordered(scheduleStream)...), schedulePrefix+">")
}
