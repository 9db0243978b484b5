package eventstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/retry"
)

// WorkflowBucket is the registry of deployed workflows
// (docs/architecture.md §5.2). Its keys:
//
//	<name>            the latest version: {"version","sha256","by"}
//	<name>.<version>  one version: {"sha256","by","workflow"}, written once
//
// A version key is written with a KV create and never changed, so a run
// that names NAME@VERSION always finds the definition it was started
// with. The latest key moves only forward, one version at a time, with a
// revision-checked update: of two deploys of new content, one creates the
// next version's key and the other finds it taken, so each gets its own
// version (DeployWorkflow).
const WorkflowBucket = "PAL_WORKFLOWS"

// WorkflowStream is the stream behind WorkflowBucket.
const WorkflowStream = "KV_" + WorkflowBucket

// Bounds of the registry: a value (a version's definition with its
// envelope) is at most MaxWorkflowValue bytes, as big as a journal
// message, which must hold the definition in run_created anyway; the
// bucket holds at most WorkflowBucketBytes, so deploys cannot fill the
// disk (a deploy past it is refused).
const (
	MaxWorkflowValue    = DefaultMaxEventBytes
	WorkflowBucketBytes = 1 << 30
)

// ErrWorkflowNotFound: no deployed workflow has the name, or it has no
// such version.
var ErrWorkflowNotFound = errors.New("workflow not deployed")

// DeployedWorkflow is one version of a deployed workflow.
type DeployedWorkflow struct {
	event.Deployed
	// By is who deployed it.
	By string
	// At is when it was deployed, by the server's clock (in a listing of
	// the latest versions: when it became the latest).
	At time.Time
	// Definition is the workflow's compact JSON; nil in listings.
	Definition json.RawMessage
}

// latestValue is the value of a <name> key.
type latestValue struct {
	Version uint64 `json:"version"`
	SHA256  string `json:"sha256"`
	By      string `json:"by,omitempty"`
}

// versionValue is the value of a <name>.<version> key.
type versionValue struct {
	SHA256   string          `json:"sha256"`
	By       string          `json:"by,omitempty"`
	Workflow json.RawMessage `json:"workflow"`
}

func versionKey(name string, v uint64) string { return name + "." + strconv.FormatUint(v, 10) }

// maxDeployTries bounds how often a deploy starts over after another
// deploy of the same name moved the latest version under it.
const maxDeployTries = 10

// workflowSetup is the registry's bucket, as Setup creates it.
func workflowSetup(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:       WorkflowBucket,
		Description:  "PAL deployed workflows: <name> → its latest version, <name>.<version> → the definition",
		History:      1,
		Storage:      jetstream.FileStorage,
		Replicas:     replicas,
		MaxValueSize: MaxWorkflowValue,
		MaxBytes:     WorkflowBucketBytes,
	}
}

func (s *Store) workflowKV(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := s.workflows.get(func() (jetstream.KeyValue, error) { return s.js.KeyValue(ctx, WorkflowBucket) })
	if err != nil {
		return nil, fmt.Errorf("opening KV bucket %s: %w", WorkflowBucket, err)
	}
	return kv, nil
}

// DeployWorkflow deploys def (a workflow's compact JSON, already
// validated) under name, written by by. When def is the latest version's
// content (same sha256) nothing is written and that version is returned
// with created false; otherwise def becomes the next version, created
// true. Two deploys of new content at once get two versions: each tries
// to create the next version's key, and the one that finds it taken moves
// the latest key to it (for a deploy that may have stopped there) and
// tries the version after.
//
// Errors: event.ErrInvalidWorkflowName; ErrPayloadTooLarge for a
// definition over MaxWorkflowValue; a deploy that keeps finding the next
// version taken (maxDeployTries) fails, worth trying again.
func (s *Store) DeployWorkflow(ctx context.Context, name string, def json.RawMessage, by string) (DeployedWorkflow, bool, error) {
	if err := event.ValidateWorkflowName(name); err != nil {
		return DeployedWorkflow{}, false, err
	}
	sum := sha256.Sum256(def)
	d := DeployedWorkflow{Deployed: event.Deployed{Name: name, SHA256: hex.EncodeToString(sum[:])}, By: by, Definition: def}
	value, err := marshalExact(versionValue{SHA256: d.SHA256, By: by, Workflow: def})
	if err != nil {
		return DeployedWorkflow{}, false, fmt.Errorf("deploying workflow %s: %w", name, err)
	}
	if len(value) > MaxWorkflowValue {
		return DeployedWorkflow{}, false, fmt.Errorf("deploying workflow %s: %w: the definition is %d bytes; the registry takes at most %d",
			name, ErrPayloadTooLarge, len(def), MaxWorkflowValue-(len(value)-len(def)))
	}
	kv, err := s.workflowKV(ctx)
	if err != nil {
		return DeployedWorkflow{}, false, err
	}
	for try := 0; ; try++ {
		latest, rev, err := s.latestWorkflow(ctx, kv, name)
		if err != nil {
			return DeployedWorkflow{}, false, err
		}
		if latest.Version > 0 && latest.SHA256 == d.SHA256 {
			d.Version = latest.Version
			return d, false, nil
		}
		if try == maxDeployTries {
			return DeployedWorkflow{}, false, fmt.Errorf("deploying workflow %s: other deploys of it kept moving its latest version (%d tries); try again", name, try)
		}
		next := latest.Version + 1
		_, err = kv.Create(ctx, versionKey(name, next), value)
		if errors.Is(err, jetstream.ErrKeyExists) {
			// Another deploy made this version and may have stopped before
			// publishing it: the latest key follows it, and the loop looks
			// again (at a version with this content, or the next free one).
			other, err := s.workflowVersion(ctx, kv, name, next)
			if err != nil {
				return DeployedWorkflow{}, false, err
			}
			if err := s.pointWorkflow(ctx, kv, name, rev, latestValue{Version: next, SHA256: other.SHA256, By: other.By}); err != nil {
				return DeployedWorkflow{}, false, err
			}
			continue
		}
		if err != nil {
			return DeployedWorkflow{}, false, fmt.Errorf("deploying workflow %s version %d: %w", name, next, err)
		}
		// The version is ours. If another deploy moved the latest key
		// first, it could only move it here (from rev, where it named
		// next-1, the one move is to next), so it names ours either way.
		if err := s.pointWorkflow(ctx, kv, name, rev, latestValue{Version: next, SHA256: d.SHA256, By: by}); err != nil {
			return DeployedWorkflow{}, false, err
		}
		d.Version = next
		return d, true, nil
	}
}

// marshalExact is json.Marshal without HTML escaping, so the definition
// is stored byte for byte ('<' in a prompt stays '<') and keeps its
// sha256.
func marshalExact(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// pointWorkflow moves name's latest key from revision rev (0: there is
// none yet) to l. A key another deploy moved first is left as it is: the
// caller reads it again.
func (s *Store) pointWorkflow(ctx context.Context, kv jetstream.KeyValue, name string, rev uint64, l latestValue) error {
	b, err := json.Marshal(l)
	if err != nil {
		return err
	}
	if rev == 0 {
		_, err = kv.Create(ctx, name, b)
	} else {
		_, err = kv.Update(ctx, name, b, rev)
	}
	if err == nil || errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return nil
	}
	return fmt.Errorf("deploying workflow %s: moving its latest version to %d: %w", name, l.Version, err)
}

// latestWorkflow reads name's latest key and its revision (zero values
// when the name was never deployed).
func (s *Store) latestWorkflow(ctx context.Context, kv jetstream.KeyValue, name string) (latestValue, uint64, error) {
	e, err := kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return latestValue{}, 0, nil
	}
	if err != nil {
		return latestValue{}, 0, fmt.Errorf("reading the latest version of workflow %s: %w", name, err)
	}
	var l latestValue
	if err := json.Unmarshal(e.Value(), &l); err != nil || l.Version == 0 {
		return latestValue{}, 0, fmt.Errorf("reading the latest version of workflow %s: a bad value in %s (%v)", name, WorkflowBucket, err)
	}
	return l, e.Revision(), nil
}

// replicaLag bounds how long a read of the registry waits for a deploy
// it does not see yet. On a cluster every replica of the bucket answers
// Direct Get, and a follower may not have applied a deploy that its
// leader acknowledged: a start right after a deploy could find the
// workflow "not deployed" (seen on R3 in TestBenchCluster).
const replicaLag = 500 * time.Millisecond

// latestAtLeast reads name's latest version, again for up to replicaLag
// while it is not deployed or below v (v 0: any version). A name or
// version that is truly not deployed is refused after that wait.
func (s *Store) latestAtLeast(ctx context.Context, kv jetstream.KeyValue, name string, v uint64) (latestValue, error) {
	rctx, cancel := context.WithTimeout(ctx, replicaLag)
	defer cancel()
	var latest latestValue
	var readErr error
	// The wait's own end is not an error: the last read stands, and the
	// caller refuses what it does not name.
	_ = retry.Do(rctx, jsRetry, func() error {
		l, _, err := s.latestWorkflow(ctx, kv, name)
		if err != nil {
			readErr = err
			return retry.Permanent(err)
		}
		latest, readErr = l, nil
		if l.Version == 0 || v > l.Version {
			return ErrWorkflowNotFound
		}
		return nil
	})
	if readErr != nil {
		return latestValue{}, readErr
	}
	return latest, nil
}

// getAfterLag reads key, again for up to replicaLag while it is not
// found. Its callers read a key that exists on the bucket's leader (a
// version the latest key names, or one a create found taken; a schedule
// its caller may have just created), but each Direct Get may be answered
// by another replica, one that has not applied it yet (the latest key
// read from one replica, the version's key from a follower behind it:
// seen on R3 in TestBenchCluster).
func getAfterLag(ctx context.Context, kv jetstream.KeyValue, key string) (jetstream.KeyValueEntry, error) {
	rctx, cancel := context.WithTimeout(ctx, replicaLag)
	defer cancel()
	var e jetstream.KeyValueEntry
	var err error
	_ = retry.Do(rctx, jsRetry, func() error {
		e, err = kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return err
		}
		return retry.Permanent(err)
	})
	return e, err
}

// workflowVersion reads one version's key, checking its definition
// against its sha256.
func (s *Store) workflowVersion(ctx context.Context, kv jetstream.KeyValue, name string, v uint64) (DeployedWorkflow, error) {
	e, err := getAfterLag(ctx, kv, versionKey(name, v))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return DeployedWorkflow{}, fmt.Errorf("workflow %s@%d: %w", name, v, ErrWorkflowNotFound)
	}
	if err != nil {
		return DeployedWorkflow{}, fmt.Errorf("reading workflow %s@%d: %w", name, v, err)
	}
	var vv versionValue
	if err := json.Unmarshal(e.Value(), &vv); err != nil {
		return DeployedWorkflow{}, fmt.Errorf("reading workflow %s@%d: a bad value in %s: %w", name, v, WorkflowBucket, err)
	}
	if sum := sha256.Sum256(vv.Workflow); hex.EncodeToString(sum[:]) != vv.SHA256 {
		return DeployedWorkflow{}, fmt.Errorf("reading workflow %s@%d: its definition does not match its sha256 %s", name, v, vv.SHA256)
	}
	d := DeployedWorkflow{Deployed: event.Deployed{Name: name, Version: v, SHA256: vv.SHA256}, By: vv.By,
		At: e.Created(), Definition: vv.Workflow}
	if len(d.Definition) <= maxCachedDefinition {
		s.versions.Add(versionKey(name, v), d)
	}
	return d, nil
}

// DeployedWorkflow returns version v of the workflow deployed as name, or
// with v 0 its latest version, definition included. A version above the
// latest (one a deploy made but had not published when it stopped) is not
// deployed.
//
// Errors: event.ErrInvalidWorkflowName, ErrWorkflowNotFound.
func (s *Store) DeployedWorkflow(ctx context.Context, name string, v uint64) (DeployedWorkflow, error) {
	if err := event.ValidateWorkflowName(name); err != nil {
		return DeployedWorkflow{}, err
	}
	kv, err := s.workflowKV(ctx)
	if err != nil {
		return DeployedWorkflow{}, err
	}
	return s.deployedWorkflow(ctx, kv, name, v)
}

func (s *Store) deployedWorkflow(ctx context.Context, kv jetstream.KeyValue, name string, v uint64) (DeployedWorkflow, error) {
	latest, err := s.latestAtLeast(ctx, kv, name, v)
	if err != nil {
		return DeployedWorkflow{}, err
	}
	switch {
	case latest.Version == 0:
		return DeployedWorkflow{}, fmt.Errorf("workflow %s: %w", name, ErrWorkflowNotFound)
	case v > latest.Version:
		return DeployedWorkflow{}, fmt.Errorf("workflow %s@%d: %w (the latest version is %d)", name, v, ErrWorkflowNotFound, latest.Version)
	case v == 0:
		v = latest.Version
	}
	if v == latest.Version {
		// The latest key names the version and its sha256: a version kept
		// with that sha256 is the one the key would read, without the read.
		if d, ok := s.versions.Get(versionKey(name, v)); ok && d.SHA256 == latest.SHA256 {
			return d, nil
		}
	}
	return s.workflowVersion(ctx, kv, name, v)
}

// Bounds of the versions a store keeps: a few hundred workflows are a
// deployment's working set, and a definition over maxCachedDefinition is
// read each time, so the cache holds at most 16 MiB of definitions however
// big the deployed ones are (MaxWorkflowValue is 1 MiB).
const (
	versionCacheSize    = 256
	maxCachedDefinition = 64 << 10
)

// newVersionCache makes a store's cache of workflow versions, by version
// key. A version key is written once and never changed, and a cached
// version is used only when the latest key names it with the same
// sha256, so a start by name reads one key instead of two.
func newVersionCache() *lru.Cache[string, DeployedWorkflow] {
	c, _ := lru.New[string, DeployedWorkflow](versionCacheSize) // fails only for a size below 1
	return c
}

// DeployedWorkflows lists the latest version of every deployed workflow,
// by name, without definitions (one pass over the latest keys).
func (s *Store) DeployedWorkflows(ctx context.Context) ([]DeployedWorkflow, error) {
	var out []DeployedWorkflow
	err := s.watchWorkflows(ctx, "*", false, func(e jetstream.KeyValueEntry) error {
		var l latestValue
		if err := json.Unmarshal(e.Value(), &l); err != nil {
			return fmt.Errorf("listing deployed workflows: a bad value of %s in %s: %w", e.Key(), WorkflowBucket, err)
		}
		out = append(out, DeployedWorkflow{Deployed: event.Deployed{Name: e.Key(), Version: l.Version, SHA256: l.SHA256}, By: l.By, At: e.Created()})
		return nil
	})
	slices.SortFunc(out, func(a, b DeployedWorkflow) int { return strings.Compare(a.Name, b.Name) })
	return out, err
}

// WorkflowVersions lists the versions of the workflow deployed as name,
// newest first: each with its number and when it was deployed only (one
// pass over the keys' metadata, no definitions read). A version above the
// latest is left out, as DeployedWorkflow refuses it.
//
// Errors: event.ErrInvalidWorkflowName, ErrWorkflowNotFound.
func (s *Store) WorkflowVersions(ctx context.Context, name string) ([]DeployedWorkflow, error) {
	if err := event.ValidateWorkflowName(name); err != nil {
		return nil, err
	}
	kv, err := s.workflowKV(ctx)
	if err != nil {
		return nil, err
	}
	latest, _, err := s.latestWorkflow(ctx, kv, name)
	if err != nil {
		return nil, err
	}
	if latest.Version == 0 {
		return nil, fmt.Errorf("workflow %s: %w", name, ErrWorkflowNotFound)
	}
	var out []DeployedWorkflow
	err = s.watchWorkflows(ctx, name+".*", true, func(e jetstream.KeyValueEntry) error {
		v, err := strconv.ParseUint(strings.TrimPrefix(e.Key(), name+"."), 10, 64)
		if err == nil && v >= 1 && v <= latest.Version {
			out = append(out, DeployedWorkflow{Deployed: event.Deployed{Name: name, Version: v}, At: e.Created()})
		}
		return nil
	})
	slices.SortFunc(out, func(a, b DeployedWorkflow) int { return int(b.Version) - int(a.Version) })
	return out, err
}

// watchWorkflows calls each for every entry of the registry whose key
// matches filter, once, and returns when it has seen them all.
func (s *Store) watchWorkflows(ctx context.Context, filter string, metaOnly bool, each func(jetstream.KeyValueEntry) error) error {
	kv, err := s.workflowKV(ctx)
	if err != nil {
		return err
	}
	opts := []jetstream.WatchOpt{jetstream.IgnoreDeletes()}
	if metaOnly {
		opts = append(opts, jetstream.MetaOnly())
	}
	w, err := kv.WatchFiltered(ctx, []string{filter}, opts...)
	if err != nil {
		return fmt.Errorf("listing %s: %w", WorkflowBucket, err)
	}
	return eachCurrent(ctx, w, WorkflowBucket, func(e jetstream.KeyValueEntry) (bool, error) { return true, each(e) })
}
