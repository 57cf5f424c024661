"""``handle_signals``: SIGTERM and SIGINT drain the agent, and a second one stops it at once. Python
installs signal handlers on the main thread only, so an agent started from another thread handles
none (and says so), and the previous handlers are restored from the main thread."""
from __future__ import annotations

import logging
import signal
import threading
from typing import Any, Callable, Dict


class SignalHandlers:
    def __init__(self, log: logging.Logger, drain: Callable[[], None], stop: Callable[[], None]) -> None:
        self._log = log
        self._drain = drain
        self._stop = stop
        self._signals: Dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            self._log.warning("handle_signals needs the agent started from the main thread: signals not handled")
            return
        count = {"n": 0}

        def on_signal(signum: int, _frame: Any) -> None:
            count["n"] += 1
            if count["n"] == 1:
                self._log.info("signal %d: draining (a second one stops at once)", signum)
                self._drain()
            else:
                self._log.warning("second signal %d: stopping now", signum)
                self._stop()

        for s in (signal.SIGTERM, signal.SIGINT):
            self._signals[s] = signal.signal(s, on_signal)

    def restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            # Restored by whoever runs on the main thread next: signal.signal works only there.
            return
        for s, previous in self._signals.items():
            signal.signal(s, previous)
        self._signals.clear()


__all__ = ["SignalHandlers"]
