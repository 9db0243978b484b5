"""Durable sub-steps for programs PAL runs as process steps.

PAL runs a ``process`` node's program in a sandbox on a worker. The
program reports its own sub-steps to that worker over a Unix socket
(``PAL_REPORT_SOCKET``) that only this process sees, and the worker
journals them. When the worker dies and another re-drives the step, the
program starts over with ``PAL_RESUME=1``; :func:`step` then returns the
journaled output of each sub-step that had completed without running it
again.

Standard library only. Outside PAL (no ``PAL_REPORT_SOCKET``) :func:`step`
just calls ``fn``.

:class:`Client` (module :mod:`palsdk.client`) is a client of PAL's REST
API: it starts, follows and decides runs from outside PAL.
"""

import http.client
import json
import os
import socket
import threading

from .client import (
    TERMINAL_KINDS,
    TERMINAL_STATUSES,
    APIError,
    BadRequest,
    Client,
    Conflict,
    Forbidden,
    NotFound,
    ProtocolError,
    RateLimited,
    Unauthorized,
)

__all__ = [
    "step",
    "resumed",
    "idempotency_key",
    "PalError",
    "Client",
    "APIError",
    "BadRequest",
    "Unauthorized",
    "Forbidden",
    "NotFound",
    "Conflict",
    "RateLimited",
    "ProtocolError",
    "TERMINAL_STATUSES",
    "TERMINAL_KINDS",
]

_TIMEOUT = 30


class PalError(Exception):
    """The worker's runtime endpoint refused or could not take a report."""


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over the Unix socket PAL_REPORT_SOCKET names."""

    def __init__(self, path):
        super().__init__("pal", timeout=_TIMEOUT)
        self._path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(_TIMEOUT)
        self.sock.connect(self._path)


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


def _request(method, path, body=None):
    conn = _UnixConnection(os.environ["PAL_REPORT_SOCKET"])
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read(8 << 20)  # the worker answers at most 4 MiB of outputs
        if resp.status != 200:
            raise PalError("%s %s: %d: %s" % (method, path, resp.status, raw[:4096].decode("utf-8", "replace").strip()))
        return json.loads(raw or b"null")
    except OSError as e:
        raise PalError("%s %s: %s" % (method, path, e)) from None
    finally:
        conn.close()


def _completed(name):
    global _done
    with _lock:
        if _done is None:
            ans = _request("GET", "/v1/runtime/substeps")
            _done = {s["name"]: s.get("output") for s in ans.get("substeps") or []}
        return name in _done, _done.get(name)


def _report(name, status, output=None):
    body = {"step_id": os.environ.get("PAL_STEP_ID", ""), "name": name, "status": status}
    if status == "completed":
        body["output"] = output
    ans = _request("POST", "/v1/runtime/report", body)
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
    if not os.environ.get("PAL_REPORT_SOCKET"):
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
