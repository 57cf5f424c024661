"""A Python agent for the tests (driven from agent-sdk/python/test/*.test.ts).

argv[1] is a JSON object of AgentOptions fields (tls as {ca, cert, key, server_name} paths,
heartbeat_metrics and capacity as objects). It prints one JSON line per event on stdout and takes
commands on stdin, one per line: ``release <item id>|all``, ``drain [seconds]``, ``stop``.

Items say what their handler does in their payload: ``{"block": true}`` waits for a ``release``
(or its cancellation), ``{"spin": s}`` computes for s seconds, ``{"fail": "why", "retryable": b}``
raises, ``{"async": true}`` runs as an async handler; any other payload is echoed.
"""
from __future__ import annotations

import asyncio
import json
import logging
import sys
import threading
import time
from typing import Any, Dict

from aiflow_agent import (
    Agent,
    AgentOptions,
    Backoff,
    Capacity,
    DiskCapacity,
    DiskMetrics,
    GpuCapacity,
    GpuMetrics,
    HandlerContext,
    HeartbeatMetrics,
    NonRetryableError,
    TlsOptions,
    WorkItem,
)

lock = threading.Lock()
gates: Dict[str, threading.Event] = {}
released_all = threading.Event()


def emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, **fields})
    with lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def gate(item_id: str) -> threading.Event:
    with lock:
        return gates.setdefault(item_id, threading.Event())


def handle(item: WorkItem, ctx: HandlerContext) -> Any:
    p = item.payload if isinstance(item.payload, dict) else {}
    if p.get("block"):
        g = gate(item.id)
        while not (g.is_set() or released_all.is_set()):
            if ctx.wait(0.02):
                emit("aborted", id=item.id, reason=ctx.reason)
                if p.get("ignore_abort"):
                    while not (g.is_set() or released_all.is_set()):
                        time.sleep(0.02)
                    emit("returned", id=item.id)
                    return {"by": ctx.agent, "zombie": True}
                ctx.check()
    if "spin" in p:
        until = time.monotonic() + float(p["spin"])
        n = 0
        while time.monotonic() < until:
            n += 1
    if "fail" in p:
        if p.get("retryable", True):
            raise RuntimeError(p["fail"])
        raise NonRetryableError(p["fail"])
    return {"by": ctx.agent, "echo": item.payload, "attempt": item.attempt, "gpus": item.cuda_visible_devices}


async def handle_async(item: WorkItem, ctx: HandlerContext) -> Any:
    p = item.payload if isinstance(item.payload, dict) else {}
    if p.get("block"):
        try:
            while not (gate(item.id).is_set() or released_all.is_set()):
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            emit("aborted", id=item.id, reason=ctx.reason, async_cancelled=True)
            raise
    return {"by": ctx.agent, "echo": item.payload, "async": True}


def options(cfg: Dict[str, Any]) -> AgentOptions:
    cfg = {k: v for k, v in cfg.items() if v is not None}
    kinds = cfg.pop("engine_kinds", ["py"])
    handlers: Dict[str, Any] = {k: handle for k in kinds}
    handlers["pyasync"] = handle_async
    if "tls" in cfg:
        cfg["tls"] = TlsOptions(**cfg["tls"])
    if "heartbeat_metrics" in cfg:
        h = cfg["heartbeat_metrics"]
        cfg["heartbeat_metrics"] = HeartbeatMetrics(
            cpu_utilization=h.get("cpu_utilization"),
            memory_used_mb=h.get("memory_used_mb"),
            memory_total_mb=h.get("memory_total_mb"),
            disks=[DiskMetrics(**d) for d in h["disks"]] if "disks" in h else None,
            gpus=[GpuMetrics(**g) for g in h["gpus"]] if "gpus" in h else None,
        )
    if isinstance(cfg.get("capacity"), dict):
        c = cfg["capacity"]
        cfg["capacity"] = Capacity(
            cpu_millis=c.get("cpu_millis"),
            memory_mb=c.get("memory_mb"),
            gpus=[GpuCapacity(**g) for g in c["gpus"]] if "gpus" in c else None,
            disks=[DiskCapacity(**d) for d in c["disks"]] if "disks" in c else None,
        )
    if "reconnect" in cfg:
        cfg["reconnect"] = Backoff(**cfg["reconnect"])
    # Kinds the agent takes without a handler for them (what a misconfigured worker does).
    unhandled = cfg.pop("unhandled_kinds", [])
    return AgentOptions(handlers=handlers, engine_kinds=[*kinds, "pyasync", *unhandled], **cfg)


def commands(agent: Agent) -> None:
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "release":
            if words[1] == "all":
                released_all.set()
            else:
                gate(words[1]).set()
        elif words[0] == "drain":
            agent.drain(float(words[1]) if len(words) > 1 else None, wait=False)
        elif words[0] == "stop":
            agent.stop(wait=False)


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    agent = Agent(options(json.loads(sys.argv[1])))
    agent.on("state", lambda state, previous: emit("state", state=state, previous=previous))
    agent.on("registered", lambda r: emit("registered", id=r.id, address=r.address, created=r.created, status=r.status))
    agent.on("disconnected", lambda err: emit("disconnected", error=str(err)))
    agent.on("item_started", lambda item: emit("started", id=item.id, attempt=item.attempt, payload=item.payload))
    agent.on("item_finished", lambda item, o: emit("finished", id=item.id, outcome=o.kind, detail=o.detail))
    threading.Thread(target=commands, args=(agent,), daemon=True).start()
    try:
        agent.run()
    except Exception as e:
        emit("failed", error=str(e))
        return 1
    emit("exited", state=agent.state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
