"""Unit tests of the library's pure parts (no daemon): run by ``python3 -m unittest`` from
agent-sdk/python with PYTHONPATH=src:gen, and by units.test.ts in the project's suite."""
from __future__ import annotations

import json
import os
import random
import tempfile
import unittest
import logging
import threading
from typing import Any, Dict, List, Tuple, cast

from aiflow.cluster.v1 import work_item_pb2
from aiflow_agent import AgentOptions, Backoff, OptionsError, TlsOptions
from aiflow_agent.backoff import delay
from aiflow_agent.handlers import describe_handlers, resolve_handler
from aiflow_agent.options import parse_address
from aiflow_agent.resources import mount_point_of, parse_gpu_capacity, parse_gpu_metrics
from aiflow_agent.reporter import Report, Reporter
from aiflow_agent.types import HandlerContext, Handlers, WorkAborted, item_from_wire
from aiflow_agent.work import Work, WorkHooks


def h(_item: Any, _ctx: Any) -> None:
    return None


def other(_item: Any, _ctx: Any) -> None:
    return None


def opts(**kw: Any) -> AgentOptions:
    base: Any = {"name": "py-1", "address": "127.0.0.1:50051", "tenants": ["t1"], "handlers": {"x": h}}
    base.update(kw)
    return AgentOptions(**base)


class HandlerLookup(unittest.TestCase):
    def test_precedence(self) -> None:
        handlers: Handlers = {"dag": {"resize": other, "*": h}, "test": h, "*": {"special": other}}
        self.assertIs(resolve_handler(handlers, "dag", "resize"), other)
        self.assertIs(resolve_handler(handlers, "dag", "crop"), h)
        self.assertIs(resolve_handler(handlers, "dag", None), h)
        self.assertIs(resolve_handler(handlers, "test", "anything"), h)
        self.assertIs(resolve_handler(handlers, "unknown", "special"), other)
        self.assertIsNone(resolve_handler(handlers, "unknown", "plain"))
        self.assertEqual(describe_handlers(handlers), "dag{resize,*}, test, *{special}")


class Addresses(unittest.TestCase):
    def test_forms(self) -> None:
        self.assertEqual(parse_address("h:1", False).target, "h:1")
        self.assertFalse(parse_address("http://h:1", False).tls)
        self.assertTrue(parse_address("https://h:1/", False).tls)
        self.assertTrue(parse_address("h:1", True).tls)

    def test_refusals_name_the_option(self) -> None:
        with self.assertRaisesRegex(OptionsError, "is http:// .* but tls is given"):
            parse_address("http://h:1", True)
        with self.assertRaisesRegex(OptionsError, "not host:port"):
            parse_address("just-a-host", False)


class Options(unittest.TestCase):
    def test_valid(self) -> None:
        o = opts(slots=4, handlers={"a": h, "*": h})
        o.check()
        self.assertEqual(o.resolved_engine_kinds(), ["a"])

    def test_refusals(self) -> None:
        cases: List[Tuple[Dict[str, Any], str]] = [
            (dict(name="bad name!"), "name 'bad name!' is not 1-128 characters"),
            (dict(slots=0), "slots must be an integer from 1 to 10000"),
            (dict(tenants="t1"), "tenants must be a list"),
            (dict(handlers={}), "handlers must map engine kinds"),
            (dict(handlers={"x": {"t": 3}}), r"handlers\['x'\] must be a function"),
            (dict(on_daemon_drain="later"), "on_daemon_drain must be 'pause' or 'exit'"),
            (dict(address=None), "address \\(or addresses\\) is required"),
            (dict(addresses=["a:1"]), "give address or addresses, not both"),
            (dict(rpc_timeout=0), "rpc_timeout must be a positive number"),
            (dict(reconnect=Backoff(initial=2, max=1)), "reconnect: need 0 < initial <= max"),
            (dict(tls=TlsOptions(cert="/x.crt")), "tls.cert and tls.key go together"),
            (dict(tls=TlsOptions(ca="/nonexistent/ca.crt")), "tls.ca: cannot read '/nonexistent/ca.crt'"),
            (dict(tls=TlsOptions(ca=b"not pem")), "tls.ca: not PEM"),
        ]
        for kw, message in cases:
            with self.subTest(kw=kw):
                with self.assertRaisesRegex(OptionsError, message):
                    opts(**kw).check()

    def test_repr_hides_the_token_and_the_private_key(self) -> None:
        # Options end up in logs and tracebacks by repr; the bearer token and a PEM key given as
        # bytes are secrets (issue 51).
        key = b"-----BEGIN PRIVATE KEY-----\nS3CRETKEY\n-----END PRIVATE KEY-----\n"
        o = opts(token="s3cret-bearer-token", tls=TlsOptions(cert="/x.crt", key=key))
        for text in (repr(o), str(o), repr(o.tls)):
            self.assertNotIn("s3cret-bearer-token", text)
            self.assertNotIn("S3CRETKEY", text)
        self.assertIn("name='py-1'", repr(o))
        self.assertEqual(o.token, "s3cret-bearer-token")

    def test_pem_from_a_file(self) -> None:
        with tempfile.NamedTemporaryFile("wb", suffix=".crt", delete=False) as f:
            f.write(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
        try:
            opts(tls=TlsOptions(ca=f.name)).check()
        finally:
            os.unlink(f.name)


class Backoffs(unittest.TestCase):
    def test_grows_to_its_cap_with_jitter_in_the_upper_half(self) -> None:
        b = Backoff(initial=0.1, max=2.0)
        rand = random.Random(7)
        for attempt, cap in [(0, 0.1), (1, 0.2), (3, 0.8), (5, 2.0), (500, 2.0)]:
            for _ in range(50):
                d = delay(attempt, b, rand)
                self.assertGreaterEqual(d, cap / 2)
                self.assertLessEqual(d, cap)


class Gpus(unittest.TestCase):
    def test_capacity_csv(self) -> None:
        csv = "1, NVIDIA A100-SXM4-40GB, 40960\n0, Tesla T4, 15360\n2, [N/A], [N/A]\n3, Odd, Name, 8192\n"
        gpus = parse_gpu_capacity(csv)
        self.assertEqual([(g.index, g.model, g.memory_mb) for g in gpus], [(0, "Tesla T4", 15360), (1, "NVIDIA A100-SXM4-40GB", 40960), (3, "Odd, Name", 8192)])

    def test_metrics_csv(self) -> None:
        gpus = parse_gpu_metrics("0, Tesla T4, 37, 1024, 15360\n1, X, [N/A], 1, 2\n")
        self.assertEqual([(g.index, g.utilization, g.memory_used_mb, g.memory_total_mb) for g in gpus], [(0, 37.0, 1024, 15360)])


class Items(unittest.TestCase):
    def test_from_the_wire(self) -> None:
        w = work_item_pb2.WorkItem(
            id="i1",
            tenant_key="t1",
            engine_kind="dag",
            task_name="resize",
            payload_json=json.dumps({"a": 1}),
            retry_count=2,
            lease_token="tok",
            gpu_indices=[3, 1],
        )
        w.worker_params.requirements.gpus = 2
        w.worker_params.selector["zone"] = "a"
        item = item_from_wire(w)
        self.assertEqual((item.attempt, item.payload, item.task_name, item.run_id), (3, {"a": 1}, "resize", None))
        self.assertEqual((item.cuda_visible_devices, item.requirements.gpus, dict(item.selector)), ("3,1", 2, {"zone": "a"}))
        self.assertNotIn("tok", repr(item))

    def test_a_payload_that_is_not_json_is_its_text(self) -> None:
        self.assertEqual(item_from_wire(work_item_pb2.WorkItem(payload_json="{oops")).payload, "{oops")


class Context(unittest.TestCase):
    def test_abort_wakes_waiters_and_check_raises(self) -> None:
        import logging

        ctx = HandlerContext("a", logging.LoggerAdapter(logging.getLogger("t"), {}))
        self.assertFalse(ctx.wait(0))
        ctx._abort("lease-lost: gone")
        self.assertTrue(ctx.wait(None))
        with self.assertRaises(WorkAborted) as caught:
            ctx.check()
        self.assertEqual(caught.exception.reason, "lease-lost: gone")


class Mounts(unittest.TestCase):
    def test_the_root_filesystem_is_its_own_mount_point(self) -> None:
        self.assertEqual(mount_point_of("/"), "/")
        self.assertTrue(os.path.ismount(mount_point_of(tempfile.gettempdir())))


class ReportsBeforeIdle(unittest.TestCase):
    """A drain waits until nothing runs, then for every report: each report must be submitted while
    its run still counts as running, or the drain can stop before it and leave it unreported."""

    def test_a_release_and_a_completion_are_submitted_while_their_runs_still_run(self) -> None:
        gate = threading.Event()

        def blocks(item: Any, ctx: HandlerContext) -> None:
            gate.wait(10)

        work = Work(opts(slots=2, handlers={"block": blocks, "quick": h}), logging.getLogger("t"), WorkHooks())
        seen: List[Tuple[str, bool]] = []
        done = threading.Event()

        class Recorder:
            def submit(self, r: Report) -> None:
                seen.append((r.kind, any(x.item.id == r.part.work_item_id for x in work._running)))
                if r.kind == "complete":
                    done.set()

        work.reporter = cast(Reporter, Recorder())
        work.accept([work_item_pb2.WorkItem(id="b1", engine_kind="block", lease_token="t1")], taking=True)
        work.release_running()
        self.assertEqual(seen, [("release", True)])
        gate.set()
        work.accept([work_item_pb2.WorkItem(id="q1", engine_kind="quick", lease_token="t2")], taking=True)
        self.assertTrue(done.wait(10))
        self.assertEqual(seen, [("release", True), ("complete", True)])
        work.close()


if __name__ == "__main__":
    unittest.main()
