"""aiflow_agent: join an aiflowd fleet from Python, on stock grpcio.

    from aiflow_agent import Agent

    def embed(item, ctx):
        return {"vector": model.encode(item.payload["text"])}

    Agent(name="gpu-7", address="daemon:50051", token=TOKEN, tenants=["acme"], slots=4,
          handlers={"embed": embed}, handle_signals=True).run()

See the package's README for every option and for what the agent guarantees.
"""
from .agent import Agent
from .options import AgentOptions, Backoff, Capacity, DiskCapacity, DiskMetrics, GpuCapacity, GpuMetrics, HeartbeatMetrics, OptionsError, TlsOptions
from .types import AgentFailedError, HandlerContext, NonRetryableError, Outcome, Registration, Requirements, WorkAborted, WorkItem

__version__ = "0.1.0"

__all__ = [
    "Agent",
    "AgentOptions",
    "AgentFailedError",
    "Backoff",
    "Capacity",
    "DiskCapacity",
    "DiskMetrics",
    "GpuCapacity",
    "GpuMetrics",
    "HandlerContext",
    "HeartbeatMetrics",
    "NonRetryableError",
    "OptionsError",
    "Outcome",
    "Registration",
    "Requirements",
    "TlsOptions",
    "WorkAborted",
    "WorkItem",
]
