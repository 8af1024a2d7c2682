"""Compiled executables of the ragged step, one per ``StepShape``, compiled without stalling the engine.

A step whose shape has not been compiled would wait for XLA (seconds on a CPU, longer than hundreds of
decode steps). Instead, when an already-compiled larger shape fits the step:
- if its estimated cost is within ``reuse_cost_ratio`` of the exact shape's, the step simply runs in it
  (compiling the exact shape would cost more CPU than it could save: on a 2-core machine a compilation
  competes with the steps themselves);
- else if it is within ``max_fallback_cost_ratio``, the step runs padded in it while the exact shape
  compiles on a background thread; the next steps of that shape use it once it is ready.
Only a step that nothing compiled can hold waits for its compilation ("blocking"). Padding never changes
the result of a real token, only how much work is wasted, so this is invisible in the outputs.

Compilation is ahead of time (``jit(...).lower(abstract args).compile()``): the abstract params and cache
are fixed at construction, and the batch is described by its shape alone.
"""

from __future__ import annotations

import concurrent.futures

import jax

from jaxinfer.batch_packing import StepShape, abstract_batch


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


class StepExecutables:
    """All state lives in the engine's thread; the background thread only runs ``_compile``."""

    def __init__(self, step_fn, params, kv_cache, cost, *, background: bool = True,
                 reuse_cost_ratio: float = 1.25, max_fallback_cost_ratio: float = 8.0):
        """``step_fn``: the jitted step (static ``max_q_len`` and ``num_prefill_slots``); ``cost``: a
        function StepShape -> estimated FLOPs, used to pick and bound fallbacks."""
        self._step_fn = step_fn
        self._params = _abstract(params)
        self._cache = _abstract(kv_cache)
        self._cost = cost
        self.background = background
        self.reuse_cost_ratio = reuse_cost_ratio
        self.max_fallback_cost_ratio = max_fallback_cost_ratio
        self._ready: dict[StepShape, object] = {}
        self._reused: dict[StepShape, StepShape] = {}  # shape -> the compiled shape it runs in for good
        self._compiling: dict[StepShape, concurrent.futures.Future] = {}
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.num_blocking = 0
        self.num_fallback_steps = 0

    @property
    def compiling(self) -> bool:
        """Whether a background compilation is in flight (or finished but not yet collected)."""
        return bool(self._compiling)

    @property
    def num_compiled(self) -> int:
        return len(self._ready)

    def _compile(self, shape: StepShape):
        lowered = self._step_fn.lower(self._params, self._cache, abstract_batch(shape),
                                      max_q_len=shape.max_q_len, num_prefill_slots=shape.num_prefill_slots)
        return lowered.compile()

    def _finish(self, shape: StepShape) -> None:
        self._ready[shape] = self._compiling.pop(shape).result()  # a failed compile raises here

    def _cheapest_fit(self, need: StepShape, ratio: float):
        limit = self._cost(need) * ratio
        fits = [(c, s) for s in self._ready if s.fits(need) and (c := self._cost(s)) <= limit]
        return min(fits)[1] if fits else None

    def get(self, need: StepShape):
        """(the shape to pack the step in, its executable)."""
        for shape in [s for s, f in self._compiling.items() if f.done()]:
            self._finish(shape)
        shape = need if need in self._ready else self._reused.get(need)
        if shape is not None:
            return shape, self._ready[shape]
        if not self.background:
            self._ready[need] = self._compile(need)
            self.num_blocking += 1
            return need, self._ready[need]
        if need not in self._compiling:
            shape = self._cheapest_fit(need, self.reuse_cost_ratio)
            if shape is not None:
                self._reused[need] = shape
                return shape, self._ready[shape]
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="jaxinfer-compile")
            self._compiling[need] = self._pool.submit(self._compile, need)
        shape = self._cheapest_fit(need, self.max_fallback_cost_ratio)
        if shape is not None:
            self.num_fallback_steps += 1
            return shape, self._ready[shape]
        self._finish(need)  # nothing compiled fits: wait for it
        self.num_blocking += 1
        return need, self._ready[need]

    def wait(self) -> None:
        """Block until every background compilation has finished (tests, benchmarks' warm-up)."""
        for shape in list(self._compiling):
            self._finish(shape)

    def stats(self) -> dict:
        return {"compiled": self.num_compiled, "blocking": self.num_blocking,
                "background": self.num_compiled - self.num_blocking, "compiling": len(self._compiling),
                "fallback_steps": self.num_fallback_steps, "reused_shapes": len(self._reused)}
