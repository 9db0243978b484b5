package workers

// SetBeforeDrive makes w run hook at the start of each drive, before the
// journal is read: a test's way to make a drive fail where the journal
// cannot count it.
func SetBeforeDrive(w *Worker, hook func(runID string)) { w.beforeDrive.Store(&hook) }
