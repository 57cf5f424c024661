"""Child process of the bench: one Python agent (agent-sdk/python) running a no-op handler, the
Python twin of child-agent.ts. Arguments: address token name slots tenants kind. Prints
{"ready": true} once it takes work; on SIGTERM stops and prints {"handled": N, "latencies": []}.
Over TLS (npm run bench -- --tls) BENCH_TLS_CA is the CA to trust. With BENCH_CPU_PROF=DIR, as the
Node children write V8 profiles there, it writes DIR/<name>.pstats: cProfile of every thread's
Python code, together (what grpc's C core does on its own threads is not in it)."""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from typing import Any, Optional

PROFILE_DIR = os.environ.get("BENCH_CPU_PROF")
profiles = []
if PROFILE_DIR:
    import cProfile

    _run = threading.Thread.run

    def _profiled(self: threading.Thread) -> None:
        p = cProfile.Profile()
        profiles.append(p)
        p.enable()
        try:
            _run(self)
        finally:
            p.disable()

    threading.Thread.run = _profiled  # type: ignore[method-assign]

from aiflow_agent import Agent, HandlerContext, TlsOptions, WorkItem  # noqa: E402

address, token, name, slots, tenants, kind = sys.argv[1:7]
handled = 0
lock = threading.Lock()


def handle(item: WorkItem, ctx: HandlerContext) -> Optional[Any]:
    global handled
    with lock:
        handled += 1
    return None


logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
ca = os.environ.get("BENCH_TLS_CA")
agent = Agent(name=name, address=address, token=token or None, tls=TlsOptions(ca=ca) if ca else None, tenants=tenants.split(","), slots=int(slots), handlers={kind: handle})
signal.signal(signal.SIGTERM, lambda *_: agent.stop(wait=False))
agent.start()
print(json.dumps({"ready": True}), flush=True)
agent.wait()
if PROFILE_DIR and profiles:
    import pstats

    for p in profiles:
        p.disable()
    stats = pstats.Stats(*profiles)
    stats.dump_stats(os.path.join(PROFILE_DIR, f"{name}.pstats"))
print(json.dumps({"handled": handled, "latencies": []}), flush=True)
