package projections

// SetFoldHook makes p run hook before folding a run's events (set it
// before Start): a test's way to make the fold fail on a given run.
func SetFoldHook(p *Projector, hook func(runID string)) { p.f.hook = hook }
