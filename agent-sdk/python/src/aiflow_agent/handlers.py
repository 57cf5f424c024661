"""Chooses an item's handler by engine kind and task name.

For an item of kind K and task T the first that exists wins: ``handlers[K]`` (a function),
``handlers[K][T]``, ``handlers[K]["*"]``, then the same lookups under ``handlers["*"]``.
"""
from __future__ import annotations

from typing import Mapping, Optional, Union

from .types import Handler, Handlers

WILDCARD = "*"


def _from_entry(entry: Union[Handler, Mapping[str, Handler], None], task: Optional[str]) -> Optional[Handler]:
    if entry is None:
        return None
    if callable(entry):
        return entry
    found = entry.get(task) if task is not None else None
    return found if found is not None else entry.get(WILDCARD)


def resolve_handler(handlers: Handlers, engine_kind: str, task_name: Optional[str]) -> Optional[Handler]:
    found = _from_entry(handlers.get(engine_kind), task_name)
    return found if found is not None else _from_entry(handlers.get(WILDCARD), task_name)


def describe_handlers(handlers: Handlers) -> str:
    """What this agent handles, for the error of an item nothing handles: ``dag{resize,*}, test``."""
    return ", ".join(k if callable(h) else f"{k}{{{','.join(h.keys())}}}" for k, h in handlers.items())


def check_handlers(handlers: Handlers) -> None:
    from .options import OptionsError

    if not isinstance(handlers, Mapping) or not handlers:
        raise OptionsError("handlers must map engine kinds to handlers (functions, or mappings of task names to functions)")
    for kind, h in handlers.items():
        if callable(h):
            continue
        if not isinstance(h, Mapping) or not all(callable(f) for f in h.values()):
            raise OptionsError(f"handlers[{kind!r}] must be a function or a mapping of task names to functions")
