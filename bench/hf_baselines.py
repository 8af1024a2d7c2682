"""HF transformers as a speed baseline: eager PyTorch, and ``torch.compile`` with a static KV cache.

Each class is a *runner* of ``jaxinfer-bench compare`` (see ``bench.compare``): built in its own process
from an HF checkpoint dir, it greedily generates ``n`` tokens for a ``[B, L]`` array of prompt ids and
returns the wall time, the tokens and (on request) each token's logprob under the raw model distribution.
EOS is switched off in the generation config, so every call generates exactly ``n`` tokens.

``hf-compile`` is transformers' own recipe: ``cache_implementation="static"`` plus a ``CompileConfig``,
which makes ``generate`` run the prefill eagerly and every decode step through ``torch.compile``
(inductor). transformers only compiles on accelerators unless told otherwise
(``CompileConfig._compile_all_devices``); the runner sets it, and refuses to report numbers unless dynamo
actually compiled a graph, so a row labelled ``hf-compile`` never measures the eager path.
"""

from __future__ import annotations

import importlib.util
import time

import numpy as np


class HFEagerRunner:
    """transformers ``generate`` in eager PyTorch (``settings["dtype"]``, float32 by default; the default SDPA
    attention, dynamic cache)."""

    name = "hf-eager"
    max_batch_size = None  # any batch

    @staticmethod
    def unavailable_reason(settings: dict) -> str | None:
        for module in ("torch", "transformers"):
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed (pip install -e '.[torch]')"
        if settings.get("platform", "cpu") != "cpu":
            import torch

            if not torch.cuda.is_available():
                return (f"jaxinfer runs on {settings['platform']} but torch {torch.__version__} has no CUDA device "
                        "(the pinned wheel is the CPU build): timing HF on the CPU would compare machines, not engines")
        return None

    def __init__(self, checkpoint: str, settings: dict):
        import torch
        import transformers

        self.device = "cpu" if settings.get("platform", "cpu") == "cpu" else "cuda"
        dtype = getattr(torch, settings.get("dtype", "float32"))
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            checkpoint, local_files_only=True, dtype=dtype).to(self.device).eval()
        self.model.generation_config.eos_token_id = None  # exactly n tokens, as jaxinfer's ignore_eos
        self._torch = torch

    def _generate_kwargs(self) -> dict:
        return {}

    def generate(self, prompts: np.ndarray, n: int, logprobs: bool) -> dict:
        torch = self._torch
        ids = torch.tensor(prompts, device=self.device)
        kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                      pad_token_id=0, return_dict_in_generate=True, output_logits=logprobs, **self._generate_kwargs())
        if self.device != "cpu":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(ids, **kwargs)
        if self.device != "cpu":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t
        tokens = out.sequences[:, prompts.shape[1]:].cpu().numpy()
        result = {"seconds": seconds, "tokens": tokens, "logprobs": None}
        if logprobs:
            logits = torch.stack(out.logits, dim=1).float()  # [B, n, V], raw (before any logits processor)
            lp = torch.log_softmax(logits, dim=-1).gather(-1, out.sequences[:, prompts.shape[1]:, None])[..., 0]
            result["logprobs"] = lp.cpu().numpy()
        return result

    def info(self) -> dict:
        import transformers

        torch = self._torch
        return {"torch_version": torch.__version__, "transformers_version": transformers.__version__,
                "torch_threads": torch.get_num_threads(), "device": self.device,
                "attn_implementation": self.model.config._attn_implementation, "dtype": str(self.model.dtype)}

    def stats(self) -> dict:
        return {}


class HFCompileRunner(HFEagerRunner):
    """transformers ``generate`` with a static KV cache and the decode step through ``torch.compile``."""

    name = "hf-compile"

    def __init__(self, checkpoint: str, settings: dict):
        super().__init__(checkpoint, settings)
        from transformers import CompileConfig

        # dynamic=False: one graph per batch size, each reused when the timed rounds interleave batch sizes.
        self.compile_config = CompileConfig(fullgraph=True, dynamic=False, mode="default",
                                            backend=settings.get("torch_compile_backend", "inductor"))
        self.compile_config._compile_all_devices = True  # transformers compiles only on accelerators otherwise
        self._graphs_at_start = self.stats()["dynamo_unique_graphs"]

    def _generate_kwargs(self) -> dict:
        return {"cache_implementation": "static", "compile_config": self.compile_config}

    def generate(self, prompts: np.ndarray, n: int, logprobs: bool) -> dict:
        result = super().generate(prompts, n, logprobs)
        if n > 1 and self.stats()["dynamo_unique_graphs"] == self._graphs_at_start:
            raise RuntimeError("torch.compile did not engage (dynamo compiled no graph): transformers ran the "
                               "decode eagerly, so this would not be a compiled baseline")
        return result

    def info(self) -> dict:
        return dict(super().info(), cache_implementation="static", compile_config=self.compile_config.to_dict())

    def stats(self) -> dict:
        from torch._dynamo.utils import counters

        return {"dynamo_unique_graphs": int(counters["stats"]["unique_graphs"]),
                "dynamo_frames_ok": int(counters["frames"]["ok"])}
