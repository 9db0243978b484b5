package engine

// RetryDecision says whether a failed try of plan is retried under its
// node's policy, and with which attempt number: the same attempt (and so
// the same idempotency key) when the outcome of the failed call is unknown,
// the next one otherwise. classes are the error's retry classes; the
// policy retries if it names any of them (or "any").
func RetryDecision(plan StepPlan, classes []string, retryable, unknown bool) (retry bool, attempt, of int) {
	pol := plan.Node.Retry()
	of = pol.Attempts()
	allowed := false
	for _, c := range classes {
		allowed = allowed || pol.Retries(c)
	}
	if !retryable || !allowed || plan.Tries+1 >= of {
		return false, plan.Attempt, of
	}
	if unknown {
		return true, plan.Attempt, of
	}
	return true, plan.Attempt + 1, of
}
