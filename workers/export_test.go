package workers

// SetBeforeDrive makes w run hook at the start of each drive, before the
// journal is read: a test's way to make a drive fail where the journal
// cannot count it.
func SetBeforeDrive(w *Worker, hook func(runID string)) { w.beforeDrive.Store(&hook) }

// FoldedHits counts the drives of w that started from a state it kept
// when it parked the run (folded.go).
func FoldedHits(w *Worker) int {
	w.folded.mu.Lock()
	defer w.folded.mu.Unlock()
	return w.folded.hits
}
