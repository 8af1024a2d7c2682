"""Compiled executables of a runner, keyed by plan entries, compiled before the first request.

An ``Entry`` says how to build one executable: a jitted function, its abstract arguments (shapes, dtypes,
shardings: no data) and its static keywords. ``Executables`` holds a runner's compiled entries:
``warm_up`` compiles a whole plan at start — loaded from the on-disk cache where possible, otherwise traced
and lowered on the calling thread (Python holds the GIL there) while XLA compiles earlier entries on a
thread pool — then executes each once on harmless inputs (padding only: on XLA:CPU the first execution of
an executable costs 10-100 ms more than later ones), and ``get`` hands one out. An entry that was not compiled at start (``compilation="lazy"``, or
a shape outside the plan, which is a bug) is compiled on first use, counted, and, after start, named in a
warning.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import sys
import time
import warnings
from typing import Any, Callable, Hashable

import jax

from jaxinfer.runner.compile_cache import ExecutableCache, execution_devices

logger = logging.getLogger("jaxinfer")


@dataclasses.dataclass
class Entry:
    """How to compile one executable."""

    fn: Any  # a jax.jit-wrapped function
    args: tuple  # abstract positional arguments (pytrees of jax.ShapeDtypeStruct)
    statics: dict  # static keyword arguments
    description: str  # everything the function closes over, as stable text (part of the cache key)
    run_once: Callable[[Any], None] | None = None  # executes the compiled entry once on harmless inputs

    def lower(self):
        return self.fn.trace(*self.args, **self.statics).lower()

    def cache_key(self, cache: ExecutableCache) -> str:
        return cache.key(f"{self.description}|{sorted(self.statics.items())}", self.args)


def abstract(tree):
    """The pytree as ShapeDtypeStructs, shardings kept (for compiling ahead of the data)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)


class Executables:
    """One runner's compiled executables; all state lives in the engine's thread."""

    def __init__(self, build: Callable[[Hashable], Entry], cache: ExecutableCache | None, name: str = "runner"):
        self._build = build
        self._cache = cache
        self.name = name
        self._ready: dict[Hashable, Any] = {}
        self.started = False  # set once the engine has warmed up: compilations from then on are unplanned
        self.num_compiled = 0  # compiled by XLA in this process
        self.loaded_keys: set = set()  # keys loaded from the on-disk cache
        self.compiled_after_start: list[Hashable] = []

    def __contains__(self, key: Hashable) -> bool:
        return key in self._ready

    @property
    def num_ready(self) -> int:
        return len(self._ready)

    @property
    def num_loaded(self) -> int:
        return len(self.loaded_keys)

    def get(self, key: Hashable):
        """The compiled executable of ``key``, compiled now (and counted) if it was not at start."""
        compiled = self._ready.get(key)
        if compiled is None:
            if self.started:
                self.compiled_after_start.append(key)
                warnings.warn(f"jaxinfer: {self.name} compiled {key} after start: this shape is outside the "
                              "plan compiled at start (please report it)", RuntimeWarning, stacklevel=3)
            compiled = self._load_or_compile(key)
        return compiled

    def _load_or_compile(self, key: Hashable):
        entry = self._build(key)
        cache_key = entry.cache_key(self._cache) if self._cache is not None else None
        compiled = self._cache.load(cache_key, execution_devices(entry.args)) if cache_key is not None else None
        if compiled is not None:
            self.loaded_keys.add(key)
        else:
            compiled = entry.lower().compile()
            self.num_compiled += 1
            if cache_key is not None:
                self._cache.store(cache_key, compiled)
        self._ready[key] = compiled
        return compiled


@dataclasses.dataclass
class WarmUpReport:
    num_executables: int
    num_from_cache: int
    seconds: float  # all of warm-up
    first_run_seconds: float  # of which executing each executable once

    def __str__(self) -> str:
        return (f"compiled {self.num_executables} executables in {self.seconds:.1f} s, "
                f"{self.num_from_cache} from cache (first runs {self.first_run_seconds:.1f} s)")


def warm_up(plans: list[tuple[Executables, list[Hashable]]], *, workers: int | None = None,
            progress: bool | None = None) -> WarmUpReport:
    """Make every listed key of every ``Executables`` ready: load what the disk cache has, compile the rest
    (tracing on this thread, XLA compilations on ``workers`` threads). Returns what was done."""
    t0 = time.perf_counter()
    todo = [(ex, key) for ex, keys in plans for key in dict.fromkeys(keys) if key not in ex]
    workers = workers or max(1, os.cpu_count() or 1)
    show = sys.stderr.isatty() if progress is None else progress
    bar = _Bar(len(todo)) if show and todo else None
    from_cache = 0
    pending: dict[concurrent.futures.Future, tuple] = {}
    try:
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="jaxinfer-compile") as pool:
            for ex, key in todo:
                entry = ex._build(key)
                cache_key = entry.cache_key(ex._cache) if ex._cache is not None else None
                compiled = ex._cache.load(cache_key, execution_devices(entry.args)) if cache_key is not None else None
                if compiled is not None:
                    ex._ready[key] = compiled
                    ex.loaded_keys.add(key)
                    from_cache += 1
                    if bar:
                        bar.advance()
                    continue
                lowered = entry.lower()
                pending[pool.submit(lowered.compile)] = (ex, key, cache_key)
                _collect(pending, bar, block=False)
            _collect(pending, bar, block=True)
    finally:
        if bar:
            bar.close()
    t_run = time.perf_counter()
    for ex, key in todo:
        entry = ex._build(key)
        if entry.run_once is not None:
            entry.run_once(ex._ready[key])
    for ex, _ in plans:
        ex.started = True
    report = WarmUpReport(len(todo), from_cache, time.perf_counter() - t0, time.perf_counter() - t_run)
    logger.info("%s", report)
    return report


def _collect(pending: dict, bar, block: bool) -> None:
    done = [f for f in pending if f.done()] if not block else list(concurrent.futures.as_completed(pending))
    for future in done:
        ex, key, cache_key = pending.pop(future)
        compiled = future.result()
        ex._ready[key] = compiled
        ex.num_compiled += 1
        if cache_key is not None:
            ex._cache.store(cache_key, compiled)
        if bar:
            bar.advance()


class _Bar:
    def __init__(self, total: int):
        from rich.progress import Progress

        self._progress = Progress(transient=True)
        self._task = self._progress.add_task("compiling the shape plan", total=total)
        self._progress.start()

    def advance(self) -> None:
        self._progress.advance(self._task)

    def close(self) -> None:
        self._progress.stop()
