// Command substeps is a process step with five durable sub-steps (the Go
// SDK, package sdk). PAL runs it from a workflow node of type "process"
// (examples/process/substeps-go.json) in a sandbox that sees the
// repository at /opt/pal: from the repository's root, build it with `go
// build -o bin/substeps ./examples/process/substeps` and run the worker
// with PAL_PROCESS_MOUNTS="$PWD=/opt/pal".
//
// Each sub-step appends a line to the file SIDE_EFFECTS (in the work
// directory when unset or empty): its name, its idempotency key and
// whether this process is a resume. Kill the worker
// while it runs and the process another worker starts sees PAL_RESUME=1:
// the sub-steps that completed are skipped by sdk.Step (their lines
// appear once), the one that was cut short runs again with the same key.
//
// HOLD_AT=<name> makes the sub-step of that name block after its side
// effect, in the first process only (every process with HOLD_ALWAYS=1),
// appending the process's pid to HOLD_FILE: a demo kills the worker there.
//
// Its input arrives on stdin; its output goes to fd 3.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/palrun/pal/sdk"
)

type result struct {
	Name string `json:"name"`
	Key  string `json:"key"`
}

func main() {
	var params struct {
		Topic string `json:"topic"`
	}
	_ = json.NewDecoder(os.Stdin).Decode(&params)
	ctx := context.Background()
	var results []result
	for i := 1; i <= 5; i++ {
		name := fmt.Sprintf("s%d", i)
		r, err := sdk.Step(ctx, name, func(context.Context) (result, error) { return effect(name) })
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		results = append(results, r)
	}
	out, _ := json.Marshal(map[string]any{"topic": params.Topic, "resumed": sdk.Resumed(), "results": results})
	fd3 := os.NewFile(3, "output")
	if _, err := fd3.Write(out); err != nil { // not run by PAL: no fd 3
		fmt.Println(string(out))
	}
}

func effect(name string) (result, error) {
	key := sdk.IdempotencyKey(name)
	path := os.Getenv("SIDE_EFFECTS")
	if path == "" {
		path = "side-effects"
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return result{}, err
	}
	resumed := 0
	if sdk.Resumed() {
		resumed = 1
	}
	_, err = fmt.Fprintf(f, "%s %s resume=%d\n", name, key, resumed)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return result{}, err
	}
	if hold := os.Getenv("HOLD_FILE"); name == os.Getenv("HOLD_AT") {
		if _, serr := os.Stat(hold); os.Getenv("HOLD_ALWAYS") == "1" || os.IsNotExist(serr) {
			h, err := os.OpenFile(hold, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return result{}, err
			}
			fmt.Fprintf(h, "%d\n", os.Getpid())
			h.Close()
			select {} // blocks until killed
		}
	}
	return result{Name: name, Key: key}, nil
}
