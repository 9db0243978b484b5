package event

import (
	"errors"
	"fmt"
	"strconv"
)

// Deployed names one version of a deployed workflow (the registry
// PAL_WORKFLOWS): its name, its version (from 1, one up for each new
// content) and the hex sha256 of its definition's compact JSON, which is
// run_created's workflow_hash for that definition.
type Deployed struct {
	Name    string `json:"name"`
	Version uint64 `json:"version"`
	SHA256  string `json:"sha256"`
}

// String writes d as NAME@VERSION.
func (d Deployed) String() string { return d.Name + "@" + strconv.FormatUint(d.Version, 10) }

// MaxWorkflowNameLen bounds a deployed workflow's name.
const MaxWorkflowNameLen = 128

// ErrInvalidWorkflowName is wrapped by every refused workflow name.
var ErrInvalidWorkflowName = errors.New("invalid workflow name")

// ValidateWorkflowName refuses a name a workflow cannot be deployed under:
// one that is empty, longer than MaxWorkflowNameLen, or holds anything but
// letters, digits, '_' and '-'. The name is a key of PAL_WORKFLOWS (a
// NATS subject token) and is written NAME@VERSION, so dots, '@', spaces
// and wildcards are out.
func ValidateWorkflowName(name string) error {
	if name == "" {
		return fmt.Errorf("%w: empty", ErrInvalidWorkflowName)
	}
	if len(name) > MaxWorkflowNameLen {
		return fmt.Errorf("%w %q: longer than %d characters", ErrInvalidWorkflowName, truncate(name), MaxWorkflowNameLen)
	}
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
		default:
			return fmt.Errorf("%w %q: character %q not allowed (use letters, digits, '_' and '-')", ErrInvalidWorkflowName, truncate(name), r)
		}
	}
	return nil
}
