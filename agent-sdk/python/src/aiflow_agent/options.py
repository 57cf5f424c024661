"""The agent's options, their defaults, and the checks that run before anything is sent.

Every option is checked when the Agent is made, so a mistake is an ``OptionsError`` naming the
option, not a refusal from the daemon later.
"""
from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .handlers import check_handlers
from .types import Handlers

NAME = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

#: A file's path, or the PEM contents themselves.
PemSource = Union[str, "os.PathLike[str]", bytes]


class OptionsError(ValueError):
    """An option the agent cannot work with; the message names it."""


@dataclass(frozen=True)
class TlsOptions:
    """TLS to the daemons. ``ca``: the CA bundle their certificates are checked against (default:
    grpc's public roots). ``cert`` and ``key`` together: the client certificate of mutual TLS (its
    ``spiffe://<domain>/agent/<name>`` URI lets the agent register with no token). ``server_name``:
    the name the daemons' certificate must carry, when it is not the address's host. Paths are read
    again at every reconnect, so a rotated certificate is taken up without a restart."""

    ca: Optional[PemSource] = None
    cert: Optional[PemSource] = None
    #: Left out of repr(): given as bytes, it is the private key itself.
    key: Optional[PemSource] = field(default=None, repr=False)
    server_name: Optional[str] = None


@dataclass(frozen=True)
class GpuCapacity:
    index: int
    model: str
    memory_mb: int


@dataclass(frozen=True)
class DiskCapacity:
    mount: str
    size_mb: int


@dataclass(frozen=True)
class Capacity:
    """An agent's resources as a whole, for work that states requirements. Memory and disk in MiB;
    a part left None is detected at start (GPUs by nvidia-smi, disks from the work directory and
    ``mounts``)."""

    cpu_millis: Optional[int] = None
    memory_mb: Optional[int] = None
    gpus: Optional[Sequence[GpuCapacity]] = None
    disks: Optional[Sequence[DiskCapacity]] = None


@dataclass(frozen=True)
class GpuMetrics:
    index: int
    model: str
    utilization: float
    memory_used_mb: int
    memory_total_mb: int


@dataclass(frozen=True)
class DiskMetrics:
    mount: str
    free_mb: int
    total_mb: int


@dataclass(frozen=True)
class HeartbeatMetrics:
    """Figures heartbeats report in place of measuring them (simulated agents, tests); each part
    given replaces that part of the measured report. Memory and disk in MiB."""

    cpu_utilization: Optional[float] = None
    memory_used_mb: Optional[int] = None
    memory_total_mb: Optional[int] = None
    disks: Optional[Sequence[DiskMetrics]] = None
    gpus: Optional[Sequence[GpuMetrics]] = None


@dataclass(frozen=True)
class Backoff:
    """Reconnect delays: exponential from ``initial`` to ``max`` seconds, with full jitter."""

    initial: float = 0.1
    max: float = 5.0
    multiplier: float = 2.0


@dataclass(frozen=True)
class Target:
    """One daemon address, as dialled: ``host:port`` and whether over TLS."""

    address: str
    target: str
    tls: bool


@dataclass
class AgentOptions:
    """Options of ``Agent``; see the README for each. ``address`` or ``addresses`` is required."""

    name: str
    tenants: Sequence[str]
    handlers: Handlers
    address: Optional[str] = None
    addresses: Optional[Sequence[str]] = None
    #: Left out of repr() (options end up in logs and tracebacks): it is the agent's credential.
    token: Optional[str] = field(default=None, repr=False)
    tls: Optional[TlsOptions] = None
    engine_kinds: Optional[Sequence[str]] = None
    tags: Mapping[str, str] = field(default_factory=dict)
    models: Sequence[str] = ()
    slots: int = 1
    #: Most items taken beyond the free slots, each waiting (leased) for a slot; taken only as many
    #: as the slots finish during one round trip to the daemon, by measured times. 0 turns it off.
    #: Default: 3 × slots, at most 256 − slots.
    prefetch: Optional[int] = None
    mounts: Sequence[str] = ("/",)
    capacity: Union[Capacity, None, bool] = None
    heartbeat_metrics: Optional[HeartbeatMetrics] = None
    #: Seconds drain() (and SIGTERM/SIGINT) lets in-flight items finish before giving them back.
    graceful_shutdown: float = 30.0
    handle_signals: bool = False
    #: After a drain the daemon ordered: "pause" (stay registered, resume on undrain) or "exit".
    on_daemon_drain: str = "pause"
    agent_version: str = ""
    binary_path: str = ""
    agent_type: str = "remote"
    #: Seconds an RPC may take before it counts as failed (also bounds reporting while stopping).
    rpc_timeout: float = 10.0
    reconnect: Backoff = field(default_factory=Backoff)
    #: Seconds between HTTP/2 keepalive pings that find a dead connection while the stream waits.
    keepalive: float = 10.0
    logger: Optional[logging.Logger] = None

    def targets(self) -> List[Target]:
        return [parse_address(a, self.tls is not None) for a in self._addresses()]

    def _addresses(self) -> List[str]:
        if self.address is not None and self.addresses is not None:
            raise OptionsError("give address or addresses, not both")
        addrs = [self.address] if self.address is not None else list(self.addresses or [])
        if not addrs:
            raise OptionsError("address (or addresses) is required: the daemon's host:port")
        return addrs

    def resolved_engine_kinds(self) -> List[str]:
        if self.engine_kinds is not None:
            return list(self.engine_kinds)
        return [k for k in self.handlers.keys() if k != "*"]

    def resolved_prefetch(self) -> int:
        return self.prefetch if self.prefetch is not None else max(0, min(3 * self.slots, 256 - self.slots))

    def check(self) -> None:
        if not isinstance(self.name, str) or not NAME.match(self.name):
            raise OptionsError(f"name {self.name!r} is not 1-128 characters of [A-Za-z0-9._:-]")
        if isinstance(self.tenants, str) or not all(isinstance(t, str) and t for t in self.tenants):
            raise OptionsError("tenants must be a list of tenant keys (strings)")
        if not isinstance(self.slots, int) or isinstance(self.slots, bool) or not 1 <= self.slots <= 10_000:
            raise OptionsError(f"slots must be an integer from 1 to 10000, not {self.slots!r}")
        if self.prefetch is not None and (not isinstance(self.prefetch, int) or isinstance(self.prefetch, bool) or not 0 <= self.prefetch <= 10_000):
            raise OptionsError(f"prefetch must be an integer from 0 to 10000, not {self.prefetch!r}")
        if self.on_daemon_drain not in ("pause", "exit"):
            raise OptionsError(f"on_daemon_drain must be 'pause' or 'exit', not {self.on_daemon_drain!r}")
        if self.agent_type not in ("remote", "local"):
            raise OptionsError(f"agent_type must be 'remote' or 'local', not {self.agent_type!r}")
        for label, secs in (("graceful_shutdown", self.graceful_shutdown), ("rpc_timeout", self.rpc_timeout), ("keepalive", self.keepalive)):
            if not isinstance(secs, (int, float)) or secs < 0 or (label != "graceful_shutdown" and secs == 0):
                raise OptionsError(f"{label} must be a positive number of seconds, not {secs!r}")
        b = self.reconnect
        if not 0 < b.initial <= b.max or b.multiplier < 1:
            raise OptionsError("reconnect: need 0 < initial <= max and multiplier >= 1")
        for k, v in self.tags.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise OptionsError("tags must map strings to strings")
        check_handlers(self.handlers)
        if self.tls is not None:
            t = self.tls
            if (t.cert is None) != (t.key is None):
                raise OptionsError("tls.cert and tls.key go together: give both for mutual TLS, or neither")
            for label, src in (("tls.ca", t.ca), ("tls.cert", t.cert), ("tls.key", t.key)):
                if src is not None:
                    read_pem(label, src)
        self.targets()


def parse_address(address: str, tls: bool) -> Target:
    """``host:port``, ``http://host:port`` (plaintext) or ``https://host:port`` (TLS)."""
    m = re.match(r"^(?:(https?)://)?([^/]+?)/?$", address.strip())
    if not m or ":" not in m.group(2):
        raise OptionsError(f"address {address!r} is not host:port, http://host:port or https://host:port")
    scheme, hostport = m.group(1), m.group(2)
    if scheme == "http" and tls:
        raise OptionsError(f"address {address!r} is http:// (plaintext) but tls is given: use https:// or a bare host:port")
    return Target(address=address, target=hostport, tls=tls or scheme == "https")


def read_pem(label: str, src: PemSource) -> bytes:
    """The PEM bytes of a path or of the contents themselves; an OptionsError naming the option."""
    if isinstance(src, bytes):
        data = src
    else:
        try:
            with open(src, "rb") as f:
                data = f.read()
        except OSError as e:
            raise OptionsError(f"{label}: cannot read {os.fspath(src)!r}: {e.strerror}") from None
    if b"-----BEGIN " not in data:
        raise OptionsError(f"{label}: not PEM (no -----BEGIN line)")
    return data


def tls_material(t: TlsOptions) -> Tuple[Optional[bytes], Optional[bytes], Optional[bytes]]:
    """(ca, key, cert) as read now."""
    ca = read_pem("tls.ca", t.ca) if t.ca is not None else None
    key = read_pem("tls.key", t.key) if t.key is not None else None
    cert = read_pem("tls.cert", t.cert) if t.cert is not None else None
    return ca, key, cert


Tags = Dict[str, str]
