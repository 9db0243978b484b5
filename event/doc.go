// Package event defines PAL's journal: the event envelope that every run's
// JetStream subject carries, the event kinds, their typed payloads and the
// wire codec.
//
// Invariants:
//
//   - seq is the run's own gapless counter, starting at 1. (run_id, seq)
//     identifies an event everywhere: in the stream (Nats-Msg-Id
//     "<run_id>:<seq>"), in Postgres (journal_events primary key) and over
//     SSE (Last-Event-ID).
//   - A message on pal.events.<run_id> normally carries one envelope (a JSON
//     object). In strict durability mode a worker may pack consecutive events
//     of one run into one message, as a JSON array of envelopes with
//     consecutive seq values; Nats-Msg-Id then names the first seq. Decode
//     accepts both forms.
//   - Payloads are additive: a reader ignores fields it does not know.
//   - The journal is a hash chain: every event's prev is Hash of the exact
//     bytes of the previous message on its subject ("" on the first; the
//     same for every event of a packed message). Chain checks a run's
//     messages — the chain, the run id, gapless seq, and that Driven kinds
//     come from the worker of the latest run_resumed — and every reader
//     applies it before anything is folded; *CorruptError says where the
//     journal broke, and the run then fails with CodeJournalCorrupt.
//   - A thread (thread.go) is a conversation runs continue, journaled on
//     its own subject as ThreadRecords linked by the same rule (Link: seq
//     after seq, prev the Hash of the message before); ThreadChain
//     verifies and folds it, and a record without its Nats-Msg-Id
//     (ThreadMsgID) is refused (ErrThreadCorrupt).
//
// The JSON Schema for the envelope lives in package schemas; every event PAL
// writes validates against it. docs/architecture.md §6 lists the kinds and
// what each carries.
package event
