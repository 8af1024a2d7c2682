"""EngineConfig: every engine-level setting of ``LLM(...)``, frozen and validated in one place."""

from __future__ import annotations

import dataclasses
from typing import Any

# named by what runs (jaxinfer.model.attention.resolve_attention_backend): "pallas" the Pallas kernel, "xla" pure
# XLA (no C++ kernel anywhere), "cpu" the C++ kernels of jaxinfer.cpu.ffi; "auto": pallas on a GPU, cpu on a CPU
# where the kernels load, else xla
ATTENTION_BACKENDS = ("auto", "pallas", "xla", "cpu")
DTYPES = ("auto", "float32", "bfloat16", "float16")
COMPILATION_MODES = ("eager", "lazy")
QUANTIZATION_METHODS = (None, "fp8", "fp8_w8a16", "int8")  # jaxinfer.quantization.options does the rest of the checks
KV_CACHE_DTYPES = ("auto", "fp8")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # HF dir, orbax dir from `jaxinfer convert`, "random:<preset>", or None = default
    dtype: str = "auto"
    max_model_len: int | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None  # bound for the automatic num_kv_blocks
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    batching: str = "continuous"
    scheduling_policy: str = "fcfs"
    static_batch_timeout_s: float = 0.5
    attention_backend: str = "auto"
    # "eager": LLM(...) compiles every executable of the shape plan before it returns (jaxinfer.runner.shape_plan),
    # so nothing compiles while requests are served; "lazy": each executable compiles on first use.
    compilation: str = "eager"
    enable_compilation_cache: bool = True  # load / store compiled executables on disk (jaxinfer.runner.compile_cache)
    compilation_cache_dir: str | None = None  # None: $JAXINFER_CACHE_DIR or ~/.cache/jaxinfer
    tensor_parallel_size: int = 1
    enable_expert_parallel: bool = False
    # None: the checkpoint's own weights (a pre-quantized checkpoint loads quantized); "fp8" W8A8 e4m3,
    # "fp8_w8a16" e4m3 weights only, "int8" int8 weights only: quantized on load (jaxinfer.quantization.options)
    quantization: str | None = None
    kv_cache_dtype: str = "auto"  # "auto": the model dtype; "fp8": e4m3 K/V with per-layer scales
    speculative_config: dict[str, Any] | None = None
    # decode steps per engine step when every scheduled sequence decodes (jaxinfer.runner.multistep): > 1 runs them
    # in one compiled call, the host checking stop conditions once per call (tokens arrive in bursts)
    num_scheduler_steps: int = 1
    # schedule and pack the next step while the device runs the current one (jaxinfer.core.async_step; the
    # tokens are the same). None: on where the device is not the CPU (on a 2-core CPU the host and XLA share the
    # cores: synchronous measured faster), and never with speculative decoding or num_scheduler_steps > 1
    async_scheduling: bool | None = None
    # structured outputs (jaxinfer.config.structured): {"backend": "auto" | "guidance" | "disabled",
    # "jump_forward": True, "whitespace_pattern": None}; None = the defaults
    structured_outputs_config: dict[str, Any] | None = None
    # KV-cache events for cache-aware routers (jaxinfer.config.kv_events: vLLM's KVEventsConfig fields, e.g.
    # {"enable_kv_cache_events": True, "endpoint": "tcp://*:5557", "topic": "kv-events"}); None = off
    kv_events_config: dict[str, Any] | None = None
    # this replica's rank among data-parallel replicas: offsets the KV-events ports and stamps their batches
    data_parallel_rank: int = 0
    seed: int = 0

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {self.attention_backend!r}")
        if not isinstance(self.block_size, int) or self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size!r}")
        if self.compilation not in COMPILATION_MODES:
            raise ValueError(f"compilation must be one of {COMPILATION_MODES}, got {self.compilation!r}")
        for name in ("enable_prefix_caching", "enable_chunked_prefill", "enable_compilation_cache"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 1):
            raise ValueError(f"max_model_len must be a positive int, got {self.max_model_len!r}")
        if self.num_kv_blocks is not None and (not isinstance(self.num_kv_blocks, int) or self.num_kv_blocks < 2):
            raise ValueError(f"num_kv_blocks must be an int >= 2 (block 0 is reserved), got {self.num_kv_blocks!r}")
        if not isinstance(self.tensor_parallel_size, int) or isinstance(self.tensor_parallel_size, bool) \
                or self.tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be a positive int, got {self.tensor_parallel_size!r}")
        if not isinstance(self.enable_expert_parallel, bool):
            raise TypeError(f"enable_expert_parallel must be True or False, got {self.enable_expert_parallel!r}")
        if self.quantization not in QUANTIZATION_METHODS:
            raise ValueError(f"quantization must be one of {QUANTIZATION_METHODS}, got {self.quantization!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if not isinstance(self.num_scheduler_steps, int) or isinstance(self.num_scheduler_steps, bool) \
                or self.num_scheduler_steps < 1:
            raise ValueError(f"num_scheduler_steps must be a positive int, got {self.num_scheduler_steps!r}")
        if self.num_scheduler_steps > 1 and self.speculative_config is not None:
            raise ValueError("num_scheduler_steps > 1 cannot be combined with speculative decoding (speculation "
                             "already emits several tokens per step)")
        if self.num_scheduler_steps > 1 and self.tensor_parallel_size > 1:
            raise NotImplementedError("num_scheduler_steps > 1 with tensor_parallel_size > 1 is not supported yet")
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            raise TypeError(f"async_scheduling must be True, False or None, got {self.async_scheduling!r}")
        if self.async_scheduling and self.speculative_config is not None:
            raise ValueError("async_scheduling=True cannot be combined with speculative decoding yet (the drafts "
                             "of a step depend on the tokens of the step before)")
        if self.async_scheduling and self.num_scheduler_steps > 1:
            raise ValueError("async_scheduling=True cannot be combined with num_scheduler_steps > 1 (both hide the "
                             "host's work; choose one)")
        if not isinstance(self.data_parallel_rank, int) or isinstance(self.data_parallel_rank, bool) \
                or self.data_parallel_rank < 0:
            raise ValueError(f"data_parallel_rank must be an int >= 0, got {self.data_parallel_rank!r}")
        from jaxinfer.config.kv_events import KVEventsConfig
        from jaxinfer.config.structured import StructuredOutputsConfig

        KVEventsConfig.from_dict(self.kv_events_config)  # validate early
        StructuredOutputsConfig.from_dict(self.structured_outputs_config)  # validate early
        if self.speculative_config is not None:
            from jaxinfer.config.speculative import SpeculativeConfig

            SpeculativeConfig.from_dict(self.speculative_config)  # validate early
