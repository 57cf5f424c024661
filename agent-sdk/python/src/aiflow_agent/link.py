"""The agent's connection to the daemons: one grpc channel per address, failover between them, and
recovery.

Any part whose call failed hands the failure to ``recover()``. The first caller runs the one shared
recovery (each address in turn, register again, back off with jitter between rounds); the others
wait for it. A caller that saw an older generation than the current one returns at once: somebody
already recovered after its failure. Registering is part of every recovery because it is idempotent
and the daemon on the other side may be new, restarted, or may have marked this agent inactive.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, List, Optional, Tuple

import grpc

from . import backoff
from ._wire import AgentStub, Metadata, agent_stub
from .options import AgentOptions, OptionsError, Target, tls_material
from .types import AgentFailedError

#: Codes after which the same call can succeed later, or elsewhere.
TRANSIENT = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
    }
)


def is_transient(err: BaseException) -> bool:
    return not isinstance(err, grpc.RpcError) or err.code() in TRANSIENT


def error_text(err: BaseException) -> str:
    if isinstance(err, grpc.RpcError):
        return f"{err.code().name}: {err.details() or ''}"
    return str(err) or type(err).__name__


def tls_words(err: BaseException) -> Optional[str]:
    """A failed TLS handshake in terms of the agent's ``tls`` options; None for any other failure."""
    text = error_text(err)
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        return (
            "the TLS handshake failed: the daemon's certificate is not trusted: "
            "give the CA that signed it as tls.ca (and tls.server_name when it names another host)"
        )
    if "WRONG_VERSION_NUMBER" in text or "wrong version number" in text:
        return "the TLS handshake failed: the daemon does not speak TLS there: is it serving plaintext (an http:// address)?"
    if "Ssl handshake failed" in text or "SSL_ERROR" in text or "handshake" in text.lower():
        return "the TLS handshake failed (does the daemon want a client certificate? give tls.cert and tls.key, signed by the CA of its --tls-client-ca)"
    return None


class _Dial:
    """One address: its channel and stub, made again (with the TLS files as they are then) after a
    failed registration."""

    def __init__(self, target: Target, opts: AgentOptions) -> None:
        self.target = target
        self._opts = opts
        self._channel: Optional[grpc.Channel] = None
        self.stub: AgentStub = self.reopen()

    def reopen(self) -> AgentStub:
        if self._channel is not None:
            self._channel.close()
        o = self._opts
        ka = int(o.keepalive * 1000)
        options: List[Tuple[str, object]] = [
            ("grpc.keepalive_time_ms", ka),
            ("grpc.keepalive_timeout_ms", max(1000, ka // 2)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # The agent does its own reconnect backoff; grpc's own would add to it.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", int(o.reconnect.max * 1000)),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
        ]
        if self.target.tls:
            if o.tls is not None:
                try:
                    ca, key, cert = tls_material(o.tls)
                except OptionsError as e:
                    raise AgentFailedError(str(e)) from None
                if o.tls.server_name:
                    options.append(("grpc.ssl_target_name_override", o.tls.server_name))
                creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
            else:
                creds = grpc.ssl_channel_credentials()
            self._channel = grpc.secure_channel(self.target.target, creds, options)
        else:
            self._channel = grpc.insecure_channel(self.target.target, options)
        self.stub = agent_stub(self._channel)
        return self.stub

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()


class Link:
    def __init__(
        self,
        opts: AgentOptions,
        log: logging.Logger,
        register: Callable[[AgentStub, str], None],
        on_disconnected: Callable[[BaseException], None],
        on_fatal: Callable[[AgentFailedError], None],
    ) -> None:
        self._opts = opts
        self._log = log
        self._register = register
        self._on_disconnected = on_disconnected
        self._on_fatal = on_fatal
        self._dials = [_Dial(t, opts) for t in opts.targets()]
        self.metadata: Metadata = (("authorization", f"Bearer {opts.token}"),) if opts.token else ()
        self._cond = threading.Condition()
        self._current = 0
        self._generation = 0
        self._recovering = False
        self._fatal: Optional[AgentFailedError] = None
        self.closed = threading.Event()

    @property
    def stub(self) -> AgentStub:
        """The stub of the daemon the agent is registered with."""
        return self._dials[self._current].stub

    @property
    def address(self) -> str:
        return self._dials[self._current].target.address

    @property
    def generation(self) -> int:
        """Bumped by every successful registration; 0 until the first."""
        return self._generation

    def stub_at(self, offset: int) -> AgentStub:
        """The stub ``offset`` places after the current one, for calls that go round the daemons."""
        return self._dials[(self._current + offset) % len(self._dials)].stub

    def connect(self) -> None:
        """The first registration, retried until it works, the agent fails, or the link closes."""
        self.recover(0, None)

    def recover(self, seen: int, cause: Optional[BaseException], stop: Optional[threading.Event] = None) -> None:
        """Re-establishes the link after a call failed with ``cause`` at generation ``seen``.

        Returns once registered again, at once when the link closed or another recovery got there
        first, or when ``stop`` is set; raises AgentFailedError when registration was refused for good.
        """
        with self._cond:
            while True:
                if self._fatal is not None:
                    raise self._fatal
                if self.closed.is_set() or self._generation != seen or (stop is not None and stop.is_set()):
                    return
                if not self._recovering:
                    break
                self._cond.wait(0.25)
            self._recovering = True
        try:
            self._reconnect(cause)
        finally:
            with self._cond:
                self._recovering = False
                self._cond.notify_all()

    def deregister(self, name: str) -> None:
        """Deregisters within rpc_timeout, going round the daemons; never raises (a daemon that is
        not told marks the agent inactive once its heartbeats stop)."""
        from ._wire import pb

        last: BaseException = TimeoutError("no daemon answered")
        for attempt in range(len(self._dials)):
            try:
                self.stub_at(attempt).Deregister(pb.DeregisterRequest(name=name), timeout=self._opts.rpc_timeout, metadata=self.metadata)
                self._log.info("deregistered")
                return
            except grpc.RpcError as e:
                last = e
                if not is_transient(e):
                    break
        self._log.warning("could not deregister (%s): the daemon marks this agent inactive once its heartbeats stop", error_text(last))

    def close(self) -> None:
        self.closed.set()
        with self._cond:
            self._cond.notify_all()
        for d in self._dials:
            d.close()

    def _reconnect(self, cause: Optional[BaseException]) -> None:
        if self._generation > 0 and cause is not None:
            self._log.warning("connection or registration lost (%s): registering again with %s", error_text(cause), self.address)
            self._on_disconnected(cause)
        n = len(self._dials)
        failed: set[int] = set()
        round_ = 0
        while True:
            last: Optional[BaseException] = None
            tls: Optional[str] = None
            for i in range(n):
                if self.closed.is_set():
                    return
                index = (self._current + i) % n
                dial = self._dials[index]
                try:
                    if index in failed or (cause is not None and i == 0 and round_ == 0):
                        dial.reopen()
                    self._register(dial.stub, dial.target.address)
                except AgentFailedError as e:
                    self._fail(e)
                except grpc.RpcError as e:
                    if self.closed.is_set():
                        return
                    if not is_transient(e):
                        self._fail(AgentFailedError(f"the daemon at {dial.target.address} refused to register agent '{self._opts.name}': {error_text(e)}"))
                    failed.add(index)
                    last = e
                    tls = tls or tls_words(e)
                    self._log.debug("daemon %s unreachable: %s", dial.target.address, error_text(e))
                    continue
                with self._cond:
                    self._current = index
                    self._generation += 1
                return
            wait = backoff.delay(round_, self._opts.reconnect)
            reason = (tls or error_text(last)) if last is not None else "no answer"
            self._log.warning("no daemon reachable at %s: %s: retrying in %.1fs", ", ".join(d.target.address for d in self._dials), reason, wait)
            round_ += 1
            if self.closed.wait(wait):
                return

    def _fail(self, err: AgentFailedError) -> None:
        with self._cond:
            self._fatal = err
        self._on_fatal(err)
        raise err


__all__ = ["Link", "is_transient", "error_text", "TRANSIENT"]
