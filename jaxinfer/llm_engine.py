"""LLMEngine: requests in, RequestOutputs out; one ``step()`` = schedule -> execute -> update.

The engine is the composition root: it loads the model (``loading``), sizes the KV pool
(``runner.kv_pool``), builds the scheduler and block manager (``core``), the model runner (``runner``),
speculation (``spec_decode``) and the output processor (``core.output_processor``), and compiles the shape
plan before it returns. Every request is validated completely in ``add_request`` before anything is queued
(``core.request_io``), so a bad request is refused with a ``ValueError`` and the engine keeps serving everyone
else. A request with ``n > 1`` becomes ``n`` sequences that share its prompt (and, with ``prompt_logprobs``, the
one dict its prompt logprobs are gathered in: computed once per request, see ``core.sequence``).

Structured outputs (``SamplingParams.structured_outputs``): the constraint is compiled for the tokenizer when
the request is validated (``jaxinfer.structured.backend``); each of its sequences gets a matcher, whose token
bitmask the runner applies in the token chooser. Constrained sequences take single steps (no multi-step
bursts, no draft tokens: their mask depends on every token before).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
import warnings
from typing import Any, Iterable

import jax
import numpy as np

from jaxinfer.config.engine import EngineConfig
from jaxinfer.config.kv_events import KVEventsConfig
from jaxinfer.config.speculative import SpeculativeConfig
from jaxinfer.config.structured import StructuredOutputsConfig
from jaxinfer.core import request_io
from jaxinfer.core.async_step import AsyncStepper, HostTimes, RunnerOps
from jaxinfer.core.block_manager import BlockManager
from jaxinfer.core.kv_events import KVEventBatch, KVEventRecorder
from jaxinfer.core.output_processor import OutputProcessor
from jaxinfer.core.scheduler import Scheduler, SchedulerConfig
from jaxinfer.core.sequence import Sequence
from jaxinfer.core.tokenizer import IncrementalDetokenizer
from jaxinfer.cpu import ffi as cpu_ffi
from jaxinfer.cpu import host_allocator
from jaxinfer.kv_events_publisher import make_publisher, require_packages
from jaxinfer.loading.model_source import activation_dtype, load_model, resolve_dtype
from jaxinfer.model.attention import resolve_attention_backend
from jaxinfer.outputs import RequestMetrics, RequestOutput
from jaxinfer.quantization import options as quant_setup
from jaxinfer.runner import kv_pool, launch, multihost
from jaxinfer.runner.compile_cache import ExecutableCache, cache_enabled_by_env, default_cache_dir
from jaxinfer.runner.compile_monitor import CompileWatch
from jaxinfer.runner.executables import warm_up
from jaxinfer.runner.model_runner import ModelRunner, RunnerOptions
from jaxinfer.runner.multistep import burst_length
from jaxinfer.runner.shape_plan import ShapePlan
from jaxinfer.sampling_params import SamplingParams
from jaxinfer.spec_decode.controller import SpecController
from jaxinfer.spec_decode.draft_model import DraftModelProposer
from jaxinfer.spec_decode.ngram import NgramProposer
from jaxinfer.spec_decode.speculator import Speculator

logger = logging.getLogger("jaxinfer")


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        platform = jax.default_backend()
        if platform == "cpu":
            host_allocator.keep_freed_memory_in_heap()
            cpu_ffi.load()  # build / load the C++ kernels now, outside any trace (traced code asks loaded())
        self.dtype = resolve_dtype(config.dtype, platform)
        self.mesh = self._make_mesh()
        if self.mesh is not None and config.speculative_config and config.speculative_config.get("method") == "draft_model":
            raise NotImplementedError(
                "a draft model with tensor_parallel_size > 1 is not supported yet: use method 'ngram' "
                "or tensor_parallel_size=1"
            )
        backend = resolve_attention_backend(config.attention_backend, platform)
        quant = quant_setup.QuantOptions(config.quantization, config.kv_cache_dtype)
        quant_setup.check_platform(quant, platform, backend)  # before anything is read or allocated
        checkpoint_kind = quant_setup.check_checkpoint(quant, config.model, quant_setup.has_fp8_compute(platform))
        model = load_model(config.model, self.dtype, config.seed, mesh=self.mesh,
                           expert_parallel=config.enable_expert_parallel, quant=quant)
        self.model_config, self.tokenizer = model.config, model.tokenizer
        self.model_source, self.sharding_plan = model.source, model.sharding_plan
        cfg = self.model_config
        # a bfloat16 model on a CPU computes in float32 (loading.model_source.activation_dtype)
        self.kv_dtype = quant_setup.kv_cache_dtype(quant, activation_dtype(self.dtype, platform), backend)
        self.quantization = quant_setup.describe(model.params, cfg, self.dtype, quant, checkpoint_kind)
        if quant.active or checkpoint_kind != "dense":
            logger.info(quant_setup.summary_line(self.quantization))
        self.max_model_len = config.max_model_len or cfg.max_supported_model_len
        if self.max_model_len > cfg.max_supported_model_len and cfg.rope_scaling is not None \
                and cfg.rope_scaling.rope_type == "longrope":
            raise NotImplementedError(
                f"max_model_len={self.max_model_len}: longrope's long factors (contexts past "
                f"original_max_position_embeddings={cfg.rope_scaling.original_max_position_embeddings}) are not "
                f"implemented; use max_model_len <= {cfg.max_supported_model_len}")
        if self.max_model_len > cfg.max_position_embeddings and cfg.rope_scaling is None:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the model's max_position_embeddings "
                f"({cfg.max_position_embeddings})"
            )
        self.eos_token_ids = tuple(self.tokenizer.eos_token_ids) if self.tokenizer else cfg.eos_token_ids
        self.attention_backend = backend
        self.num_blocks = kv_pool.num_kv_blocks(config, cfg, max_model_len=self.max_model_len,
                                                kv_dtype=self.kv_dtype, platform=platform, mesh=self.mesh,
                                                sharding_plan=self.sharding_plan)
        # KV-cache events (jaxinfer.kv_events_publisher): the block manager records them, each step publishes
        # one batch. Only process 0 schedules, so only it publishes; the publisher is made last (below).
        kv_events_config = KVEventsConfig.from_dict(config.kv_events_config)
        self.kv_events = KVEventRecorder() if kv_events_config.enabled and multihost.is_leader() else None
        if self.kv_events is not None:
            require_packages()  # before anything compiles
            if not config.enable_prefix_caching:
                logger.warning("KV-cache events with enable_prefix_caching=False: no block is ever cached, so "
                               "only resets are published")
        self.kv_events_publisher = None
        self.num_kv_event_batches = self.num_kv_events = 0
        self.block_manager = BlockManager(self.num_blocks, config.block_size, config.enable_prefix_caching,
                                          events=self.kv_events)
        self.scheduler = Scheduler(SchedulerConfig(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            policy=config.scheduling_policy,
            batching=config.batching,
            static_batch_timeout_s=config.static_batch_timeout_s,
        ), self.block_manager)
        spec = SpeculativeConfig.from_dict(config.speculative_config) if config.speculative_config else None
        self.verify_width = 1 + spec.num_speculative_tokens if spec is not None else None
        # EOS and stop ids are banned until min_tokens: a fixed-width matrix (one compiled shape)
        self.banned_width = max(16, -(-(len(self.eos_token_ids) + 8) // 8) * 8)
        self._limits = request_io.RequestLimits(cfg.vocab_size, self.max_model_len, self.eos_token_ids,
                                                self.banned_width, self.tokenizer)
        self._cache = self._executable_cache()
        self.structured_config = StructuredOutputsConfig.from_dict(config.structured_outputs_config)
        self.grammar_backend, self._no_grammar_reason = self._make_grammar_backend()
        options = RunnerOptions(num_blocks=self.num_blocks, block_size=config.block_size,
                                max_model_len=self.max_model_len, kv_dtype=self.kv_dtype, attention_backend=backend,
                                eos_token_ids=self.eos_token_ids, banned_width=self.banned_width,
                                grammar_backend=self.grammar_backend)
        draft_model = spec is not None and spec.method == "draft_model"
        self.runner = ModelRunner(
            cfg, model.params, plan=self._plan("all"), options=options, cache=self._cache, name="target",
            sharding_plan=self.sharding_plan, num_scheduler_steps=config.num_scheduler_steps,
            draft_q_shape=(spec.num_speculative_tokens, self._plan("all").seq_buckets[-1]) if draft_model else None,
        )
        # a draft model never samples for a constrained sequence (they get no drafts): no masked variants
        draft_options = dataclasses.replace(options, grammar_backend=None)
        self.speculator = self._make_speculator(spec, draft_options) if spec is not None else None
        self.output_processor = OutputProcessor(self.scheduler, self.eos_token_ids, self.max_model_len,
                                                tokenizer=self.tokenizer,
                                                jump_forward=self.structured_config.jump_forward)
        self._told_spec_skips_constrained = False
        self.async_scheduling = (platform != "cpu" and spec is None and config.num_scheduler_steps == 1
                                 if config.async_scheduling is None else config.async_scheduling)
        self.host_times = HostTimes()
        self.stepper = None
        if self.async_scheduling:
            ops = RunnerOps(launch.can_launch, lambda s: launch.prepare(self.runner, s),
                            lambda p: launch.dispatch(self.runner, p), self.runner.execute)
            self.stepper = AsyncStepper(self.scheduler, self.output_processor, ops, self.max_model_len)
            self.host_times = self.stepper.times
        self._seq_ids = itertools.count()
        self._seed_rng = np.random.default_rng(config.seed)
        self.num_compilations_after_start = 0
        self._compile_events = 0  # compilations seen during steps (any kind): speculation timing skips them
        self._unplanned_seen = 0
        self._watch = CompileWatch()
        self.warm_up_report = None
        plan = self.warm_up_plan()
        logger.info("shape plan: %d executables (%d step shapes)", sum(len(k) for _, k in plan),
                    sum(1 for _, keys in plan for k in keys if k[0] == "step"))
        if config.compilation == "eager":
            self.warm_up_report = warm_up(plan)  # marks every runner's executables as started
        if multihost.multi_process():
            multihost.Channel.warm_up(self.runner.max_payload_words())
        if self.kv_events is not None:  # last: nothing to close if the engine fails to start
            self.kv_events_publisher = make_publisher(kv_events_config, config.data_parallel_rank)

    def _plan(self, verify_logits: str) -> ShapePlan:
        c = self.config
        return ShapePlan(c.max_num_seqs, c.max_num_batched_tokens, self.verify_width, verify_logits)

    def warm_up_plan(self) -> list:
        """(executables, keys) of every runner: what warm-up compiles."""
        plan = [(self.runner.executables, self.runner.plan_keys())]
        return plan + (self.proposer.warm_up_plan() if self.proposer is not None else [])

    def _make_grammar_backend(self):
        """(GrammarBackend, None), or (None, why structured outputs are unavailable)."""
        choice = self.structured_config.backend
        if choice == "disabled":
            return None, "structured outputs are disabled (structured_outputs_config backend 'disabled')"
        if self.tokenizer is None:
            why = "structured outputs need the model's tokenizer (tokenizer.json), and this model has none"
        else:
            from jaxinfer.structured.backend import GrammarBackend

            try:
                return GrammarBackend.for_tokenizer(self.tokenizer, self.model_config.vocab_size, self.eos_token_ids,
                                                    whitespace_pattern=self.structured_config.whitespace_pattern), None
            except ImportError as exc:
                why = str(exc)
        if choice == "guidance":
            raise ValueError(f"structured_outputs_config backend 'guidance': {why}")
        return None, why

    def _executable_cache(self) -> ExecutableCache | None:
        c = self.config
        if not (c.enable_compilation_cache and cache_enabled_by_env()):
            return None
        return ExecutableCache(c.compilation_cache_dir or default_cache_dir())

    def _make_speculator(self, spec: SpeculativeConfig, options: RunnerOptions) -> Speculator:
        if spec.method == "ngram":
            proposer = NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
        else:
            proposer = DraftModelProposer.load(spec, self.model_config, self.tokenizer, dtype=self.dtype,
                                               seed=self.config.seed, plan=self._plan("last"), options=options,
                                               cache=self._cache)
        controller = SpecController(spec.num_speculative_tokens, adaptive=spec.adaptive)
        return Speculator(proposer, controller, self.scheduler, self.max_model_len)

    @property
    def proposer(self):
        """The speculative proposer (a ``spec_decode.proposer.Proposer``), or None without speculation."""
        return self.speculator.proposer if self.speculator is not None else None

    @property
    def spec_controller(self) -> SpecController | None:
        return self.speculator.controller if self.speculator is not None else None

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

    # ------------------------------------------------------------- validation
    def process_prompt(self, prompt: Any) -> tuple[str | None, list[int]]:
        """Turn a prompt (str, {"prompt": str} or {"prompt_token_ids": [...]}) into (text, ids), validated."""
        return request_io.process_prompt(prompt, self._limits)

    def validate_request(self, prompt: Any, params: SamplingParams) -> tuple[str | None, list[int]]:
        """(text, ids) of a request that can run, or ValueError saying why not (nothing is queued)."""
        text, ids = request_io.validate_request(prompt, params, self._limits)
        if params.structured_outputs is not None:
            self._compile_grammar(params)
        return text, ids

    def _compile_grammar(self, params: SamplingParams) -> str:
        """The request's compiled constraint (cached by the backend); ValueError if it cannot be served."""
        if self.grammar_backend is None:
            raise ValueError(f"structured_outputs: {self._no_grammar_reason}")
        return self.grammar_backend.compile(params.structured_outputs)

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
        if request_id in self.output_processor.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not isinstance(priority, int):
            raise ValueError(f"priority must be an int, got {priority!r}")
        text, ids = self.validate_request(prompt, params)
        arrival = time.monotonic() if arrival_time is None else arrival_time
        seqs = []
        prompt_logprobs = {} if params.prompt_logprobs is not None else None  # shared by the n sequences
        grammar = self._compile_grammar(params) if params.structured_outputs is not None else None
        if grammar is not None and self.speculator is not None and not self._told_spec_skips_constrained:
            self._told_spec_skips_constrained = True
            logger.info("speculative decoding: constrained requests (structured_outputs) decode without draft "
                        "tokens; the others keep speculating")
        for i in range(params.n):
            if params.seed is not None:
                seed = (params.seed * 1_000_003 + i) % 2**32
            else:
                seed = int(self._seed_rng.integers(0, 2**32))
            seq = Sequence(next(self._seq_ids), request_id, i, ids, params, seed, arrival, priority, cache_salt)
            seq.prompt_logprobs = prompt_logprobs
            if grammar is not None:
                seq.grammar = self.grammar_backend.matcher(grammar)
            if self.tokenizer is not None:
                seq.detokenizer = IncrementalDetokenizer(
                    self.tokenizer, ids, skip_special_tokens=params.skip_special_tokens
                )
            seqs.append(seq)
        self.output_processor.add(
            request_io.EngineRequest(request_id, text, ids, params, seqs, RequestMetrics(arrival)))

    def abort_request(self, request_ids: str | Iterable[str]) -> None:
        self.output_processor.abort([request_ids] if isinstance(request_ids, str) else request_ids)

    def has_unfinished_requests(self) -> bool:
        return bool(self.output_processor.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.output_processor.requests)

    # --------------------------------------------------------------------- step
    def step(self) -> list[RequestOutput]:
        """One step: schedule -> execute (verifying any speculative tokens) -> update; then, under speculation,
        propose for the next step. Returns the outputs of the requests that emitted tokens in this step."""
        with CompileWatch() as watch:
            self._watch = watch
            outputs = self.stepper.step() if self.stepper is not None else self._step()
        if watch.names:
            self._compile_events += len(watch.names)
            self.num_compilations_after_start += len(watch.names)
            unplanned = len(watch.names) - self._new_unplanned_compilations()
            if unplanned > 0 and self.config.compilation == "eager":
                warnings.warn(f"jaxinfer: a step compiled {watch.names} after start (an operation outside the "
                              "compiled plan; please report it)", RuntimeWarning, stacklevel=2)
        if self.kv_events:  # a recorder holding events (empty or None: nothing to do)
            self._publish_kv_events()
        return outputs

    def _publish_kv_events(self) -> None:
        """Publish what the prefix cache stored / evicted / cleared since the last batch (one batch, if any)."""
        events = self.kv_events.take()
        if events:
            self.kv_events_publisher.publish(KVEventBatch(time.time(), tuple(events), self.config.data_parallel_rank))
            self.num_kv_event_batches += 1
            self.num_kv_events += len(events)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix block (vLLM's name: after new weights, or between benchmark runs); with
        KV-cache events on, subscribers get ``AllBlocksCleared``. False (nothing changes) while any request
        holds KV blocks: call it when the engine is idle."""
        done = self.block_manager.reset_prefix_cache()
        if self.kv_events:
            self._publish_kv_events()
        return done

    @property
    def num_steps(self) -> int:
        """Steps launched so far."""
        return self.host_times.steps

    def _new_unplanned_compilations(self) -> int:
        """Compilations of plan-keyed executables since the last call (each already warned about)."""
        total = sum(len(r.executables.compiled_after_start) for r in self._runners())
        new, self._unplanned_seen = total - self._unplanned_seen, total
        return new

    def _step(self) -> list[RequestOutput]:
        times, clock = self.host_times, time.perf_counter
        t0 = clock()
        plan = self.scheduler.schedule()
        t1 = clock()
        times.schedule += t1 - t0
        if plan.is_empty:
            return []
        result = self._execute(plan.scheduled)
        t2 = clock()
        outputs = self.output_processor.update(plan.scheduled, result.tokens, time.monotonic(),
                                               prompt_logprobs=result.prompt_logprobs)
        times.prepare += t2 - t1
        times.update += clock() - t2
        times.steps += 1
        if self.speculator is not None:
            self.speculator.after_step(plan.scheduled, result.tokens, self._compile_events + len(self._watch.names))
        return outputs

    def _execute(self, scheduled: list):
        """Run the scheduled work on the device: a ``runner.model_runner.StepOutput`` (seq_id -> the tokens each
        sequence emits, and the prompt logprobs it computed)."""
        num_steps = burst_length(scheduled, self.config.num_scheduler_steps, self.max_model_len,
                                 self.block_manager)
        if num_steps > 1:
            return self.runner.execute_multistep(scheduled, num_steps)
        proposer = self.proposer
        return self.runner.execute(scheduled, draft_q_for=proposer.q_for if proposer is not None else None)

    def _runners(self) -> list:
        return [self.runner] + (self.proposer.runners() if self.proposer is not None else [])

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
        """Stop publishing KV-cache events (``close_kv_events``); on process 0 of a multi-process engine, release
        the followers (no-op with one process)."""
        self.close_kv_events()
        if self.is_leader:
            self.runner.channel.stop()

    def close_kv_events(self) -> None:
        """Send the KV-cache event batches still queued and close the publisher's sockets (idempotent); the
        block manager records no more events."""
        publisher = self.kv_events_publisher
        if publisher is None:
            return
        if self.kv_events:
            self._publish_kv_events()
        self.kv_events_publisher = self.kv_events = self.block_manager.events = None
        publisher.close()

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
            "num_draft_tokens": self.speculator.num_draft_tokens if self.speculator else 0,
            "num_accepted_tokens": self.speculator.num_accepted_tokens if self.speculator else 0,
            "num_compilations": sum(r.num_compilations for r in runners),  # compiled or loaded from disk
            "num_compilations_after_start": self.num_compilations_after_start,
            "num_executables_from_cache": sum(r.executables.num_loaded for r in runners),
            "compilation": self.config.compilation,
            "num_steps": self.host_times.steps,
            "async_scheduling": self.async_scheduling,
            "host_seconds": self.host_times.as_dict(),  # per phase (jaxinfer.core.async_step.HostTimes)
            "num_forced_tokens": self.output_processor.num_forced_tokens,  # structured outputs' jump-forward
            # host time computing token masks, and how many (structured outputs)
            "structured_mask_seconds": self.grammar_backend.mask_time.seconds if self.grammar_backend else 0.0,
            "structured_masks": self.grammar_backend.mask_time.rows if self.grammar_backend else 0,
            "speculation_arms": self.spec_controller.summary() if self.spec_controller is not None else {},
            "quantization": self.quantization,  # what was quantized, weight bytes before / after
            "kv_events": self._kv_events_stats(),
        }

    def _kv_events_stats(self) -> dict[str, Any]:
        """KV-cache events: batches handed to the publisher, events recorded, and the publisher's own counts."""
        publisher = self.kv_events_publisher
        return {"enabled": publisher is not None, "batches_published": self.num_kv_event_batches,
                "events_published": self.num_kv_events, **(publisher.stats() if publisher is not None else {})}
