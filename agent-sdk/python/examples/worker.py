"""A worker to copy: runs "embed" items on a GPU box, drains cleanly on SIGTERM.

    AIFLOW_ADDRESS=daemon:50051 AIFLOW_TOKEN=... python3 worker.py

The handler is a plain function; an ``async def`` works the same way. It validates its payload (it
comes from producers), does the work, and returns a JSON-serialisable result. Raising fails the item
(retried while retries are left); ``NonRetryableError`` fails it for good.
"""
from __future__ import annotations

import logging
import os
import socket
import subprocess
from typing import Any, Dict

from aiflow_agent import Agent, HandlerContext, NonRetryableError, TlsOptions, WorkItem


def embed(item: WorkItem, ctx: HandlerContext) -> Dict[str, Any]:
    payload = item.payload
    if not isinstance(payload, dict) or not isinstance(payload.get("text"), str):
        raise NonRetryableError("payload must be {'text': str}")
    # GPU work runs on the GPUs the daemon reserved for this item, in a child process of its own.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": item.cuda_visible_devices, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    proc = subprocess.Popen(["wc", "-w"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
    out, _ = proc.communicate(payload["text"])
    ctx.check()  # stop here if the item was cancelled, its lease lost, or a drain gave it back
    ctx.log.info("embedded %d characters", len(payload["text"]))
    return {"words": int(out.strip() or 0)}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ca = os.environ.get("AIFLOW_TLS_CA")
    agent = Agent(
        name=os.environ.get("AIFLOW_AGENT_NAME", f"py-{socket.gethostname()}"),
        address=os.environ.get("AIFLOW_ADDRESS", "127.0.0.1:50051"),
        token=os.environ.get("AIFLOW_TOKEN"),
        tls=TlsOptions(ca=ca) if ca else None,
        tenants=os.environ.get("AIFLOW_TENANTS", "default").split(","),
        slots=int(os.environ.get("AIFLOW_SLOTS", "2")),
        handlers={"embed": embed},
        handle_signals=True,
    )
    agent.run()


if __name__ == "__main__":
    main()
