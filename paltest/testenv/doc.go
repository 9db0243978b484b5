// Package testenv is the environment PAL's integration tests run in: real
// servers, started for the test and torn down after it, never mocks.
//
// Every test package that uses it declares
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// Main runs the tests, stops the PostgreSQL cluster and removes the binaries
// the package started or built, checks for leaked goroutines (goleak) and
// exits with the tests' status.
//
// # JetStream
//
// NATS starts a JetStream server inside the test process, with file storage
// in t.TempDir(), listening on 127.0.0.1 on a random port, silent unless
// Logging is given. Strict makes it fsync every write before acknowledging
// (PAL_DURABILITY=strict). Restart stops it and starts a new one on the same
// port and store directory; connections from Conn reconnect by themselves,
// and Restart returns once they have. Roles turns on PAL's two NATS
// accounts as pal dev sets them up (eventstore/natsauth): ConnAs connects
// as a role of PAL's account, ConnAsUser as a client user (ClientUsers
// adds some; Users lists them for PAL's processes), Conn as admin.
//
// CountRequests connects as Conn does and counts the requests the
// connection sends (publishes with a reply subject, whose answer the
// sender waits for), by subject, as it writes them to its socket: the
// round-trip count tests of PAL's hot paths use it.
//
// NATSProcess runs nats-server as a separate process, for tests that kill -9
// the broker: Kill sends SIGKILL, Start brings it back on the same port and
// store directory, and anything JetStream acknowledged before the kill must
// still be there. The binary is built from the nats-server version in go.mod
// and cached under os.TempDir()/pal-testenv-cache, keyed by that version, the
// Go version and the platform, so only the first test run on a machine pays
// for the build.
//
// # Processes and binaries
//
// PalBinary builds ./cmd/pal once per test binary; BuildBinary does the same
// for any main package. StartProcess runs a binary with its output captured
// (logged when the test fails), a hermetic environment (the parent's PAL_*,
// DATABASE_URL, OPENAI_* and ANTHROPIC_* variables are dropped) and helpers
// to kill -9, freeze (SIGSTOP), resume (SIGCONT) or terminate it and to await
// a log line. On Linux a child dies with the test binary, even if that is
// killed by a -timeout panic. The test's cleanup kills anything still
// running.
//
// # PostgreSQL
//
// Postgres gives each call a fresh database, pal_test_<random>, dropped
// after the test. The server is found this way:
//
//  1. DATABASE_URL, when set, is the administrative connection: its user
//     must be allowed to CREATE DATABASE.
//  2. Otherwise the first call starts one throwaway cluster for the whole
//     test binary from the machine's PostgreSQL, with internal/pgcluster (the
//     code pal dev uses too): initdb and pg_ctl from PATH, else from
//     `pg_config --bindir`, else from the highest version in
//     /usr/lib/postgresql/*/bin (Debian, Ubuntu). It listens on 127.0.0.1 on
//     a free port and on a Unix socket in its own directory, never fsyncs, and
//     is removed by Main. initdb's result is cached under
//     os.TempDir()/pal-testenv-cache and copied for each cluster, so only the
//     first start on a machine pays for initdb. When the tests run as root,
//     the cluster runs as the postgres user (or nobody), because PostgreSQL
//     refuses to run as root.
//  3. If neither exists the test fails, saying to install PostgreSQL
//     (apt-get install postgresql) or to set DATABASE_URL. It never skips.
//
// StopServer and StartServer stop the throwaway cluster at once (as a crash
// would) and start it again, for tests of what PAL does while Postgres is
// down. The shared cluster serves every test of the binary, so such tests
// should either not run in parallel or ask for a cluster of their own with
// OwnServer (which starts one even when DATABASE_URL is set). On a database
// from DATABASE_URL they fail the test: that server is not ours to stop.
//
// Nothing started here listens on anything but 127.0.0.1.
package testenv
