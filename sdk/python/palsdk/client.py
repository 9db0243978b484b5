"""A client of PAL's REST API (api/openapi.json), standard library only.

:class:`Client` speaks to ``pal server`` or ``pal dev`` over HTTP(S) with a
bearer token: it starts, reads, waits for, approves, signals, cancels,
resumes, forks and retries runs, lists them with the filters of ``GET
/v1/runs``, deploys and reads workflows, and follows a run's journal as
server-sent events (:meth:`Client.events`), resuming after a dropped
connection with ``Last-Event-ID`` so that each event comes once, in seq
order.

An answer other than 2xx raises an :class:`APIError`, whose subclass says
the status (:class:`BadRequest` 400, :class:`Unauthorized` 401,
:class:`Forbidden` 403, :class:`NotFound` 404, :class:`Conflict` 409,
:class:`RateLimited` 429) and which carries PAL's error body: ``code``
(``"error"``), ``message`` (``"detail"``) and ``field``. An answer the
client cannot read (not JSON, or over its size bound) raises
:class:`ProtocolError`; a network failure raises the ``OSError`` it is
(``socket.timeout``, ``TimeoutError`` from Python 3.10, past the
timeout), an answer cut short ``http.client.HTTPException``. Only a
dropped event stream is opened again (:meth:`Client.events`,
:meth:`Client.wait`).

Every request has a timeout, and every read from the network a bound:
``max_response_bytes`` for an answer, ``max_event_bytes`` for one
server-sent event (its lines included).
"""

import datetime
import http.client
import json
import ssl
import time
import urllib.parse

__all__ = [
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

VERSION = "0.2.0"

# A run's status once it has ended (RunView's "status").
TERMINAL_STATUSES = frozenset(("succeeded", "failed", "cancelled"))
# The kinds of a run's last event.
TERMINAL_KINDS = frozenset(("run_succeeded", "run_failed", "run_cancelled"))

DEFAULT_TIMEOUT = 30.0
# An idle event stream gets a comment line every 15 s (api.DefaultKeepAlive),
# so a stream silent for longer than this is taken for dropped.
DEFAULT_STREAM_TIMEOUT = 60.0
DEFAULT_MAX_RESPONSE_BYTES = 64 << 20
DEFAULT_MAX_EVENT_BYTES = 16 << 20
# How many times in a row an event stream reconnects without receiving an
# event before it gives up and raises the last error.
DEFAULT_STREAM_RETRIES = 10
_MAX_BACKOFF = 30.0
_READ_PIECE = 1 << 16
_UNSET = object()


class APIError(Exception):
    """PAL answered a request with an error status.

    ``status`` is the HTTP status, ``code`` PAL's error code (``"error"``
    of the body: ``bad_input``, ``not_found``, ``conflict``, ``lease_held``,
    …; ``""`` for a body that is not PAL's), ``message`` its ``"detail"``,
    ``field`` the request field at fault (or None) and ``retry_after`` the
    seconds of a 429's ``Retry-After`` (or None).
    """

    def __init__(self, status, code, message, field=None, retry_after=None):
        super().__init__(status, code, message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.retry_after = retry_after

    def __str__(self):
        s = "%d %s: %s" % (self.status, self.code or "error", self.message)
        if self.field:
            s += " (field %s)" % self.field
        return s


class BadRequest(APIError):
    """400: the request was refused before anything was written."""


class Unauthorized(APIError):
    """401: no token, or one PAL does not know."""


class Forbidden(APIError):
    """403: the token lacks the route's scope, or speaks for another."""


class NotFound(APIError):
    """404: no such run, workflow or version."""


class Conflict(APIError):
    """409: the run's state refuses the command (ended, not waiting, a
    lease held: ``code`` says which)."""


class RateLimited(APIError):
    """429: the token is over one of its limits; nothing was done.
    ``retry_after`` is how many seconds to wait (None if not said)."""


class ProtocolError(Exception):
    """An answer the client cannot read: not JSON, or over a size bound."""


_BY_STATUS = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    429: RateLimited,
}


def _error_of(status, headers, body):
    """The APIError of an answer with status and body (bytes)."""
    code, message, field = "", "", None
    try:
        doc = json.loads(body.decode("utf-8"))
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        code = doc["error"]
        message = str(doc.get("detail") or "")
        if isinstance(doc.get("field"), str):
            field = doc["field"]
    else:
        message = body[:4096].decode("utf-8", "replace").strip() or http.client.responses.get(status, "")
    retry_after = None
    if status == 429:
        try:
            retry_after = int(headers.get("Retry-After", ""))
        except ValueError:
            pass
    return _BY_STATUS.get(status, APIError)(status, code, message, field, retry_after)


def _seg(s):
    """s as one path segment."""
    return urllib.parse.quote(str(s), safe="")


def _rfc3339(t):
    """t (a datetime, naive taken as UTC, or a string) as RFC 3339."""
    if isinstance(t, datetime.datetime):
        if t.tzinfo is None:
            t = t.replace(tzinfo=datetime.timezone.utc)
        return t.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return str(t)


def _put(body, **fields):
    """body with each field that is not None."""
    for k, v in fields.items():
        if v is not None:
            body[k] = v
    return body


class Client:
    """A client of PAL's REST API at ``url`` (e.g. ``http://127.0.0.1:8080``)
    with bearer ``token``.

    ``timeout`` bounds each request's connect and each read (seconds);
    ``stream_timeout`` how long an event stream may be silent before it is
    taken for dropped (PAL sends a comment every 15 s). Each request opens
    its own connection, so one Client may serve several threads.
    """

    def __init__(self, url, token, timeout=DEFAULT_TIMEOUT, *, stream_timeout=DEFAULT_STREAM_TIMEOUT,
                 max_response_bytes=DEFAULT_MAX_RESPONSE_BYTES, max_event_bytes=DEFAULT_MAX_EVENT_BYTES,
                 ssl_context=None):
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("url %r: want http://HOST:PORT or https://HOST:PORT" % (url,))
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port
        self._prefix = u.path.rstrip("/")
        self._token = token
        self.timeout = timeout
        self.stream_timeout = stream_timeout
        self.max_response_bytes = max_response_bytes
        self.max_event_bytes = max_event_bytes
        self._ssl = ssl_context if ssl_context is not None else (ssl.create_default_context() if self._https else None)

    # The transport.

    def _open(self, method, path, query=None, body=_UNSET, headers=None, timeout=None):
        """Send a request; return its connection and response (the caller
        closes the connection)."""
        timeout = self.timeout if timeout is None else timeout
        if self._https:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl)
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        target = self._prefix + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        h = {"Authorization": "Bearer " + self._token, "User-Agent": "palsdk/" + VERSION,
             "Accept": "application/json"}
        data = None
        if body is not _UNSET:
            data = json.dumps(body).encode("utf-8")
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        try:
            conn.request(method, target, body=data, headers=h)
            return conn, conn.getresponse()
        except BaseException:
            conn.close()
            raise

    def _read(self, resp, limit):
        """resp's body, refused past limit bytes. It is read in pieces:
        before Python 3.10 or so, read(n) allocates n bytes up front."""
        too_big = ProtocolError("%d: the answer is over %d bytes" % (resp.status, limit))
        if resp.length is not None and resp.length > limit:
            raise too_big
        parts, size = [], 0
        while True:
            b = resp.read(min(_READ_PIECE, limit + 1 - size))
            if not b:
                return b"".join(parts)
            parts.append(b)
            size += len(b)
            if size > limit:
                raise too_big

    def _error(self, resp):
        """The APIError of an error answer (its first 64 KiB)."""
        return _error_of(resp.status, resp.headers, resp.read(64 << 10))

    def _call(self, method, path, query=None, body=_UNSET):
        """The JSON of a request's 2xx answer; raises APIError otherwise."""
        conn, resp = self._open(method, path, query, body)
        try:
            if resp.status >= 300:
                raise self._error(resp)
            data = self._read(resp, self.max_response_bytes)
        finally:
            conn.close()
        try:
            return json.loads(data.decode("utf-8"))
        except ValueError as e:
            raise ProtocolError("%s %s: %d: the answer is not JSON: %s" % (method, path, resp.status, e)) from None

    # Runs.

    def start(self, workflow=None, input=None, *, labels=None, run_id=None, idempotency_key=None,
              budget=None, llm=None, thread=None):
        """Start a run: POST /v1/runs.

        ``workflow`` is a deployed workflow's name (``"triage"`` for its
        latest version, ``"triage@3"``) or a definition (a dict, deployed
        first: the token needs scope deploy); ``llm`` a plain-LLM spec
        instead. ``input`` is any JSON value, ``labels`` a dict of strings,
        ``budget`` narrows the workflow's, ``thread`` names the thread the
        run's thread steps continue (created on first use). A None argument
        is left out.
        Returns ``{"run_id", "created"}`` (created is False for a start
        whose ``idempotency_key`` an earlier one had).
        """
        body = _put({}, workflow=workflow, llm=llm, input=input, labels=labels, run_id=run_id,
                    idempotency_key=idempotency_key, budget=budget, thread=thread)
        return self._call("POST", "/v1/runs", body=body)

    def get(self, run_id):
        """The run, folded from its journal (RunView): GET /v1/runs/{id}."""
        return self._call("GET", "/v1/runs/" + _seg(run_id))

    def thread(self, thread_id):
        """A thread's conversation: GET /v1/threads/{id}. Returns
        ``{"thread", "seq", "bytes", "turns": [{"seq", "run_id", "step_id",
        "role", "content"}], "holds": [...]}``."""
        return self._call("GET", "/v1/threads/" + _seg(thread_id))

    def wait(self, run_id, timeout=None):
        """Wait until the run has ended and return its RunView.

        It follows the run's event stream to its terminal event (no
        polling). Past ``timeout`` seconds (None: no limit) it raises
        TimeoutError.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            view = self.get(run_id)
            if view.get("status") in TERMINAL_STATUSES:
                return view
            # The stream ends after the terminal event, or at once (204)
            # when the run has ended since.
            for _ in self._events(run_id, view.get("last_seq") or 0, DEFAULT_STREAM_RETRIES, deadline):
                pass

    def events(self, run_id, after=0, *, retries=DEFAULT_STREAM_RETRIES):
        """Yield the run's journal events after seq ``after``, each once, in
        seq order, live until the run's terminal event: GET
        /v1/runs/{id}/events.

        Each is the event's envelope as a dict (``seq``, ``kind``,
        ``run_id``, ``ts``, ``step_id``, ``data``, …; a big value as its
        ``_blob`` reference). The generator ends after the terminal event,
        or at once when the run had ended before ``after`` (204).

        A stream that drops (a network error, an answer cut short, a
        silence over ``stream_timeout``, a 503, an end before the run's)
        is opened again with ``Last-Event-ID``, the seq of the last event
        yielded, so nothing comes twice and nothing is missed: after the
        wait the server asks for (``retry:``, 1 s), doubled at each
        failure in a row, at most 30 s. After ``retries`` failures in a
        row with no event between them, the last error is raised. The
        first connection is not retried, nor an error answer but a
        reconnect's 503: they raise at once (the first at the first
        ``next``), e.g. NotFound for an unknown run, RateLimited for a
        token over its stream limits.
        """
        return self._events(run_id, after, retries, None)

    def _events(self, run_id, after, retries, deadline):
        last = int(after)
        path = "/v1/runs/%s/events" % _seg(run_id)
        failures = 0
        wait_s = 1.0
        opened = False  # a first connection that fails raises at once
        while True:
            got = 0
            err = None
            conn = None
            try:
                headers = {"Accept": "text/event-stream"}
                if last > 0:
                    headers["Last-Event-ID"] = str(last)
                conn, resp = self._open("GET", path, headers=headers, timeout=_until(self.stream_timeout, deadline))
                if resp.status == 204:
                    return
                if resp.status != 200:
                    e = self._error(resp)
                    if resp.status != 503:
                        raise e
                    err = e
                else:
                    opened = True
                    reader = _SSEReader(resp, conn, self.max_event_bytes, self.stream_timeout, deadline)
                    while True:
                        ev = reader.next()
                        if reader.retry_ms is not None:
                            wait_s = reader.retry_ms / 1000.0
                        if ev is None:
                            break
                        env = _envelope(ev, last)
                        if env is None:
                            continue
                        last = env["seq"]
                        got += 1
                        failures = 0
                        yield env
                        if env.get("kind") in TERMINAL_KINDS:
                            return
                    if got == 0:
                        # Ended before the run's end with nothing in it
                        # (a server stopping ends its streams so): a
                        # failure, so that reconnecting backs off.
                        err = ConnectionError("run %s: the event stream ended before the run did" % run_id)
            except (OSError, http.client.HTTPException) as e:
                if not opened:
                    raise
                err = e
            finally:
                if conn is not None:
                    conn.close()
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError("run %s: no terminal event within the timeout" % run_id)
            if err is not None:
                if not opened:
                    raise err
                failures += 1
                if failures > retries:
                    raise err
            _sleep(min(wait_s * (2 ** max(failures - 1, 0)), _MAX_BACKOFF), deadline)

    def approve(self, run_id, step_id, decision="approve", *, comment=None, approver=None):
        """Decide an approval step (``decision`` ``"approve"`` or
        ``"reject"``): POST /v1/runs/{id}/approve. The approver is the
        token's name; another needs scope admin. Returns ``{"ok", "run_id"}``;
        Conflict for a step not waiting (already decided, or not an
        approval)."""
        body = _put({"step_id": step_id, "decision": decision}, comment=comment, approver=approver)
        return self._call("POST", "/v1/runs/%s/approve" % _seg(run_id), body=body)

    def signal(self, run_id, name, payload=None):
        """Send signal ``name`` with ``payload`` (any JSON value) to the
        run's wait node: POST /v1/runs/{id}/signals/{name}. Returns ``{"ok",
        "run_id"}``; Conflict when its workflow has no wait node for it."""
        return self._call("POST", "/v1/runs/%s/signals/%s" % (_seg(run_id), _seg(name)), body=payload)

    def cancel(self, run_id, reason=None, *, by=None):
        """Cancel the run and its children: POST /v1/runs/{id}/cancel.
        Returns ``{"ok", "run_id"}``; Conflict if it has ended."""
        return self._call("POST", "/v1/runs/%s/cancel" % _seg(run_id), body=_put({}, reason=reason, by=by))

    def raise_budget(self, run_id, *, add_usd=None, add_tokens=None, add_steps=None, add_ms=None, by=None):
        """Raise the run's budget: POST /v1/runs/{id}/budget. Returns
        ``{"ok", "run_id"}``; BadRequest for an add to a limit the run does
        not have, Conflict if it has ended."""
        body = _put({}, add_usd=add_usd, add_tokens=add_tokens, add_steps=add_steps, add_ms=add_ms, by=by)
        return self._call("POST", "/v1/runs/%s/budget" % _seg(run_id), body=body)

    def resume(self, run_id, force=False):
        """Have a worker drive the run now: POST /v1/runs/{id}/resume
        (``force`` breaks a live lease: scope admin). Returns ``{"ok",
        "run_id", "broke"?, "taken_by"?}``; Conflict with code
        ``lease_held`` when a worker holds it, code ``conflict`` if it has
        ended."""
        body = {"force": True} if force else {}
        return self._call("POST", "/v1/runs/%s/resume" % _seg(run_id), body=body)

    def fork(self, run_id, from_step, *, workflow=None, input=None, new_run_id=None):
        """A new run from step ``from_step`` of this one, copying the steps
        completed before it: POST /v1/runs/{id}/fork. ``workflow`` (a
        definition, scope deploy) and ``input`` change what runs. Returns
        ``{"run_id", "forked_from", "copied", "rerun"}``."""
        body = _put({"from": from_step}, workflow=workflow, input=input, new_run_id=new_run_id)
        return self._call("POST", "/v1/runs/%s/fork" % _seg(run_id), body=body)

    def retry(self, run_id, *, new_run_id=None):
        """A fork of a failed or cancelled run from its failed step: POST
        /v1/runs/{id}/retry. Returns what :meth:`fork` does; Conflict for a
        run that succeeded or has not ended."""
        return self._call("POST", "/v1/runs/%s/retry" % _seg(run_id), body=_put({}, new_run_id=new_run_id))

    def list(self, *, status=None, workflow=None, labels=None, since=None, until=None, error_code=None,
             q=None, limit=None, before=None, thread=None, queue=None, schedule=None):
        """One page of runs, newest first: GET /v1/runs (PAL's Postgres
        projection). Every filter given must match: ``status``,
        ``workflow`` (a name), ``labels`` (a dict: runs carrying each
        KEY=VALUE), ``thread`` (runs started on it), ``queue`` (a work
        queue), ``schedule`` (runs it started), ``since`` ≤ created < ``until`` (datetimes, naive taken
        as UTC, or RFC 3339 strings), ``error_code``, ``q`` (text the error
        contains, ignoring case); ``limit`` 1–1000 (default 50); ``before``
        the previous page's ``"next"``. Returns ``{"runs": [...],
        "next"?}``."""
        query = []
        for k, v in (("status", status), ("workflow", workflow), ("queue", queue), ("schedule", schedule),
                     ("thread", thread), ("error_code", error_code), ("q", q)):
            if v is not None:
                query.append((k, v))
        for k, v in sorted((labels or {}).items()):
            query.append(("label", "%s=%s" % (k, v)))
        if since is not None:
            query.append(("since", _rfc3339(since)))
        if until is not None:
            query.append(("until", _rfc3339(until)))
        if limit is not None:
            query.append(("limit", str(limit)))
        if before is not None:
            query.append(("before", before))
        return self._call("GET", "/v1/runs", query=query)

    def runs(self, **filters):
        """Yield every run :meth:`list` finds with ``filters`` (not
        ``before``), page after page."""
        before = None
        while True:
            page = self.list(before=before, **filters)
            for r in page.get("runs") or []:
                yield r
            before = page.get("next")
            if not before:
                return

    # Workflows.

    def deploy(self, workflow, name=None):
        """Deploy a workflow definition (a dict) under ``name`` (default its
        own ``"name"``): PUT /v1/workflows/{name}. Returns ``{"name",
        "version", "sha256"}``: a new version, or the latest when its
        content is the same."""
        name = workflow.get("name") if name is None else name
        return self._call("PUT", "/v1/workflows/" + _seg(name), body=workflow)

    def workflow(self, name, version=None):
        """A deployed workflow, its latest version or ``version``, with its
        definition and versions: GET /v1/workflows/{name}."""
        query = None if version is None else [("version", str(version))]
        return self._call("GET", "/v1/workflows/" + _seg(name), query=query)

    def workflows(self):
        """Every deployed workflow at its latest version, by name: GET
        /v1/workflows (the list of its ``"workflows"``)."""
        return self._call("GET", "/v1/workflows").get("workflows") or []


def _until(timeout, deadline):
    """timeout, cut to what is left before deadline (monotonic, or None)."""
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return min(timeout, left)


def _sleep(seconds, deadline):
    if deadline is not None:
        seconds = min(seconds, max(deadline - time.monotonic(), 0))
    time.sleep(seconds)


def _envelope(ev, last):
    """The envelope of server-sent event ev (id, kind, data) if it is the
    journal's next after seq last; None for one to skip (no id: not a
    journal event; a seq already yielded)."""
    ident, _, data = ev
    if ident is None:
        return None
    try:
        env = json.loads(data)
        seq = int(env["seq"])
    except (ValueError, KeyError, TypeError) as e:
        raise ProtocolError("event %s: not a PAL event envelope: %s" % (ident, e)) from None
    if seq <= last:
        return None
    if seq != last + 1:
        raise ProtocolError("event stream skipped from seq %d to %d" % (last, seq))
    env["seq"] = seq
    return env


class _SSEReader:
    """Reads server-sent events from a response, one at a time, each
    bounded to max_bytes and each read to timeout (and the deadline)."""

    def __init__(self, resp, conn, max_bytes, timeout, deadline):
        self._resp = resp
        self._conn = conn
        self._max = max_bytes
        self._timeout = timeout
        self._deadline = deadline
        self.retry_ms = None

    def _line(self, room):
        if self._conn.sock is not None:
            self._conn.sock.settimeout(_until(self._timeout, self._deadline))
        line = self._resp.readline(room + 1)
        if len(line) > room:
            raise ProtocolError("a server-sent event over %d bytes" % self._max)
        return line

    def next(self):
        """The next event as (id or None, kind, data), or None when the
        stream ended (a partial event at the end is dropped)."""
        ident, kind, data, size = None, "message", [], 0
        while True:
            line = self._line(self._max - size)
            if not line:
                return None
            size += len(line)
            if not line.endswith(b"\n"):
                # Only at the end of the stream: the event is cut short.
                return None
            line = line.rstrip(b"\n").rstrip(b"\r").decode("utf-8", "replace")
            if line == "":
                if data:
                    return ident, kind, "\n".join(data)
                ident, kind, data, size = None, "message", [], 0
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if field == "data":
                data.append(value)
            elif field == "event":
                kind = value
            elif field == "id":
                if "\0" not in value:
                    ident = value
            elif field == "retry" and value.isdigit():
                self.retry_ms = int(value)
