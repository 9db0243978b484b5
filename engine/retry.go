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

// NextModel says whether a failed try of plan, an LLM step, moves on to the
// next model of its node's fallback list: when the try is not retried on
// its own model (retry, from RetryDecision, is false) or the failure is an
// outage (the provider down, or rate limiting for longer than the worker
// waits), and the list has a next model. It returns that model's index;
// the attempt after a move is a new one (plan.Attempt+1, a new key).
func NextModel(plan StepPlan, retry, outage bool) (fallback int, ok bool) {
	if plan.Exec != ExecLLM || plan.Fallback+1 >= plan.Models || (retry && !outage) {
		return plan.Fallback, false
	}
	return plan.Fallback + 1, true
}
