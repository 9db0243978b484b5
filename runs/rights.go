package runs

import (
	"errors"
	"fmt"
	"strings"
)

// Rights is what the caller of a command may do, as its transport
// established it: REST from the token's scopes, the NATS service and the
// durable commands from the caller's (Caller.Rights), the CLI from its
// own NATS credentials. The transport sets it on the command; the Client
// checks it, so every transport keeps one rule. The zero value may do
// nothing.
type Rights uint8

const (
	// RightStart starts runs of deployed workflows, and resumes, forks
	// and retries runs with the workflow they have.
	RightStart Rights = 1 << iota
	// RightDeploy deploys workflows: it also lets a start bring its own
	// definition (which is deployed first: the run is of a deployed
	// version), a plain-LLM start, and a fork with another workflow.
	RightDeploy

	// AllRights is every right: a process acting as itself (the CLI, a
	// test), which its NATS credentials bound, and REST's admin.
	AllRights = RightStart | RightDeploy
)

// Has reports whether r holds every right of want.
func (r Rights) Has(want Rights) bool { return r&want == want }

// String names r's rights as REST's scopes do: "start+deploy".
func (r Rights) String() string {
	var parts []string
	if r.Has(RightStart) {
		parts = append(parts, "start")
	}
	if r.Has(RightDeploy) {
		parts = append(parts, "deploy")
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "+")
}

// CodeForbidden classifies a *ForbiddenError: the caller lacks a right
// or a scope, or is not a user PAL knows (403 on REST and the NATS
// service).
const CodeForbidden = "forbidden"

// ErrForbidden is matched by every *ForbiddenError.
var ErrForbidden = errors.New("forbidden")

// ForbiddenError refuses what the caller may not do; nothing is written.
// A missing right names it (as REST's scope of the same name), the field
// of the command that needs it, and why; any other refusal (a scope the
// NATS caller lacks, a name it may not speak for) is its Msg.
type ForbiddenError struct {
	// Need is the right the command needs and the caller lacks (zero
	// when the refusal is Msg).
	Need Rights
	// Field is the command's field at fault ("workflow", "approver").
	Field string
	// What says what needs Need: "starting an inline workflow".
	What string
	// Msg is a refusal that is not of a right.
	Msg string
}

func (e *ForbiddenError) Error() string {
	if e.Msg != "" {
		return e.Msg
	}
	msg := fmt.Sprintf("%s needs the right to %s (scope %s), which the caller lacks", e.What, e.Need, e.Need)
	if e.Need == RightDeploy && e.Field != "" && e.What != whatDeploy {
		msg += "; a caller that may deploy deploys it (PUT /v1/workflows/{name}, pal workflow deploy), then this one starts it by name"
	}
	return msg
}

// whatDeploy is what a deploy is called in its refusal.
const whatDeploy = "deploying a workflow"

// Is makes errors.Is(err, ErrForbidden) hold.
func (e *ForbiddenError) Is(target error) bool { return target == ErrForbidden }

// need refuses rights that lack want, for what (a field of the command).
func need(have, want Rights, field, what string) error {
	if have.Has(want) {
		return nil
	}
	missing := want &^ have
	if missing.Has(RightStart) {
		missing = RightStart
	}
	return &ForbiddenError{Need: missing, Field: field, What: what}
}
