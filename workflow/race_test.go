//go:build race

package workflow_test

// raceEnabled is set when the race detector, which slows evaluation
// tenfold, is on.
const raceEnabled = true
