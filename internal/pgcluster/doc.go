// Package pgcluster runs a PostgreSQL cluster from the machine's PostgreSQL
// binaries: the local database of `pal dev` (Dev) and the throwaway clusters
// of PAL's tests (paltest/testenv builds on Init and Start).
//
// # Binaries
//
// BinDir finds initdb, pg_ctl and postgres: next to initdb on PATH, else in
// `pg_config --bindir`, else in the highest version under
// /usr/lib/postgresql/*/bin (Debian and Ubuntu keep them off PATH). Without
// them every entry point returns ErrNotInstalled, whose message says to
// install PostgreSQL (apt-get install postgresql) or to set DATABASE_URL.
//
// # Lifecycle
//
// Init runs initdb once (the postgres superuser with a generated password,
// scram-sha-256 authentication, UTF8, the C locale) and leaves an existing
// cluster alone. Start runs pg_ctl start
// and returns a *Cluster once the server accepts connections; Stop runs
// pg_ctl stop in the mode asked for, and Cluster.Start starts it again on
// the same port. Readiness is polled (pg_ctl -w, then a connection), never
// slept for; every wait ends with its context.
//
// A server that died (SIGKILL, a crash of the machine) leaves its
// postmaster.pid behind. PostgreSQL ignores such a file only if its pid is
// gone; Start also clears it when the pid is a zombie (a killed postmaster
// that nobody reaps, as under a container init that does not reap orphans)
// or a live process in another directory (the pid was reused), and waits
// for the dead server's remaining processes to release its shared memory.
//
// # Invariants
//
//   - The server listens on 127.0.0.1 only, and on a Unix socket only if
//     Options.SocketDir names a directory for it.
//   - Every connection, over TCP or the Unix socket, authenticates with
//     scram-sha-256; no user is trusted. The postgres password is generated
//     by Init and kept in PasswordFile in the data directory (mode 0600),
//     so it lasts as long as the cluster; DSN carries it. Dev gives a
//     cluster made before this (trust) a password before it returns. The
//     clusters are for development and tests, never for production data.
//   - When PAL runs as root, initdb and the server run as user postgres
//     (else nobody), because PostgreSQL refuses to run as root; the data
//     directory, log file and socket directory belong to that user, which
//     must be able to reach them. Dev moves its data where that user can
//     when the checkout is closed to it; Init and Start fail with a message
//     naming the directory instead.
//   - The PostgreSQL programs get a minimal environment (PATH, TMPDIR, TZ,
//     the C locale): no PG* variable redirects them, and no PAL setting or
//     provider key reaches a process of another user.
//   - Options.Fsync decides durability: on for Dev, off for tests. Either
//     way synchronous_commit stays on, so what the server acknowledged
//     survives StopImmediate and a killed server.
package pgcluster
