package projections

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// MigrationsTable records the migrations applied to a schema.
const MigrationsTable = "pal_schema_migrations"

// Advisory lock keys (pg_advisory_*lock): one namespace, "PAL" in the high
// bytes, so they do not collide with an application's own locks.
const (
	// lockMigrate serialises migrations of a database.
	lockMigrate int64 = 0x50414c_0001
	// lockBatch is taken by every projector batch transaction and by the
	// swap at the end of a rebuild, so a batch never lands between the
	// rebuild's catch-up and its swap.
	lockBatch int64 = 0x50414c_0002
	// lockRebuild keeps two rebuilds of one database apart (session lock).
	lockRebuild int64 = 0x50414c_0003
)

// Migration is one embedded schema migration.
type Migration struct {
	// Version orders migrations; it is the file name's leading number.
	Version int64
	// Name is the file name, e.g. 0001_initial.sql.
	Name string
	sql  string
}

// AppliedMigration is a migration Migrate applied, and how long it took.
type AppliedMigration struct {
	Migration
	Duration time.Duration
}

// MigrateResult says what Migrate did.
type MigrateResult struct {
	// Applied lists the migrations applied by this call, in order; empty
	// when the schema was up to date.
	Applied []AppliedMigration
	// Version is the schema version after the call.
	Version int64
}

// Migrations returns the embedded migrations in order.
func Migrations() ([]Migration, error) {
	names, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	out := make([]Migration, 0, len(names))
	seen := map[int64]string{}
	for _, p := range names {
		name := path.Base(p)
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.ParseInt(num, 10, 64)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must start with a positive version number and '_'", name)
		}
		if other, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations %s and %s have the same version %d", other, name, v)
		}
		seen[v] = name
		body, err := migrationFiles.ReadFile(p)
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: v, Name: name, sql: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Migrate applies the embedded migrations that the database lacks, each in
// its own transaction, to the schema where the pool's unqualified table
// names resolve (the first schema of search_path, usually public). It is
// safe to run from several processes at once (an advisory lock serialises
// them) and is a no-op, writing nothing, when the schema is up to date.
//
// Errors are the database's, wrapped with the migration's name.
func Migrate(ctx context.Context, pool *pgxpool.Pool) (MigrateResult, error) {
	return migrate(ctx, pool, "")
}

// migrate applies the migrations to schema ("" for the pool's default).
func migrate(ctx context.Context, pool *pgxpool.Pool, schema string) (MigrateResult, error) {
	var res MigrateResult
	ms, err := Migrations()
	if err != nil {
		return res, err
	}
	done, err := appliedVersions(ctx, pool, schema)
	if err != nil {
		return res, err
	}
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		start := time.Now()
		applied, err := applyMigration(ctx, pool, schema, m)
		if err != nil {
			return res, err
		}
		if applied {
			res.Applied = append(res.Applied, AppliedMigration{Migration: m, Duration: time.Since(start)})
		}
		done[m.Version] = true
	}
	for v := range done {
		res.Version = max(res.Version, v)
	}
	return res, nil
}

// appliedVersions reads the migrations table without taking a lock; a
// missing table means nothing was applied.
func appliedVersions(ctx context.Context, pool *pgxpool.Pool, schema string) (map[int64]bool, error) {
	var vs []int64
	rows, err := pool.Query(ctx, "SELECT version FROM "+qualify(schema, MigrationsTable))
	if err == nil {
		vs, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return map[int64]bool{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", MigrationsTable, err)
	}
	done := make(map[int64]bool, len(vs))
	for _, v := range vs {
		done[v] = true
	}
	return done, nil
}

// applyMigration applies m in one transaction that holds the migration
// lock, unless another process applied it first.
func applyMigration(ctx context.Context, pool *pgxpool.Pool, schema string, m Migration) (bool, error) {
	applied := false
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if schema != "" {
			if _, err := tx.Exec(ctx, "SELECT set_config('search_path', $1, true)", pgx.Identifier{schema}.Sanitize()); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", lockMigrate); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+MigrationsTable+` (
			version    bigint PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+MigrationsTable+" WHERE version = $1)", m.Version).Scan(&exists); err != nil {
			return err
		}
		if exists {
			return nil
		}
		// No arguments: the simple protocol, so a file may hold many statements.
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+MigrationsTable+" (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
			return err
		}
		applied = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("applying migration %s: %w", m.Name, err)
	}
	return applied, nil
}

// qualify returns table, qualified with schema when schema is not empty.
func qualify(schema, table string) string {
	if schema == "" {
		return table
	}
	return pgx.Identifier{schema, table}.Sanitize()
}
