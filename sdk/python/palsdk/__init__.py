"""Durable sub-steps for programs PAL runs as process steps.

PAL runs a ``process`` node's command as a child of a worker. The child
reports its own sub-steps to that worker (``PAL_REPORT_URL``, with the
per-step bearer token ``PAL_REPORT_TOKEN``), which journals them. When the
worker dies and another re-drives the step, the program starts over with
``PAL_RESUME=1``; :func:`step` then returns the journaled output of each
sub-step that had completed without running it again.

Standard library only. Outside PAL (no ``PAL_REPORT_URL``) :func:`step`
just calls ``fn``.
"""

import json
import os
import threading
import urllib.error
import urllib.request

__all__ = ["step", "resumed", "idempotency_key", "PalError"]

_TIMEOUT = 30


class PalError(Exception):
    """The worker's runtime endpoint refused or could not take a report."""


def resumed():
    """True when an earlier process of this step did not finish."""
    return os.environ.get("PAL_RESUME") == "1"


def idempotency_key(name):
    """The key of sub-step ``name``: the step attempt's key, '/', name.

    It is the same in every process of the step's attempt, so a sub-step
    run again after a crash passes the same key to what it calls.
    """
    return os.environ.get("PAL_IDEMPOTENCY_KEY", "") + "/" + name


_lock = threading.Lock()
_done = None  # name -> journaled output, read once per process


def _request(method, url, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Authorization", "Bearer " + os.environ.get("PAL_REPORT_TOKEN", ""))
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=_TIMEOUT) as resp:
            return json.loads(resp.read(8 << 20) or b"null")  # the worker answers at most 4 MiB of outputs
    except urllib.error.HTTPError as e:
        raise PalError("%s %s: %s: %s" % (method, url, e.code, e.read(4096).decode("utf-8", "replace").strip())) from None
    except urllib.error.URLError as e:
        raise PalError("%s %s: %s" % (method, url, e.reason)) from None


def _completed(name):
    global _done
    with _lock:
        if _done is None:
            url = os.environ["PAL_REPORT_URL"]
            if url.endswith("/report"):
                url = url[: -len("/report")]
            ans = _request("GET", url + "/substeps")
            _done = {s["name"]: s.get("output") for s in ans.get("substeps") or []}
        return name in _done, _done.get(name)


def _report(name, status, output=None):
    body = {"step_id": os.environ.get("PAL_STEP_ID", ""), "name": name, "status": status}
    if status == "completed":
        body["output"] = output
    ans = _request("POST", os.environ["PAL_REPORT_URL"], body)
    if ans.get("completed"):
        with _lock:
            if _done is not None:
                _done[name] = ans.get("output")
    return bool(ans.get("completed")) and status == "started", ans.get("output")


def step(name, fn):
    """Run sub-step ``name`` once across the processes of a step.

    If the journal holds its output, return that without calling ``fn``;
    otherwise report it started, call ``fn()``, report it completed with
    the result (JSON-serialisable) and return the result. An exception from
    ``fn`` propagates and nothing is journaled for it.
    """
    if not os.environ.get("PAL_REPORT_URL"):
        return fn()
    done, out = _completed(name)
    if done:
        return out
    done, out = _report(name, "started")
    if done:
        return out
    result = fn()
    _report(name, "completed", result)
    return result
