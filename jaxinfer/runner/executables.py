"""Compiled executables of a runner, keyed by plan entries, compiled before the first request.

An ``Entry`` says how to build one executable: a jitted function, its abstract arguments (shapes, dtypes,
shardings: no data) and its static keywords. ``Executables`` holds a runner's compiled entries:
``warm_up`` compiles a whole plan at start — loaded from the on-disk cache where possible, otherwise traced
and lowered on the calling thread (Python holds the GIL there) while XLA compiles earlier entries on a
thread pool — then executes each once on harmless inputs (padding only), the largest step shapes included:
on XLA:CPU the first execution of an executable costs more CPU than later ones (measured on the embedded model:
0.2-0.5 s more for the 384-2048-token steps), which would otherwise land on the first long prompt's TTFT.
``get`` hands one out. An entry that was not compiled at start (``compilation="lazy"``, or
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

from jaxinfer.core.progress import ProgressBar
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
    """One runner's compiled executables; all state lives in the engine's thread.

    The one way an executable becomes ready: ``prepare(key)`` builds its entry and loads it from the disk
    cache, or returns the lowered computation still to compile; ``finish`` records a compiled one (and
    stores it in the cache). ``get`` does both at once for a key that was not ready; ``warm_up`` does them
    for a whole plan, compiling on a thread pool."""

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

    def ready_keys(self) -> set:
        """The keys whose executables are ready (compiled or loaded)."""
        return set(self._ready)

    @property
    def num_loaded(self) -> int:
        return len(self.loaded_keys)

    def entry(self, key: Hashable) -> Entry:
        """How ``key``'s executable is built (its function, abstract arguments, first run)."""
        return self._build(key)

    def get(self, key: Hashable):
        """The compiled executable of ``key``, compiled now (and counted) if it was not at start."""
        compiled = self._ready.get(key)
        if compiled is None:
            if self.started:
                self.compiled_after_start.append(key)
                warnings.warn(f"jaxinfer: {self.name} compiled {key} after start: this shape is outside the "
                              "plan compiled at start (please report it)", RuntimeWarning, stacklevel=3)
            pending = self.prepare(key)
            if pending is not None:
                self.finish(pending, pending.lowered.compile())
            compiled = self._ready[key]
        return compiled

    def prepare(self, key: Hashable) -> "PendingCompile | None":
        """Make ``key`` ready from the disk cache if it holds it (None); else its lowered computation."""
        entry = self._build(key)
        cache_key = entry.cache_key(self._cache) if self._cache is not None else None
        if cache_key is not None:
            compiled = self._cache.load(cache_key, execution_devices(entry.args))
            if compiled is not None:
                self._ready[key] = compiled
                self.loaded_keys.add(key)
                return None
        return PendingCompile(self, key, entry.lower(), cache_key)

    def finish(self, pending: "PendingCompile", compiled, store: bool = True) -> None:
        """Record the compiled executable of a prepared key (and, with ``store``, write it to the disk cache)."""
        self._ready[pending.key] = compiled
        self.num_compiled += 1
        if store:
            self.store(pending, compiled)

    def store(self, pending: "PendingCompile", compiled) -> None:
        """Write a compiled executable of a prepared key to the disk cache (if it has one)."""
        if pending.cache_key is not None:
            self._cache.store(pending.cache_key, compiled)

    def run_once(self, key: Hashable) -> None:
        """Execute a ready executable once on harmless inputs, if its entry says how (XLA:CPU's first
        execution prepares kernels: better at start than in the first request)."""
        entry = self._build(key)
        if entry.run_once is not None:
            entry.run_once(self._ready[key])


@dataclasses.dataclass
class PendingCompile:
    """A lowered executable of ``owner`` waiting for XLA's compile."""

    owner: Executables
    key: Hashable
    lowered: Any
    cache_key: str | None


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
    (tracing on this thread, XLA compilations on ``workers`` threads), run each once. Returns what was done."""
    t0 = time.perf_counter()
    todo = [(ex, key) for ex, keys in plans for key in dict.fromkeys(keys) if key not in ex]
    workers = workers or max(1, os.cpu_count() or 1)
    show = sys.stderr.isatty() if progress is None else progress
    bar = ProgressBar("compiling the shape plan", len(todo)) if show and todo else None
    from_cache = 0
    pending: dict[concurrent.futures.Future, PendingCompile] = {}
    compiled: list[tuple[PendingCompile, Any]] = []
    try:
        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="jaxinfer-compile") as pool:
            for ex, key in todo:
                job = ex.prepare(key)
                if job is None:
                    from_cache += 1
                    if bar:
                        bar.advance()
                    continue
                pending[pool.submit(job.lowered.compile)] = job
                compiled += _collect(pending, bar, block=False)
            compiled += _collect(pending, bar, block=True)
    finally:
        if bar:
            bar.close()
    # written to the disk cache once no XLA compilation runs: the one abort seen in a full test run (jax 0.10.2,
    # XLA:CPU) came while an executable was serialized beside other threads' compiles; this rules that overlap out
    for job, executable in compiled:
        job.owner.store(job, executable)
    t_run = time.perf_counter()
    for ex, key in todo:
        ex.run_once(key)
    for ex, _ in plans:
        ex.started = True
    report = WarmUpReport(len(todo), from_cache, time.perf_counter() - t0, time.perf_counter() - t_run)
    logger.info("%s", report)
    return report


def _collect(pending: dict, bar, block: bool) -> list[tuple[PendingCompile, Any]]:
    """Record the finished compilations (not yet written to the disk cache); returns them."""
    done = [f for f in pending if f.done()] if not block else list(concurrent.futures.as_completed(pending))
    out = []
    for future in done:
        job = pending.pop(future)
        executable = future.result()
        job.owner.finish(job, executable, store=False)
        out.append((job, executable))
        if bar:
            bar.advance()
    return out
