"""An example worker: copy it and put your work in the handlers.

    PYTHONPATH=agent-sdk/python/src:agent-sdk/python/gen python3 agent-sdk/python/examples/worker.py \\
        --address 127.0.0.1:7400 --token "$AIFLOW_AGENT_TOKEN" --name py-worker-1 --tenants acme --slots 4

Flags and their environment variables: USAGE below (``--help`` prints it). The same flags as the
TypeScript example (agent-sdk/examples/worker.ts), and the same handlers, so either can serve a queue.

SIGTERM or SIGINT drains: nothing new is taken, running items finish within the grace time, then
the agent deregisters and the process exits 0. A second signal stops at once. Exit code 1 means the
daemon refused the agent (a wrong token, say), 2 a bad flag.
"""
from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from typing import Any, Dict, List, Optional, Sequence

from aiflow_agent import Agent, AgentFailedError, HandlerContext, NonRetryableError, OptionsError, TlsOptions, WorkItem

VERSION = "example-1.0.0"

USAGE = """example worker (Python) — runs aiflowd work items with the aiflow_agent library

Every flag has an environment variable; flags win:
  --address ADDR       AIFLOW_ADDRESS        daemon host:port (or https://host:port); repeat the flag or separate by commas to fail over
  --tls-ca FILE        AIFLOW_TLS_CA         PEM CA the daemon's certificate chains to: speak TLS
  --tls-cert FILE      AIFLOW_TLS_CERT       PEM client certificate, for mutual TLS (a spiffe://…/agent/NAME URI can stand in for --token)
  --tls-key FILE       AIFLOW_TLS_KEY        its PEM key
  --token TOKEN        AIFLOW_AGENT_TOKEN    bearer token with the agent role
  --name NAME          AIFLOW_AGENT_NAME     the agent's stable name (default: this host's name)
  --tenants A,B        AIFLOW_TENANTS        tenant keys to take work from (default: default)
  --engine-kind KIND   AIFLOW_ENGINE_KIND    engine kind these handlers run (default: test)
  --slots N            AIFLOW_SLOTS          items run at once (default: 4)
  --grace MS           AIFLOW_GRACE_MS       drain time on SIGTERM/SIGINT before in-flight work is given back (default: 30000)
  --log-level LEVEL    AIFLOW_LOG_LEVEL      debug, info, warning, error (default: info)
  --help               this text
  --version            the version

Exit codes: 0 drained and stopped, 1 the daemon refused the agent, 2 a bad flag.
"""


def shout(item: WorkItem, ctx: HandlerContext) -> Dict[str, Any]:
    """``{"text": "..."}`` → the text, upper-cased."""
    text = item.payload.get("text") if isinstance(item.payload, dict) else None
    if not isinstance(text, str):
        raise NonRetryableError("payload.text must be a string")
    return {"text": text.upper()}


def wait(item: WorkItem, ctx: HandlerContext) -> Dict[str, Any]:
    """``{"ms": 500}`` → waits that long; gives up as soon as the context says so (lease lost,
    cancelled, drain deadline). GPU work would run here in a child process, with
    ``CUDA_VISIBLE_DEVICES=item.cuda_visible_devices`` in its environment."""
    ms = item.payload.get("ms", 1000) if isinstance(item.payload, dict) else 1000
    if not isinstance(ms, (int, float)) or ms < 0:
        raise NonRetryableError("payload.ms must be a non-negative number")
    ctx.log.debug("waiting %sms", ms)
    if ctx.wait(ms / 1000):
        ctx.check()
    return {"waitedMs": ms}


def echo(item: WorkItem, ctx: HandlerContext) -> Dict[str, Any]:
    """Anything else: echoes the payload back."""
    return {"echoed": item.payload, "by": ctx.agent, "attempt": item.attempt}


def config(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="worker.py", add_help=False, usage=argparse.SUPPRESS)
    for flag in ("--tls-ca", "--tls-cert", "--tls-key", "--token", "--name", "--tenants", "--engine-kind", "--slots", "--grace", "--log-level"):
        p.add_argument(flag)
    p.add_argument("--address", action="append")
    p.add_argument("--help", "-h", action="store_true")
    p.add_argument("--version", action="store_true")
    a = p.parse_args(argv)
    env = os.environ

    def number(flag: str, raw: Optional[str], default: int) -> int:
        if raw is None:
            return default
        if not raw.isdigit():
            raise OptionsError(f"--{flag} must be a whole number, got {raw!r}")
        return int(raw)

    def listed(s: str) -> List[str]:
        return [x.strip() for x in s.split(",") if x.strip()]

    a.addresses = listed(",".join(a.address or []) or env.get("AIFLOW_ADDRESS", "127.0.0.1:7400"))
    a.token = a.token or env.get("AIFLOW_AGENT_TOKEN")
    ca, cert, key = a.tls_ca or env.get("AIFLOW_TLS_CA"), a.tls_cert or env.get("AIFLOW_TLS_CERT"), a.tls_key or env.get("AIFLOW_TLS_KEY")
    a.tls = TlsOptions(ca=ca, cert=cert, key=key) if ca or cert or key else None
    a.name = a.name or env.get("AIFLOW_AGENT_NAME") or socket.gethostname()
    a.tenants = listed(a.tenants or env.get("AIFLOW_TENANTS", "default"))
    a.engine_kind = a.engine_kind or env.get("AIFLOW_ENGINE_KIND", "test")
    a.slots = number("slots", a.slots or env.get("AIFLOW_SLOTS"), 4)
    a.grace = number("grace", a.grace or env.get("AIFLOW_GRACE_MS"), 30_000)
    a.log_level = (a.log_level or env.get("AIFLOW_LOG_LEVEL", "info")).upper()
    return a


def main(argv: Sequence[str]) -> int:
    try:
        c = config(argv)
        if c.help or c.version:
            sys.stdout.write(USAGE if c.help else f"{VERSION}\n")
            return 0
        logging.basicConfig(level=c.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        agent = Agent(
            name=c.name,
            addresses=c.addresses,
            token=c.token,
            tls=c.tls,
            tenants=c.tenants,
            slots=c.slots,
            handlers={c.engine_kind: {"shout": shout, "wait": wait, "*": echo}},
            graceful_shutdown=c.grace / 1000,
            handle_signals=True,
            agent_version=VERSION,
        )
    except (OptionsError, ValueError) as e:
        sys.stderr.write(f"worker: {e}\n")
        return 2
    try:
        # Returns once the agent has drained and deregistered (after SIGTERM/SIGINT).
        agent.run()
        return 0
    except AgentFailedError:
        # The agent logged why; the daemon refused it for good.
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
