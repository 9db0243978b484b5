"""The test of palsdk.Client against a running PAL.

TestPythonClient (sdk/python/client_test.go) runs it against a PAL of its
own, with PYTHONPATH at sdk/python and:

  PAL_URL          the REST API, behind a proxy that cuts the first event
                   stream of a run whose id starts with PAL_CUT_PREFIX
                   after event 2 and the id line of event 3
  PAL_TOKEN        a token with the default scopes (all but admin)
  PAL_READ_TOKEN   a token with scope read only
  PAL_LIMITED_URL  the same PAL's API, where a token may open one event
                   stream an hour

WithoutServerTest needs none of them.
"""

import datetime
import io
import json
import os
import time
import unittest
import uuid

import palsdk
from palsdk import client as palclient

NAME = "pyclient-approval"
WORKFLOW = {
    "name": NAME,
    "nodes": [
        {"id": "start", "type": "trigger"},
        {"id": "draft", "type": "tool", "data": {"tool": "echo", "input": {"v": "{{input.v}}"}}},
        {"id": "ok", "type": "approval", "data": {"prompt": "Ship {{steps.draft.output.v}}?"}},
        {"id": "ship", "type": "tool", "data": {"tool": "echo", "input": {"shipped": "{{steps.draft.output.v}}"}}},
    ],
    "edges": [{"from": "start", "to": "draft"}, {"from": "draft", "to": "ok"}, {"from": "ok", "to": "ship"}],
}
# How long anything may take, however loaded the machine.
PATIENCE = 60


def _suite():
    return uuid.uuid4().hex[:12]


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.url = os.environ["PAL_URL"]
        cls.pal = palsdk.Client(cls.url, os.environ["PAL_TOKEN"], timeout=PATIENCE)
        cls.deployed = cls.pal.deploy(WORKFLOW)

    def wait_for(self, rid, kind):
        """Follow the run's events up to the first of kind."""
        for ev in self.pal.events(rid):
            if ev["kind"] == kind:
                return ev
        self.fail("run %s ended without %s" % (rid, kind))

    def listed(self, want, **filters):
        """The runs (run id -> status) list(**filters) finds once the
        projection has every run of want (the same form) at its status,
        or after PATIENCE seconds."""
        deadline = time.monotonic() + PATIENCE
        while True:
            runs = {r["run_id"]: r["status"] for r in self.pal.list(**filters)["runs"]}
            if all(runs.get(rid) == st for rid, st in want.items()) or time.monotonic() > deadline:
                return runs
            time.sleep(0.2)

    def test_deploy_and_read_workflows(self):
        self.assertEqual(self.deployed["name"], NAME)
        again = self.pal.deploy(WORKFLOW)
        self.assertEqual(again, self.deployed, "the same content is the same version")
        wf = self.pal.workflow(NAME)
        self.assertEqual(wf["version"], self.deployed["version"])
        self.assertEqual(wf["workflow"]["name"], NAME)
        self.assertEqual(self.pal.workflow(NAME, version=self.deployed["version"])["sha256"], self.deployed["sha256"])
        self.assertIn(NAME, [w["name"] for w in self.pal.workflows()])
        with self.assertRaises(palsdk.NotFound):
            self.pal.workflow("no-such-workflow")

    def test_run_approved_through_a_dropped_stream(self):
        suite = _suite()
        since = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=1)
        rid = os.environ["PAL_CUT_PREFIX"] + suite
        run = self.pal.start(NAME, {"v": "7"}, labels={"suite": suite}, run_id=rid)
        self.assertEqual(run, {"run_id": rid, "created": True})

        # The proxy cuts this stream after event 2: the client resumes
        # from there, and each event comes once, in order.
        seqs, kinds = [], []
        for ev in self.pal.events(rid):
            self.assertEqual(ev["run_id"], rid)
            seqs.append(ev["seq"])
            kinds.append(ev["kind"])
            if ev["kind"] == "step_waiting" and ev.get("step_id") == "ok":
                self.assertEqual(self.pal.get(rid)["status"], "waiting")
                self.assertEqual(self.pal.approve(rid, "ok", comment="ship it"), {"ok": True, "run_id": rid})
        self.assertGreater(len(seqs), 3)
        self.assertEqual(seqs, list(range(1, len(seqs) + 1)), "no event twice, none missing")
        self.assertEqual(kinds[-1], "run_succeeded")
        self.assertIn("approval_received", kinds)

        view = self.pal.wait(rid, timeout=PATIENCE)
        self.assertEqual(view["status"], "succeeded")
        self.assertEqual(view["last_seq"], seqs[-1])
        self.assertEqual(view["labels"], {"suite": suite})
        # From a seq on, and nothing after the end (204).
        self.assertEqual([ev["seq"] for ev in self.pal.events(rid, after=3)], seqs[3:])
        self.assertEqual(list(self.pal.events(rid, after=seqs[-1])), [])

        # An ended run refuses what would change it.
        with self.assertRaises(palsdk.Conflict) as cm:
            self.pal.approve(rid, "ok")
        self.assertEqual((cm.exception.status, cm.exception.code), (409, "conflict"))
        self.assertIsInstance(cm.exception, palsdk.APIError)
        for refused in (lambda: self.pal.cancel(rid, "too late"), lambda: self.pal.resume(rid),
                        lambda: self.pal.signal(rid, "go", {"x": 1}), lambda: self.pal.retry(rid)):
            with self.assertRaises(palsdk.Conflict):
                refused()

        # A fork from its last step copies the two before it.
        fork = self.pal.fork(rid, "ship")
        self.assertEqual(fork["forked_from"]["run_id"], rid)
        self.assertEqual(sorted(fork["copied"]), ["draft", "ok"])
        self.assertEqual(self.pal.wait(fork["run_id"], timeout=PATIENCE)["status"], "succeeded")

        # Listed by its label (the fork keeps it), once the projection has
        # them; page by page; by time.
        want = {rid: "succeeded", fork["run_id"]: "succeeded"}
        self.assertEqual(self.listed(want, labels={"suite": suite}), want)
        paged = [r["run_id"] for r in self.pal.runs(labels={"suite": suite}, limit=1)]
        self.assertEqual(paged, [fork["run_id"], rid], "newest first")
        self.assertEqual(self.listed(want, labels={"suite": suite}, status="succeeded", workflow=NAME,
                                     since=since), want)
        self.assertEqual(self.pal.list(labels={"suite": suite}, until=since)["runs"], [])

    def test_cancel_and_retry_a_waiting_run(self):
        suite = _suite()
        rid = self.pal.start(NAME, {"v": "8"}, labels={"suite": suite})["run_id"]
        self.wait_for(rid, "step_waiting")
        try:
            self.assertTrue(self.pal.resume(rid)["ok"])
        except palsdk.Conflict as e:
            self.assertEqual(e.code, "lease_held")
        with self.assertRaises(palsdk.Conflict, msg="no wait node for the signal"):
            self.pal.signal(rid, "go")
        with self.assertRaises(palsdk.BadRequest, msg="the run has no budget to raise"):
            self.pal.raise_budget(rid, add_steps=1)
        self.assertEqual(self.pal.cancel(rid, "not today"), {"ok": True, "run_id": rid})
        self.assertEqual(self.pal.wait(rid, timeout=PATIENCE)["status"], "cancelled")
        with self.assertRaises(palsdk.Conflict):
            self.pal.cancel(rid)

        retried = self.pal.retry(rid)
        self.assertEqual(retried["forked_from"]["run_id"], rid)
        self.assertIn("draft", retried["copied"])
        again = retried["run_id"]
        self.wait_for(again, "step_waiting")
        self.pal.approve(again, "ok", "reject", comment="no")
        self.assertEqual(self.pal.wait(again, timeout=PATIENCE)["status"], "failed")

    def test_thread(self):
        chat = {
            "name": "pyclient-chat",
            "nodes": [
                {"id": "start", "type": "trigger"},
                {"id": "ask", "type": "ai-step",
                 "data": {"provider": "openai", "model": "m", "prompt": "{{input.q}}", "thread": True}},
            ],
            "edges": [{"from": "start", "to": "ask"}],
        }
        self.pal.deploy(chat)
        thread = "py-" + _suite()
        first = self.pal.start("pyclient-chat", {"q": "hi"}, thread=thread)["run_id"]
        self.assertEqual(self.pal.wait(first, timeout=PATIENCE)["status"], "succeeded")
        second = self.pal.start("pyclient-chat", {"q": "more"}, thread=thread)["run_id"]
        self.assertEqual(self.pal.wait(second, timeout=PATIENCE)["thread"], thread)
        got = self.pal.thread(thread)
        self.assertEqual([(t["run_id"], t["role"], t["content"]) for t in got["turns"]],
                         [(first, "user", "hi"), (first, "assistant", "echo: hi"),
                          (second, "user", "more"), (second, "assistant", "echo: more")])
        self.assertEqual(got["holds"], [])
        want = {first: "succeeded", second: "succeeded"}
        self.assertEqual(self.listed(want, thread=thread), want)
        self.assertEqual(self.listed(want, thread=thread, queue="default"), want)
        self.assertEqual(self.pal.list(thread=thread, queue="gpu")["runs"], [])
        with self.assertRaises(palsdk.BadRequest) as cm:
            self.pal.list(queue="GPU")
        self.assertEqual((cm.exception.status, cm.exception.field), (400, "queue"))
        with self.assertRaises(palsdk.NotFound):
            self.pal.thread("py-never-" + _suite())
        with self.assertRaises(palsdk.BadRequest) as cm:
            self.pal.start("pyclient-chat", {"q": "x"}, thread="a.b")
        self.assertEqual((cm.exception.status, cm.exception.field), (400, "thread"))

    def test_refusals_are_typed(self):
        key = "key-" + _suite()
        run = self.pal.start(NAME, {"v": "9"}, idempotency_key=key)
        self.assertTrue(run["created"])
        rid = run["run_id"]
        self.assertEqual(self.pal.start(NAME, {"v": "9"}, idempotency_key=key), {"run_id": rid, "created": False})
        self.wait_for(rid, "step_waiting")

        with self.assertRaises(palsdk.BadRequest) as cm:
            self.pal.start(NAME, labels={"k": 1})
        self.assertEqual((cm.exception.status, cm.exception.code, cm.exception.field), (400, "bad_input", "labels.k"))
        with self.assertRaises(palsdk.BadRequest) as cm:
            self.pal.list(status="bogus")
        self.assertEqual(cm.exception.field, "status")

        with self.assertRaises(palsdk.Unauthorized) as cm:
            palsdk.Client(self.url, "not-a-token").get(rid)
        self.assertEqual((cm.exception.status, cm.exception.code), (401, "unauthorized"))

        viewer = palsdk.Client(self.url, os.environ["PAL_READ_TOKEN"])
        self.assertEqual(viewer.get(rid)["run_id"], rid, "scope read reads")
        for refused in (lambda: viewer.start(NAME), lambda: viewer.approve(rid, "ok"),
                        lambda: viewer.cancel(rid), lambda: viewer.deploy(WORKFLOW)):
            with self.assertRaises(palsdk.Forbidden) as cm:
                refused()
            self.assertEqual((cm.exception.status, cm.exception.code), (403, "forbidden"))
            self.assertIn("lacks scope", cm.exception.message)

        with self.assertRaises(palsdk.NotFound) as cm:
            self.pal.get("no-such-run")
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        with self.assertRaises(palsdk.NotFound):
            self.pal.start("no-such-workflow")
        with self.assertRaises(palsdk.NotFound):
            next(self.pal.events("no-such-run"))

        self.pal.approve(rid, "ok")
        with self.assertRaises(palsdk.Conflict):
            self.pal.approve(rid, "ok")
        self.assertEqual(self.pal.wait(rid, timeout=PATIENCE)["status"], "succeeded")

    def test_rate_limited(self):
        rid = self.pal.start(NAME, {"v": "10"})["run_id"]
        limited = palsdk.Client(os.environ["PAL_LIMITED_URL"], os.environ["PAL_TOKEN"])
        first = next(limited.events(rid))
        self.assertEqual(first["seq"], 1)
        with self.assertRaises(palsdk.RateLimited) as cm:
            next(limited.events(rid))
        e = cm.exception
        self.assertEqual((e.status, e.code), (429, "rate_limited"))
        self.assertGreater(e.retry_after, 0)
        self.assertIn("too many", e.message)
        self.pal.cancel(rid)
        self.assertEqual(self.pal.wait(rid, timeout=PATIENCE)["status"], "cancelled")


class _Response:
    """What _SSEReader reads: a response's readline."""

    def __init__(self, data):
        self._f = io.BytesIO(data)

    def readline(self, limit):
        return self._f.readline(limit)


class _Answer:
    """What Client._read reads: a response's status, length and read."""

    def __init__(self, data, length):
        self._f = io.BytesIO(data)
        self.status = 200
        self.length = length

    def read(self, n):
        return self._f.read(n)


class _Conn:
    sock = None


def _reader(data, max_bytes=1 << 20):
    return palclient._SSEReader(_Response(data), _Conn(), max_bytes, 5, None)


def _sse(seq, kind="step_started"):
    return "id: %d\nevent: %s\ndata: %s\n\n" % (seq, kind, json.dumps({"seq": seq, "kind": kind}))


class WithoutServerTest(unittest.TestCase):
    """The event stream's parsing and the bounds on reads, without a
    server."""

    def test_fields(self):
        r = _reader(b"retry: 1500\r\n\r\n: keep-alive\n\nid: 1\r\nevent: run_created\r\ndata: {\"seq\":\r\n"
                    b"data: 1}\r\n\r\nevent: delta\ndata: {}\n\n")
        self.assertEqual(r.next(), ("1", "run_created", '{"seq":\n1}'))
        self.assertEqual(r.retry_ms, 1500)
        self.assertEqual(r.next(), (None, "delta", "{}"), "an event's id is its own")
        self.assertIsNone(r.next())

    def test_an_event_cut_short_is_dropped(self):
        r = _reader((_sse(1) + _sse(2)[:-1]).encode())
        self.assertEqual(r.next()[0], "1")
        self.assertIsNone(r.next())
        r = _reader((_sse(1) + "id: 2\nevent: step_started\nda").encode())
        self.assertEqual(r.next()[0], "1")
        self.assertIsNone(r.next())

    def test_an_event_over_the_bound(self):
        r = _reader(_sse(1).encode() + b"data: " + b"x" * 100 + b"\n\n", max_bytes=80)
        self.assertEqual(r.next()[0], "1")
        with self.assertRaises(palsdk.ProtocolError):
            r.next()

    def test_an_answer_over_the_bound(self):
        c = palsdk.Client("http://127.0.0.1:1", "t", max_response_bytes=100 << 10)
        body = b"x" * (100 << 10)
        self.assertEqual(c._read(_Answer(body, None), c.max_response_bytes), body, "chunked, at the bound")
        self.assertEqual(c._read(_Answer(body, len(body)), c.max_response_bytes), body)
        with self.assertRaises(palsdk.ProtocolError):
            c._read(_Answer(body + b"x", None), c.max_response_bytes)
        with self.assertRaises(palsdk.ProtocolError):
            c._read(_Answer(b"", len(body) + 1), c.max_response_bytes)

    def test_envelopes_come_once_in_order(self):
        ev = lambda seq: (str(seq), "step_started", json.dumps({"seq": seq}))
        self.assertEqual(palclient._envelope(ev(3), 2), {"seq": 3})
        self.assertIsNone(palclient._envelope(ev(2), 2), "seen already")
        self.assertIsNone(palclient._envelope((None, "delta", "{}"), 2), "no id: not the journal's")
        with self.assertRaises(palsdk.ProtocolError):
            palclient._envelope(ev(4), 2)
        with self.assertRaises(palsdk.ProtocolError):
            palclient._envelope(("3", "x", "not json"), 2)


if __name__ == "__main__":
    unittest.main()
