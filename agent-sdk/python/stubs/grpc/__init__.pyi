# The part of grpcio's API this library uses, typed for mypy --strict (Debian's grpcio ships no
# hints). Keep it to what the library calls; the runtime is stock grpcio.
import enum
from typing import Any, Optional, Sequence, Tuple

class StatusCode(enum.Enum):
    OK: Any
    CANCELLED: Any
    UNKNOWN: Any
    INVALID_ARGUMENT: Any
    DEADLINE_EXCEEDED: Any
    NOT_FOUND: Any
    ALREADY_EXISTS: Any
    PERMISSION_DENIED: Any
    RESOURCE_EXHAUSTED: Any
    FAILED_PRECONDITION: Any
    ABORTED: Any
    OUT_OF_RANGE: Any
    UNIMPLEMENTED: Any
    INTERNAL: Any
    UNAVAILABLE: Any
    DATA_LOSS: Any
    UNAUTHENTICATED: Any

class RpcError(Exception):
    def code(self) -> StatusCode: ...
    def details(self) -> Optional[str]: ...

class ChannelCredentials: ...

class Channel:
    def close(self) -> None: ...

def ssl_channel_credentials(
    root_certificates: Optional[bytes] = ...,
    private_key: Optional[bytes] = ...,
    certificate_chain: Optional[bytes] = ...,
) -> ChannelCredentials: ...
def insecure_channel(target: str, options: Optional[Sequence[Tuple[str, Any]]] = ..., compression: Any = ...) -> Channel: ...
def secure_channel(
    target: str, credentials: ChannelCredentials, options: Optional[Sequence[Tuple[str, Any]]] = ..., compression: Any = ...
) -> Channel: ...
