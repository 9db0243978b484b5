// Package natsauth defines PAL's NATS roles once: the publish and subscribe
// permissions each kind of process gets, for the embedded server of pal dev
// and the tests (as nkey users) and for the configs in deploy/nats (as
// user/password users, rendered by Conf).
//
// The roles:
//
//   - worker: writes the journal, drives runs (work, timers, leases), signs
//     run receipts (PAL_RECEIPTS, create only: one key per run), runs
//     the command processor and answers the NATS service; it also creates
//     PAL's streams and its durable consumers (eventstore.Setup). It
//     watches journals too: pal dev's dev.env gives the pal commands run
//     beside it (pal run watch, start --wait) the worker's seed.
//   - projector: reads the journal through its durable consumer and writes
//     dead letters; with PAL_RETENTION it purges finished runs' journals.
//   - api: what pal server needs: appends inputs (run_created,
//     approval_received, run_cancelled), enqueues runs, announces cancels,
//     answers the NATS service, reads and watches journals.
//   - client: publishes durable commands, calls the NATS service, reads
//     journals (Direct Get, its own ordered consumers), watches the
//     leases and LLM steps' streamed text (pal.deltas.*, PAL_DELTAS). It
//     can write nothing PAL reads as truth, nor publish deltas.
//   - admin: everything.
//
// NATS checks subjects, not message bodies. Two things follow for the
// client role. A consumer create names its consumer in the subject but
// says in the body whether it is durable, so the server cannot refuse
// durable creates on the subjects that ordered consumers use too: the
// client may create consumers on PAL_EVENTS and KV_PAL_LEASES only (reads),
// never under the names PAL's own durables use, and not through the
// DURABLE.CREATE endpoint. And a push consumer's deliver subject is in the
// body: the server delivers there as itself, past the client's publish
// permissions. No PAL stream stores such a copy and no PAL subscriber acts
// on one (docs/architecture.md §5.6, TestClientPushConsumerCannotWrite).
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
	Client    Role = "client"
	Admin     Role = "admin"
)

// Roles lists every role, in the order configs and files list them.
var Roles = []Role{Worker, Projector, API, Client, Admin}

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

// For returns the permissions of role; an unknown role gets none.
func For(role Role) Permissions {
	switch role {
	case Worker:
		return worker()
	case Projector:
		return projector()
	case API:
		return api()
	case Client:
		return client()
	case Admin:
		return Permissions{PubAllow: []string{">"}, SubAllow: []string{">"}}
	}
	return Permissions{PubDeny: []string{">"}, SubDeny: []string{">"}}
}

// palStreams are the streams the worker sets up.
var palStreams = []string{eventstore.EventsStream, eventstore.WorkStream, eventstore.CommandsStream,
	eventstore.TimersStream, deadStream, leaseStream, receiptStream, inflightStream, blobStream, snapshotStream,
	eventstore.BlobRefsStream, eventstore.DeltasStream}

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

// service is what answering the NATS micro service pal takes (requests in,
// replies to inboxes, discovery on $SRV).
var serviceSub = []string{"pal.api.>", "$SRV.>"}

func worker() Permissions {
	pub := []string{
		eventstore.EventsPrefix + "*", eventstore.WorkPrefix + "*", "pal.timer.>", leasePrefix + ">",
		receiptPrefix + "*", eventstore.CancelPrefix + "*", eventstore.RejectedSubject, deadPrefix + ">", inbox,
		jsAPI + "INFO", inflightPrefix + ">", eventstore.WorkPinSubject,
		// Presence (instant takeover): probing peers, answering their
		// probes (to their _PAL_INBOX), and deleting a departed peer's
		// work message to requeue its run.
		eventstore.PresencePrefix + "*", palInbox, jsAPI + "STREAM.MSG.DELETE." + eventstore.WorkStream,
		// LLM steps' text as it streams (PAL_DELTAS, read with the
		// other streams below).
		eventstore.DeltaPrefix + "*",
	}
	for _, s := range palStreams {
		pub = append(pub, jsAPI+"STREAM.CREATE."+s, jsAPI+"STREAM.UPDATE."+s)
	}
	pub = append(pub, read(palStreams...)...)
	// A resume (the command processor, the service) replaces a run's
	// pending work message so a worker takes it at once.
	pub = append(pub, jsAPI+"STREAM.MSG.DELETE."+eventstore.WorkStream)
	pub = append(pub, durable(eventstore.WorkStream, eventstore.WorkConsumer)...)
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
		eventstore.EventsPrefix + "*", eventstore.WorkPrefix + "*", eventstore.CancelPrefix + "*",
		eventstore.RejectedSubject, inbox, jsAPI + "INFO",
		// Starts index their run, ends (a cancel) remove it (PAL_INFLIGHT).
		inflightPrefix + ">",
	}
	pub = append(pub, read(eventstore.EventsStream, eventstore.WorkStream, eventstore.CommandsStream, leaseStream, receiptStream,
		eventstore.DeltasStream)...)
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
	return Permissions{
		PubAllow: pub,
		PubDeny:  projectorNames(),
		// pal.watch.*: watches (the REST event feeds) take the journal's
		// republished copies there; pal.deltas.*: LLM steps' text as it
		// streams (the feeds with deltas).
		SubAllow: append([]string{inbox, palInbox, eventstore.WatchPrefix + "*", eventstore.DeltaPrefix + "*"}, serviceSub...),
	}
}

func client() Permissions {
	pub := []string{
		eventstore.CommandPrefix + "*", "pal.api.>", "$SRV.>", jsAPI + "INFO", jsAPI + "STREAM.NAMES",
	}
	// Receipts are signed statements anyone may read (pal run receipt);
	// PAL_DELTAS holds the text LLM steps stream (pal run watch).
	pub = append(pub, read(eventstore.EventsStream, leaseStream, receiptStream, eventstore.DeltasStream)...)
	pub = append(pub, ordered(eventstore.EventsStream)...)
	pub = append(pub, ordered(leaseStream)...)
	// It reads the journal, so it reads the big values the journal names.
	pub = append(pub, readBlobs()...)
	// The allow list already leaves these out; denying them too says so,
	// and keeps them out if a broader allow is ever added.
	deny := []string{
		eventstore.EventsPrefix + ">", eventstore.WatchPrefix + ">", eventstore.DeltaPrefix + ">", eventstore.WorkPrefix + ">",
		"pal.timer.>", "pal.ctl.>", "$KV.>", "$O.>",
		deadPrefix + ">", eventstore.RejectedSubject,
		jsAPI + "STREAM.CREATE.>", jsAPI + "STREAM.UPDATE.>", jsAPI + "STREAM.DELETE.>", jsAPI + "STREAM.PURGE.>",
		jsAPI + "STREAM.MSG.DELETE.>", jsAPI + "STREAM.RESTORE.>", jsAPI + "STREAM.SNAPSHOT.>",
		jsAPI + "CONSUMER.DURABLE.CREATE.>",
	}
	deny = append(deny, projectorNames()...)
	return Permissions{
		PubAllow: pub,
		PubDeny:  deny,
		// pal.cmd.rejected: the README's "nats sub pal.cmd.rejected";
		// pal.deltas.*: LLM steps' text as it streams (pal run watch).
		SubAllow: []string{inbox, eventstore.RejectedSubject, eventstore.WatchPrefix + "*", eventstore.DeltaPrefix + "*"},
	}
}

// projectorNames are the subjects that would create, change or delete the
// projector's durable consumer.
func projectorNames() []string {
	p := jsAPI + "CONSUMER."
	s := eventstore.EventsStream + "." + projectorConsumer
	return []string{p + "CREATE." + s, p + "CREATE." + s + ".>", p + "DELETE." + s}
}
