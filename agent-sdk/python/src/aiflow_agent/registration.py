"""The registration: what the agent tells the daemon it is (its name, version, slots, tenants, engine
kinds, models and the capacity start() detected: every registration sends the same, the first and
each one after reconnecting, link.py), and what the daemon's answer tells it (its id, the heartbeat
interval and the lease TTL to keep, and its status). Also the daemon's status in words, as the agent
reads it from any message."""
from __future__ import annotations

import sys
from typing import Optional

from google.protobuf.duration_pb2 import Duration

from ._wire import AgentStatus, AgentStub, Metadata, pb
from .options import AgentOptions
from .resources import Detected, capacity_to_wire
from .types import Registration

STATUS = {AgentStatus.AGENT_STATUS_ACTIVE: "active", AgentStatus.AGENT_STATUS_DRAINING: "draining", AgentStatus.AGENT_STATUS_INACTIVE: "inactive"}


def _seconds(d: Duration, default: float) -> float:
    s: float = d.seconds + d.nanos / 1e9
    return s if s > 0 else default


def register(stub: AgentStub, address: str, o: AgentOptions, capacity: Optional[Detected], metadata: Metadata) -> Registration:
    """Registers with the daemon at ``address``, bounded by rpc_timeout; raises the call's error."""
    meta = pb.AgentMetadata(tags=dict(o.tags), slots=o.slots, tenants=list(o.tenants), engine_kinds=o.resolved_engine_kinds(), models=list(o.models))
    if capacity is not None:
        meta.capacity.CopyFrom(capacity_to_wire(capacity))
    req = pb.RegisterRequest(
        name=o.name,
        agent_version=o.agent_version,
        binary_path=o.binary_path or (sys.argv[0] if sys.argv else ""),
        agent_type=pb.AGENT_TYPE_LOCAL if o.agent_type == "local" else pb.AGENT_TYPE_REMOTE,
        metadata=meta,
    )
    res = stub.Register(req, timeout=o.rpc_timeout, metadata=metadata)
    return Registration(
        id=res.id,
        address=address,
        created=res.created,
        heartbeat_interval=_seconds(res.heartbeat_interval, 5.0),
        lease_ttl=_seconds(res.lease_ttl, 30.0),
        status=STATUS.get(res.status, "active"),
    )


__all__ = ["STATUS", "register"]
