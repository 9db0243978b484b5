package projections

import "time"

// SetFoldHook makes p run hook before folding a run's events (set it
// before Start): a test's way to make the fold fail on a given run.
func SetFoldHook(p *Projector, hook func(runID string)) { p.f.hook = hook }

// SetMinRetention lowers the PAL_RETENTION minimum for one test, so a
// test can age runs past it in seconds.
func SetMinRetention(t interface{ Cleanup(func()) }, d time.Duration) {
	old := minRetention
	minRetention = d
	t.Cleanup(func() { minRetention = old })
}

// ListQuery is the SQL and arguments ListRuns runs for f, for EXPLAIN.
func ListQuery(f RunFilter) (string, []any, error) { return listQuery(f) }
