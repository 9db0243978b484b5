// Package registry is the one name-to-implementation map behind PAL's
// seams: provider.Registry (LLM providers by name) and connector.Registry
// (connectors by kind) are both a Registry.
package registry

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// A Kind names what a registry holds, for the error of a failed lookup.
// It is a type, not a value, so that a Registry stays a plain map that
// callers build with a composite literal.
type Kind interface {
	// Unknown is the sentinel a lookup of an unregistered name wraps
	// (provider.ErrUnknownProvider). Its text names the thing.
	Unknown() error
}

// Registry maps names to implementations of T.
type Registry[T any, K Kind] map[string]T

// Get returns the implementation registered under name. Errors: an error
// wrapping K's Unknown sentinel, which lists the names registered.
func (r Registry[T, K]) Get(name string) (T, error) {
	v, ok := r[name]
	if !ok {
		var k K
		return v, fmt.Errorf("%w %q (configured: %s)", k.Unknown(), name, r.names())
	}
	return v, nil
}

// names lists the registered names, sorted, or says there are none.
func (r Registry[T, K]) names() string {
	if len(r) == 0 {
		return "none"
	}
	return strings.Join(slices.Sorted(maps.Keys(r)), ", ")
}
