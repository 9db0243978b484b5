#!/usr/bin/env python3
"""A process step with five durable sub-steps (the Python SDK, palsdk).

PAL runs it from a workflow node of type "process" (substeps-python.json),
in a sandbox that sees the repository at /opt/pal: run the worker with
PAL_PROCESS_MOUNTS="$PWD=/opt/pal" from the repository's root.
Each sub-step appends a line to the file SIDE_EFFECTS (in the work
directory when unset or empty): its name, its idempotency key and whether
this process is a resume. Kill the worker
while it runs and the process another worker starts sees PAL_RESUME=1:
the sub-steps that completed are skipped by palsdk.step (their lines
appear once), the one that was cut short runs again with the same key.

HOLD_AT=<name> makes the sub-step of that name block after its side
effect, in the first process only (every process with HOLD_ALWAYS=1),
appending the process's pid to HOLD_FILE: a demo kills the worker there.

Its input arrives on stdin; its output goes to fd 3.
"""

import json
import os
import sys
import time

import palsdk

params = json.load(sys.stdin) or {}
side_effects = os.environ.get("SIDE_EFFECTS") or "side-effects"
hold_at = os.environ.get("HOLD_AT")
hold_file = os.environ.get("HOLD_FILE", "")
hold_always = os.environ.get("HOLD_ALWAYS") == "1"


def effect(name):
    def run():
        key = palsdk.idempotency_key(name)
        with open(side_effects, "a") as f:
            f.write("%s %s resume=%d\n" % (name, key, palsdk.resumed()))
        if name == hold_at and (hold_always or not os.path.exists(hold_file)):
            with open(hold_file, "a") as f:
                f.write("%d\n" % os.getpid())
            while True:
                time.sleep(3600)
        return {"name": name, "key": key}
    return run


results = [palsdk.step("s%d" % i, effect("s%d" % i)) for i in range(1, 6)]
out = json.dumps({"topic": params.get("topic"), "resumed": palsdk.resumed(), "results": results})
try:
    os.write(3, out.encode())
except OSError:  # not run by PAL: no fd 3
    print(out)
