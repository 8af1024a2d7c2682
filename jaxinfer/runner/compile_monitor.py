"""Counting the XLA compilations a piece of code causes, whatever their origin.

JAX reports every backend compilation (a jitted function's new shape, an eager ``jnp`` op on a new shape,
an ahead-of-time ``.compile()``) through ``jax.monitoring`` on the thread that compiles. ``CompileWatch``
counts those events on the current thread while it is active, with the name of each compiled function, so
the engine can prove that serving a request compiled nothing (``stats()["num_compilations_after_start"]``)
and name the culprit when something did.
"""

from __future__ import annotations

import threading

import jax

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_local = threading.local()
_install_lock = threading.Lock()
_installed: list[bool] = []  # the listener is registered once per process (jax.monitoring has no removal)


def _listener(event: str, duration: float, **kwargs) -> None:
    if event != _BACKEND_COMPILE_EVENT:
        return
    for watch in getattr(_local, "watches", ()):
        watch.names.append(str(kwargs.get("fun_name", "?")))


def _install() -> None:
    with _install_lock:
        if not _installed:
            jax.monitoring.register_event_duration_secs_listener(_listener)
            _installed.append(True)


class CompileWatch:
    """``with watch: ...`` records in ``watch.names`` the functions compiled on this thread meanwhile."""

    def __init__(self):
        _install()
        self.names: list[str] = []

    def __enter__(self) -> "CompileWatch":
        watches = getattr(_local, "watches", None)
        if watches is None:
            watches = _local.watches = []
        watches.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _local.watches.remove(self)
