// Package limit bounds what one caller may ask of PAL: token-bucket rates
// (golang.org/x/time/rate) and a cap on what it holds at once, each kept
// per key: an identity (a REST token's name, a NATS user) or a client
// address. REST, gRPC, the NATS service and the durable command processor
// call the same Limiter, so a limit holds whichever door a caller comes
// in by.
//
// Invariants:
//
//   - Memory is bounded whatever the keys: at most MaxKeys buckets per
//     rate (a bucket that is full again is forgotten first), and an open
//     count exists only while something is held.
//   - A refusal spends nothing and says how long to wait (*Error, which
//     matches ErrLimited); the doors answer it as 429 with Retry-After,
//     gRPC RESOURCE_EXHAUSTED, or the answer code rate_limited.
//   - The zero Rate, and a nil *Limiter, limit nothing.
//   - Time comes from the clock given to New and NewBuckets, so tests
//     step it instead of sleeping.
package limit
