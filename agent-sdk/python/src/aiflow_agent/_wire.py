"""
The one seam between this library and the generated code: the AgentService stub, typed.

The message modules (``aiflow.cluster.v1.*_pb2``) come with ``.pyi`` hints from protoc; the stub
module grpc's plugin generates has none, so the calls this library makes are declared here as
Protocols and the untyped constructor is called in this module alone (mypy's override for it is in
pyproject.toml).
"""
from __future__ import annotations

from typing import Iterator, Optional, Protocol, Sequence, Tuple, TypeVar, cast

import grpc
from aiflow.cluster.v1 import agent_pb2 as pb
from aiflow.cluster.v1 import agent_pb2_grpc
from aiflow.cluster.v1 import common_pb2, work_item_pb2

Metadata = Sequence[Tuple[str, str]]

Req = TypeVar("Req", contravariant=True)
Res = TypeVar("Res", covariant=True)


class Unary(Protocol[Req, Res]):
    def __call__(self, request: Req, timeout: Optional[float] = ..., metadata: Optional[Metadata] = ...) -> Res:
        ...


class StreamCall(Protocol):
    """A bidirectional call as grpcio returns it: the responses, and a way to end it from here."""

    def __iter__(self) -> Iterator[pb.ConnectResponse]:
        ...

    def __next__(self) -> pb.ConnectResponse:
        ...

    def cancel(self) -> bool:
        ...


class Bidi(Protocol):
    def __call__(self, requests: Iterator[pb.ConnectRequest], metadata: Optional[Metadata] = ...) -> StreamCall:
        ...


class AgentStub(Protocol):
    Register: Unary[pb.RegisterRequest, pb.RegisterResponse]
    Heartbeat: Unary[pb.HeartbeatRequest, pb.HeartbeatResponse]
    Deregister: Unary[pb.DeregisterRequest, pb.DeregisterResponse]
    ExtendLease: Unary[pb.ExtendLeaseRequest, pb.ExtendLeaseResponse]
    Connect: Bidi


def agent_stub(channel: grpc.Channel) -> AgentStub:
    return cast(AgentStub, agent_pb2_grpc.AgentServiceStub(channel))  # type: ignore[no-untyped-call]


AgentStatus = common_pb2.AgentStatus
WireItem = work_item_pb2.WorkItem
WireOutcome = work_item_pb2.ItemOutcome

__all__ = ["pb", "common_pb2", "work_item_pb2", "AgentStub", "StreamCall", "Metadata", "agent_stub", "AgentStatus", "WireItem", "WireOutcome"]
