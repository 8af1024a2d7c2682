"""LLMEngine: requests in, RequestOutputs out; one ``step()`` = schedule -> run -> postprocess.

Every request is validated completely in ``add_request`` before anything is queued (``jaxinfer.core.request_io``),
so a bad request is refused with a ``ValueError`` and the engine keeps serving everyone else. A request with
``n > 1`` becomes ``n`` sequences that share its prompt.
"""

from __future__ import annotations

import itertools
import logging
import time
import warnings
from typing import Any, Iterable

import jax
import numpy as np

from jaxinfer.config.engine import EngineConfig
from jaxinfer.config.speculative import SpeculativeConfig
from jaxinfer.core import request_io
from jaxinfer.core.block_manager import BlockManager
from jaxinfer.core.scheduler import Scheduler, SchedulerConfig
from jaxinfer.core.sequence import Sequence
from jaxinfer.core.tokenizer import IncrementalDetokenizer
from jaxinfer.cpu import host_allocator
from jaxinfer.loading.model_source import load_model, resolve_dtype
from jaxinfer.model.kv_cache import kv_cache_bytes_per_block
from jaxinfer.outputs import RequestMetrics, RequestOutput
from jaxinfer.quantization import options as quant_setup
from jaxinfer.runner import multihost
from jaxinfer.runner.compile_cache import ExecutableCache, cache_enabled_by_env, default_cache_dir
from jaxinfer.runner.compile_monitor import CompileWatch
from jaxinfer.runner.executables import warm_up
from jaxinfer.runner.model_runner import ModelRunner
from jaxinfer.runner.multistep import burst_length
from jaxinfer.runner.shape_plan import ShapePlan
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.spec_decode.controller import SpecController
from jaxinfer.spec_decode.draft_model import DraftProposer
from jaxinfer.spec_decode.ngram import propose_ngram

DEFAULT_CPU_KV_BYTES = 2 << 30
logger = logging.getLogger("jaxinfer")


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        platform = jax.default_backend()
        if platform == "cpu":
            host_allocator.keep_freed_memory_in_heap()
        self.dtype = resolve_dtype(config.dtype, platform)
        self.mesh = self._make_mesh()
        if self.mesh is not None and config.speculative_config and config.speculative_config.get("method") == "draft_model":
            raise NotImplementedError(
                "a draft model with tensor_parallel_size > 1 is not supported yet: use method 'ngram' "
                "or tensor_parallel_size=1"
            )
        backend = config.attention_backend
        if backend == "auto":
            backend = "pallas" if platform == "gpu" else "xla"
        quant = quant_setup.QuantOptions(config.quantization, config.kv_cache_dtype)
        quant_setup.check_platform(quant, platform, backend)  # before anything is read or allocated
        checkpoint_kind = quant_setup.check_checkpoint(quant, config.model, quant_setup.has_fp8_compute(platform))
        self.model_config, params, self.tokenizer, self.model_source, self.sharding_plan = load_model(
            config.model, self.dtype, config.seed, mesh=self.mesh, expert_parallel=config.enable_expert_parallel,
            quant=quant,
        )
        cfg = self.model_config
        self.kv_dtype = quant_setup.kv_cache_dtype(quant, self.dtype, backend)
        self.quantization = quant_setup.describe(params, cfg, self.dtype, quant, checkpoint_kind)
        if quant.active or checkpoint_kind != "dense":
            logger.info(quant_setup.summary_line(self.quantization))
        self.max_model_len = config.max_model_len or cfg.max_position_embeddings
        if self.max_model_len > cfg.max_position_embeddings and cfg.rope_scaling is None:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the model's max_position_embeddings "
                f"({cfg.max_position_embeddings})"
            )
        self.eos_token_ids = tuple(self.tokenizer.eos_token_ids) if self.tokenizer else cfg.eos_token_ids
        self.attention_backend = backend
        self.num_blocks = self._num_kv_blocks(platform)
        sched_cfg = SchedulerConfig(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            policy=config.scheduling_policy,
            batching=config.batching,
            static_batch_timeout_s=config.static_batch_timeout_s,
        )
        self.block_manager = BlockManager(self.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(sched_cfg, self.block_manager)
        spec = SpeculativeConfig.from_dict(config.speculative_config) if config.speculative_config else None
        self.query_width = 1 + spec.num_speculative_tokens if spec is not None else None
        # EOS and stop ids are banned until min_tokens: a fixed-width matrix (one compiled shape)
        self.banned_width = max(16, -(-(len(self.eos_token_ids) + 8) // 8) * 8)
        self._limits = request_io.RequestLimits(cfg.vocab_size, self.max_model_len, self.eos_token_ids,
                                                self.banned_width, self.tokenizer)
        self._cache = self._executable_cache()
        self._runner_kwargs = dict(num_blocks=self.num_blocks, block_size=config.block_size, sharding=self.sharding_plan,
                                   max_model_len=self.max_model_len, kv_dtype=self.kv_dtype, attention_backend=backend,
                                   eos_token_ids=self.eos_token_ids, banned_width=self.banned_width, cache=self._cache)
        draft_model = spec is not None and spec.method == "draft_model"
        self.runner = ModelRunner(
            cfg, params, plan=self._plan("all"), name="target", num_scheduler_steps=config.num_scheduler_steps,
            draft_q_shape=(spec.num_speculative_tokens, self._plan("all").seq_buckets[-1]) if draft_model else None,
            **self._runner_kwargs,
        )
        self._setup_speculation(spec)
        self._requests: dict[str, request_io.EngineRequest] = {}
        self._seq_ids = itertools.count()
        self._seed_rng = np.random.default_rng(config.seed)
        self.num_steps = 0
        self.num_compilations_after_start = 0
        self._compile_events = 0  # compilations seen during steps (any kind): speculation timing skips them
        self._unplanned_seen = 0
        self._watch = CompileWatch()
        self.warm_up_report = None
        plan = self._plan_keys()
        logger.info("shape plan: %d executables (%d step shapes)", sum(len(k) for _, k in plan),
                    sum(1 for _, keys in plan for k in keys if k[0] == "step"))
        if config.compilation == "eager":
            self.warm_up_report = warm_up(plan)  # marks every runner's executables as started
        if multihost.multi_process():
            multihost.Channel.warm_up(self.runner.max_payload_words())

    def _plan(self, verify_logits: str) -> ShapePlan:
        c = self.config
        return ShapePlan(c.max_num_seqs, c.max_num_batched_tokens, self.query_width, verify_logits)

    def _plan_keys(self) -> list:
        """(executables, keys) of every runner: what warm-up compiles."""
        plan = [(self.runner.executables, self.runner.plan_keys())]
        if isinstance(self.proposer, DraftProposer):
            plan.append((self.draft_runner.executables, self.proposer.plan_keys()))
        return plan

    def _executable_cache(self) -> ExecutableCache | None:
        c = self.config
        if not (c.enable_compilation_cache and cache_enabled_by_env()):
            return None
        return ExecutableCache(c.compilation_cache_dir or default_cache_dir())

    def _setup_speculation(self, sc: SpeculativeConfig | None) -> None:
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self._propose_seconds = 0.0  # host + draft time spent preparing the next step's proposals
        self._proposed_at = 0.0  # when they were ready: the step they prepared runs from then on
        self._compiles_before_proposal = 0  # compilations (any kind) before the proposals of the next step
        self.proposer = None
        self.spec_controller = None
        if sc is None:
            return
        self.spec_config = sc
        self.spec_controller = SpecController(sc.num_speculative_tokens, adaptive=sc.adaptive)
        if sc.method == "ngram":
            self.proposer = "ngram"
            self.spec_min_n, self.spec_max_n = sc.prompt_lookup_min, sc.prompt_lookup_max
            return
        draft_cfg, draft_params, draft_tok, _, _ = load_model(sc.model, self.dtype, self.config.seed)
        if draft_cfg.vocab_size != self.model_config.vocab_size:
            raise ValueError(
                f"the draft model's vocabulary ({draft_cfg.vocab_size}) differs from the target's "
                f"({self.model_config.vocab_size}): a draft must share the target's tokenizer"
            )
        if draft_tok is not None and self.tokenizer is not None and draft_tok.vocab_size != self.tokenizer.vocab_size:
            raise ValueError("the draft model's tokenizer differs from the target's")
        if draft_cfg.max_position_embeddings < self.max_model_len and draft_cfg.rope_scaling is None:
            raise ValueError(
                f"the draft model supports {draft_cfg.max_position_embeddings} positions, less than "
                f"max_model_len={self.max_model_len}"
            )
        self.draft_runner = ModelRunner(draft_cfg, draft_params, plan=self._plan("last"), name="draft",
                                        **{**self._runner_kwargs, "kv_dtype": self.dtype})  # dense draft
        self.proposer = DraftProposer(self.draft_runner, sc.num_speculative_tokens)

    def _make_mesh(self):
        """The device mesh of tensor / expert parallelism (None: one device, nothing sharded). Checked before
        anything is loaded: sizes the devices cannot hold are a ValueError."""
        c = self.config
        if c.tensor_parallel_size == 1 and not c.enable_expert_parallel and jax.process_count() == 1:
            return None
        from sharding import make_mesh

        if jax.process_count() > 1 and c.tensor_parallel_size != jax.device_count():
            raise ValueError(
                f"with {jax.process_count()} processes every device must take part: tensor_parallel_size must be "
                f"the global device count ({jax.device_count()}), got {c.tensor_parallel_size}"
            )
        return make_mesh(c.tensor_parallel_size, c.tensor_parallel_size if c.enable_expert_parallel else 1)

    def _num_kv_blocks(self, platform: str) -> int:
        cfg, c = self.model_config, self.config
        per_block = kv_cache_bytes_per_block(cfg, c.block_size, self.kv_dtype)
        if self.sharding_plan is not None:  # each device holds its KV heads of every block
            per_block = self.sharding_plan.kv_cache_bytes_per_block_per_device(c.block_size, self.kv_dtype)
        blocks_per_seq = -(-self.max_model_len // c.block_size)
        if c.num_kv_blocks is not None:
            num = c.num_kv_blocks
        else:
            budget = c.kv_cache_memory_bytes
            if budget is None:
                budget = DEFAULT_CPU_KV_BYTES
                if platform == "gpu":  # the device with the least room decides
                    devices = list(self.mesh.devices.flat) if self.mesh is not None else jax.devices()[:1]
                    budget = min(int(0.9 * st.get("bytes_limit", 0)) - st.get("bytes_in_use", 0)
                                 for st in ((d.memory_stats() or {}) for d in devices if d.process_index ==
                                            jax.process_index()))
            wanted = c.max_num_seqs * blocks_per_seq + 1
            num = max(min(wanted, budget // per_block), 2)
        if num - 1 < blocks_per_seq:
            raise ValueError(
                f"the KV pool ({num - 1} usable blocks of {c.block_size} tokens) cannot hold one request of "
                f"max_model_len={self.max_model_len} tokens ({blocks_per_seq} blocks): raise num_kv_blocks / "
                "kv_cache_memory_bytes or lower max_model_len"
            )
        return num

    # ------------------------------------------------------------- validation
    def process_prompt(self, prompt: Any) -> tuple[str | None, list[int]]:
        """Turn a prompt (str, {"prompt": str} or {"prompt_token_ids": [...]}) into (text, ids), validated."""
        return request_io.process_prompt(prompt, self._limits)

    def validate_request(self, prompt: Any, params: SamplingParams) -> tuple[str | None, list[int]]:
        """(text, ids) of a request that can run, or ValueError saying why not (nothing is queued)."""
        return request_io.validate_request(prompt, params, self._limits)

    # ----------------------------------------------------------------- requests
    def add_request(
        self,
        request_id: str,
        prompt: Any,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> None:
        params = params or SamplingParams()
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not isinstance(priority, int):
            raise ValueError(f"priority must be an int, got {priority!r}")
        text, ids = self.validate_request(prompt, params)
        arrival = time.monotonic() if arrival_time is None else arrival_time
        seqs = []
        for i in range(params.n):
            if params.seed is not None:
                seed = (params.seed * 1_000_003 + i) % 2**32
            else:
                seed = int(self._seed_rng.integers(0, 2**32))
            seq = Sequence(next(self._seq_ids), request_id, i, ids, params, seed, arrival, priority, cache_salt)
            if self.tokenizer is not None:
                seq.detokenizer = IncrementalDetokenizer(
                    self.tokenizer, ids, skip_special_tokens=params.skip_special_tokens
                )
            seqs.append(seq)
        self._requests[request_id] = request_io.EngineRequest(request_id, text, ids, params, seqs, RequestMetrics(arrival))
        for seq in seqs:
            self.scheduler.add(seq)

    def abort_request(self, request_ids: str | Iterable[str]) -> None:
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        for rid in request_ids:
            req = self._requests.pop(rid, None)
            if req is None:
                continue
            for seq in req.seqs:
                if not seq.is_finished:
                    seq.finish_reason = "abort"
                    self.scheduler.remove(seq)

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self._requests)

    # --------------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        """One step: schedule -> run (verify any speculative tokens) -> postprocess -> propose for the next.

        Returns the outputs of the requests that emitted tokens in this step."""
        with CompileWatch() as watch:
            self._watch = watch
            outputs = self._step()
        if watch.names:
            self._compile_events += len(watch.names)
            self.num_compilations_after_start += len(watch.names)
            unplanned = len(watch.names) - self._new_unplanned_compilations()
            if unplanned > 0 and self.config.compilation == "eager":
                warnings.warn(f"jaxinfer: a step compiled {watch.names} after start (an operation outside the "
                              "compiled plan; please report it)", RuntimeWarning, stacklevel=2)
        return outputs

    def _new_unplanned_compilations(self) -> int:
        """Compilations of plan-keyed executables since the last call (each already warned about)."""
        total = sum(len(r.executables.compiled_after_start) for r in self._runners())
        new, self._unplanned_seen = total - self._unplanned_seen, total
        return new

    def _step(self) -> list[RequestOutput]:
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return []
        num_steps = burst_length(plan.scheduled, self.config.num_scheduler_steps, self.max_model_len,
                                 self.block_manager)
        if num_steps > 1:
            emitted = self.runner.execute_multistep(plan.scheduled, num_steps)
        else:
            draft_q = self.proposer.q_for if isinstance(self.proposer, DraftProposer) else None
            emitted = self.runner.execute(plan.scheduled, draft_q_for=draft_q)
        self.num_steps += 1
        now = time.monotonic()
        touched: dict[str, request_io.EngineRequest] = {}
        for s in plan.scheduled:
            seq = s.seq
            req = self._requests[seq.request_id]
            if req.metrics.first_scheduled_time is None:
                req.metrics.first_scheduled_time = seq.first_scheduled_time
            tokens = emitted.get(seq.seq_id, [])
            accepted = max(len(tokens) - 1, 0)
            if s.num_spec_tokens:
                self.num_draft_tokens += s.num_spec_tokens
                self.num_accepted_tokens += accepted
                if self.spec_controller is not None:
                    self.spec_controller.record_acceptance(s.num_spec_tokens, accepted)
            computed = seq.num_computed_tokens + s.num_new_tokens - s.num_spec_tokens + accepted
            finished = False
            for tok in tokens:
                finished = request_io.append_token(seq, tok, now, self.eos_token_ids, self.max_model_len)
                if finished:
                    break
            self.scheduler.commit_computed(seq, min(computed, seq.num_tokens))
            if finished:
                self.scheduler.remove(seq)
            if tokens:
                if req.metrics.first_token_time is None:
                    req.metrics.first_token_time = now
                touched[req.request_id] = req
        if self.spec_controller is not None:
            # The step's full cycle: the caller's loop, scheduling, the device step, bookkeeping, and the
            # proposals that prepared it (a step that was not prepared by a measured choice is ignored).
            emitted_count = sum(len(tokens) for tokens in emitted.values())
            t = time.perf_counter()
            compiles = self._compile_events + len(self._watch.names)
            if compiles != self._compiles_before_proposal:
                # something compiled during the cycle (lazy mode): its time is not the arm's
                self.spec_controller.discard_step()
            else:
                self.spec_controller.record_step(emitted_count, t - self._proposed_at + self._propose_seconds)
            self._compiles_before_proposal = compiles
            self._propose()
            self._proposed_at = time.perf_counter()
            self._propose_seconds = self._proposed_at - t
        outputs = []
        for req in touched.values():
            if req.finished:
                req.metrics.finished_time = now
                self._requests.pop(req.request_id, None)
            outputs.append(request_io.make_output(req))
        return outputs

    def _propose(self) -> int:
        """Propose draft tokens for the running sequences that decode next step; returns how many."""
        if self.proposer is None:
            return 0
        decoding = [q for q in self.scheduler.running if q.num_computed_tokens == q.num_tokens - 1]
        prefilling = sum(q.num_tokens - q.num_computed_tokens for q in self.scheduler.running) - len(decoding)
        sched = self.scheduler
        admits = (self.config.batching == "continuous" and sched.waiting
                  and len(sched.running) < self.config.max_num_seqs)
        k = self.spec_controller.choose_k(len(decoding), prefilling or int(bool(admits)))
        if prefilling or admits:
            return 0  # the next step computes a prefill chunk: the scheduler would drop the drafts
        seqs, ks = [], []
        for q in decoding:
            p = q.params
            room = self.max_model_len - q.num_tokens
            if p.max_tokens is not None:
                room = min(room, p.max_tokens - q.num_output_tokens)
            kq = min(k, room - 1)
            if p.has_penalties or q.num_output_tokens < p.min_tokens or kq <= 0:
                continue  # penalties and min_tokens bans depend on every earlier token: decode plainly
            if not self.block_manager.grow(q, q.num_tokens + kq):
                continue
            seqs.append(q)
            ks.append(kq)
        if isinstance(self.proposer, DraftProposer):
            self.proposer.propose(seqs, ks)
        else:
            for q, kq in zip(seqs, ks):
                q.spec_token_ids = propose_ngram(q.token_ids, kq, self.spec_min_n, self.spec_max_n)
        return sum(len(q.spec_token_ids) for q in seqs)

    def _runners(self) -> list:
        return [self.runner] + ([self.draft_runner] if isinstance(self.proposer, DraftProposer) else [])

    # ------------------------------------------------------------- multi-host
    @property
    def is_leader(self) -> bool:
        """Process 0 runs the requests; with several processes (``jax.distributed``) the others follow."""
        return multihost.is_leader()

    def follow(self) -> None:
        """On a process other than 0: execute every step process 0 runs, until it calls ``close()``."""
        if self.is_leader:
            raise RuntimeError("follow() is for processes other than 0; process 0 serves the requests")
        self.runner.follow()

    def close(self) -> None:
        """On process 0 of a multi-process engine: release the followers (no-op with one process)."""
        if self.is_leader:
            self.runner.channel.stop()

    # -------------------------------------------------------------------- stats
    def stats(self) -> dict[str, Any]:
        bm = self.block_manager
        runners = self._runners()
        return {
            "free_blocks": bm.num_free_blocks,
            "total_blocks": bm.num_usable_blocks,
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "num_preemptions": self.scheduler.num_preemptions,
            "prefix_cache_query_tokens": bm.query_tokens,
            "prefix_cache_hit_tokens": bm.hit_tokens,
            "prefix_cache_evictions": bm.num_evictions,
            "prefix_cache_miss_tokens": dict(bm.miss_tokens),
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_compilations": sum(r.num_compilations for r in runners),  # compiled or loaded from disk
            "num_compilations_after_start": self.num_compilations_after_start,
            "num_executables_from_cache": sum(r.executables.num_loaded for r in runners),
            "compilation": self.config.compilation,
            "num_steps": self.num_steps,
            "speculation_arms": self.spec_controller.summary() if self.spec_controller is not None else {},
            "quantization": self.quantization,  # what was quantized, weight bytes before / after
        }
