"""The request workloads the benches share, so that no bench module imports another for them.

``serve`` (in process), ``serve_http`` (the same workload through an OpenAI-compatible server), ``prefix``
and ``serve-model`` all replay lists of ``TimedRequest``: an arrival time, a prompt of token ids and an
output length. Here are the workload itself (``WorkloadSpec``, the arrival process, ``make_workload``, the
spec from the command line), the engine settings a workload runs under (``engine_kwargs``), and the
percentile summary both the in-process driver and the HTTP client report. ``random_prompts`` builds the
batches of random-token prompts that ``latency``, ``paged`` and ``serve-model`` send all at once. Nothing
here imports JAX.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

PERCENTILES = (50, 90, 99)
DEFAULT_INPUT_LEN_RANGE = (32, 256)
DEFAULT_OUTPUT_LEN_RANGE = (16, 256)


@dataclasses.dataclass(frozen=True)
class TimedRequest:
    request_id: str
    arrival_s: float  # seconds after the start of the run
    prompt_token_ids: tuple[int, ...]
    output_len: int
    prompt_text: str | None = None  # sent instead of the token ids when set (their count is then the server's)


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    num_requests: int
    rate: float  # requests per second; inf = all at once
    burstiness: float  # gamma shape of the inter-arrival gaps; 1.0 = Poisson
    input_len_range: tuple[int, int]  # inclusive; (n, n) = fixed
    output_len_range: tuple[int, int]
    seed: int

    def __post_init__(self):
        if self.num_requests < 1:
            raise ValueError(f"num_requests must be >= 1, got {self.num_requests}")
        if not self.rate > 0:
            raise ValueError(f"rate must be > 0 requests/s (inf = all at once), got {self.rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness (gamma shape) must be > 0, got {self.burstiness}")
        for name in ("input_len_range", "output_len_range"):
            lo, hi = getattr(self, name)
            if not 1 <= lo <= hi:
                raise ValueError(f"{name} must satisfy 1 <= low <= high, got {(lo, hi)}")

    @property
    def max_len(self) -> int:
        return self.input_len_range[1] + self.output_len_range[1]

    @property
    def offered_output_tok_s(self) -> float:
        """Mean output tokens per second the arrivals ask for (rate x mean output length)."""
        return self.rate * sum(self.output_len_range) / 2


def arrival_offsets(n: int, rate: float, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times (s) of n requests: the first at 0, then gamma gaps of mean 1/rate and shape burstiness."""
    if math.isinf(rate):
        return np.zeros(n)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def make_workload(spec: WorkloadSpec, vocab_size: int, token_variant: int = 0, id_prefix: str = "req") -> list[TimedRequest]:
    """The schedule and lengths depend only on ``spec``; the prompt tokens also on ``token_variant``, so a
    warm-up can replay the same shapes with different tokens (no prefix-cache hits on the timed run)."""
    rng = np.random.default_rng([spec.seed, 0])
    arrivals = arrival_offsets(spec.num_requests, spec.rate, spec.burstiness, rng)
    in_lens = rng.integers(spec.input_len_range[0], spec.input_len_range[1] + 1, size=spec.num_requests)
    out_lens = rng.integers(spec.output_len_range[0], spec.output_len_range[1] + 1, size=spec.num_requests)
    tok_rng = np.random.default_rng([spec.seed, 1, token_variant])
    return [
        TimedRequest(f"{id_prefix}-{i}", float(arrivals[i]),
                     tuple(int(t) for t in tok_rng.integers(0, vocab_size, size=int(in_lens[i]))), int(out_lens[i]))
        for i in range(spec.num_requests)
    ]


def random_prompts(rng: np.random.Generator, batch_size: int, prompt_len: int, vocab_size: int) -> list[dict]:
    """``batch_size`` prompts (``{"prompt_token_ids": [...]}``) of ``prompt_len`` token ids each, uniform below
    ``vocab_size``, drawn from ``rng`` one prompt after the other (a caller's seeding fixes the tokens)."""
    return [{"prompt_token_ids": rng.integers(0, vocab_size, size=prompt_len).tolist()} for _ in range(batch_size)]


def workload_spec(args) -> WorkloadSpec:
    def lens(fixed, rng_arg, default):
        if fixed is not None:
            return (fixed, fixed)
        return tuple(rng_arg) if rng_arg is not None else default

    return WorkloadSpec(args.num_requests, args.rate, args.burstiness,
                        lens(args.input_len, args.input_len_range, DEFAULT_INPUT_LEN_RANGE),
                        lens(args.output_len, args.output_len_range, DEFAULT_OUTPUT_LEN_RANGE), args.seed)


def engine_kwargs(args, spec, **overrides) -> dict:
    """LLM(...) keyword arguments from the shared command-line options; ``spec.max_len`` bounds the context."""
    kw = dict(dtype=args.dtype, max_model_len=max(spec.max_len, args.max_model_len or 0), max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, seed=args.seed)
    kw.update(overrides)
    return kw


def percentiles(values) -> dict:
    """P50/P90/P99 (linear interpolation, so ordered) and the mean; NaN for no values."""
    v = np.asarray(list(values), dtype=np.float64)
    if v.size == 0:
        return {**{f"p{p}": math.nan for p in PERCENTILES}, "mean": math.nan}
    qs = np.percentile(v, PERCENTILES)
    return {**{f"p{p}": float(q) for p, q in zip(PERCENTILES, qs)}, "mean": float(v.mean())}
