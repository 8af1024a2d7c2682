"""Compile a jitted function to GPU machine code on a machine without a GPU, and read what ptxas reported.

Needs the CUDA plugin without the CUDA libraries and ptxas (``pip install -e ".[gpu-compile]"``: jax's
``cuda12-local`` extra and ``nvidia-cuda-nvcc-cu12``), and a process started with ``compile_environment()``
(the plugin must not try to open a GPU, and XLA's ptxas report is a log line that has to be switched on
before jaxlib loads), which is why ``gpu-compile`` runs its compiles in a child process.

For a target (``targets.GpuTarget``) a compile-only topology gives devices that exist only for the compiler;
arguments are placed on them as abstract arrays, the function is lowered for CUDA under an abstract mesh
whose device kind is the target's (that is how Pallas's Triton lowering, and ``pallas_kernels.gpu_target``,
learn the compute capability) and compiled by XLA's whole GPU pipeline: Pallas kernels, fusions, ptxas.
The ptxas report arrives on file descriptor 2, captured around each compile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.gpu_compile import ptxas_log
from bench.gpu_compile.targets import GpuTarget

_STDERR_FD = 2


def tools_missing() -> str | None:
    """Why a deviceless compile cannot run in this environment, or None if it can."""
    plugins = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")  # the cuda12 extra here; the device has 13
    if importlib.util.find_spec("jax_plugins") is None or not any(importlib.util.find_spec(p) for p in plugins):
        return "the CUDA plugin is not installed (pip install -e '.[gpu-compile]': jax[cuda12-local] and ptxas)"
    if _ptxas() is None:
        return "ptxas is not installed (pip install nvidia-cuda-nvcc-cu12)"
    return None


def _ptxas() -> str | None:
    spec = importlib.util.find_spec("nvidia") and importlib.util.find_spec("nvidia.cuda_nvcc")
    for root in (spec.submodule_search_locations or []) if spec else []:
        if (Path(root) / "bin" / "ptxas").exists():
            return str(Path(root) / "bin" / "ptxas")
    return shutil.which("ptxas")


def compile_environment(dump_dir: str, base: dict | None = None) -> dict:
    """The environment of a process that compiles deviceless: CPU as jax's platform (the CUDA plugin's own
    start would fail without a driver), ptxas's report logged, ptxas run as a program (its library form
    reports nothing), and XLA's dumps (the launch table) under ``dump_dir``."""
    env = dict(os.environ if base is None else base)
    flags = env.get("XLA_FLAGS", "")
    env.update({
        "JAX_PLATFORMS": "cpu",
        "TF_CPP_MIN_LOG_LEVEL": "0",
        "TF_CPP_VMODULE": "subprocess_compilation=2",
        "XLA_FLAGS": f"{flags} --xla_gpu_enable_libnvptxcompiler=false --xla_dump_to={dump_dir}".strip(),
        "PYTHONWARNINGS": "ignore:The Pallas Triton backend is deprecated",
    })
    return env


@dataclasses.dataclass
class CompileResult:
    """One function compiled for one target."""

    status: str  # "compiled" | "refused" (the code declines this target by design) | "failed"
    seconds: float
    message: str | None = None
    kernels: list[ptxas_log.KernelResources] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        return {"status": self.status, "seconds": round(self.seconds, 3), "message": self.message,
                "kernels": [k.to_json() for k in self.kernels]}


@contextlib.contextmanager
def _captured_stderr():
    """Everything written to file descriptor 2 inside the block (C++ logging included), as text."""
    sys.stderr.flush()
    saved = os.dup(_STDERR_FD)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), _STDERR_FD)
        box: list[str] = []
        try:
            yield box
        finally:
            sys.stderr.flush()
            os.dup2(saved, _STDERR_FD)
            os.close(saved)
            tmp.seek(0)
            box.append(tmp.read().decode("utf-8", "replace"))


class TargetCompiler:
    """Compiles for one target in this (prepared) process: its compile-only devices and abstract mesh."""

    def __init__(self, target: GpuTarget, num_devices: int = 1):
        import jax
        from jax.experimental import topologies

        jax.devices()  # the CUDA plugin registers its compiler (and Triton) when the backends start
        self.target = target
        topology = f"1x{num_devices}x1"
        self.devices = topologies.get_topology_desc(platform="cuda", target_config=target.config_text,
                                                    topology=topology).devices
        self._mesh = None
        self.dump_dir = Path(os.environ.get("XLA_FLAGS", "").split("--xla_dump_to=")[-1].split()[0])

    def mesh(self, tensor_parallel_size: int):
        """The engine's (expert, tensor) mesh over this target's compile-only devices; the abstract mesh of
        the compiles that follow takes its shape."""
        from sharding.mesh import make_mesh

        self._mesh = make_mesh(tensor_parallel_size, 1, devices=self.devices)
        return self._mesh

    def abstract_mesh(self):
        import jax

        try:
            from jax.sharding import AbstractDevice
        except ImportError:  # jax 0.10
            from jax._src.mesh import AbstractDevice
        device = AbstractDevice(self.target.device_kind, self.target.core_count, "gpu")
        if self._mesh is None:
            return jax.sharding.AbstractMesh((1,), ("gpu",), abstract_device=device)
        return jax.sharding.AbstractMesh(tuple(self._mesh.axis_sizes), tuple(self._mesh.axis_names),
                                         axis_types=tuple(self._mesh.axis_types), abstract_device=device)

    def place(self, tree, sharding=None):
        """Abstract arguments on this target's first device (or ``sharding``), shapes and dtypes kept."""
        import jax

        where = sharding or jax.sharding.SingleDeviceSharding(self.devices[0])
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=where), tree)

    def compile(self, build) -> CompileResult:
        """``build()`` -> (jitted function, abstract args, static kwargs), traced and compiled for the target.
        ``NotImplementedError`` while building or tracing is a refusal by design (e.g. fp8 on sm_80)."""
        import jax

        for stale in self.dump_dir.glob("*"):
            stale.unlink()
        start = time.perf_counter()
        with _captured_stderr() as log:
            try:
                self._mesh = None
                fn, args, statics = build()  # may call mesh(): the abstract mesh then takes its shape
                with jax.sharding.use_abstract_mesh(self.abstract_mesh()):
                    traced = fn.trace(*args, **statics)
                    traced.lower(lowering_platforms=("cuda",)).compile()
            except NotImplementedError as e:
                status, message = "refused", str(e)
            except Exception as e:  # noqa: BLE001 -- XLA's own message says what failed (shared memory, ...)
                status, message = "failed", f"{type(e).__name__}: {e}"
            else:
                status, message = "compiled", None
        seconds = time.perf_counter() - start
        launches = {}
        for f in self.dump_dir.glob("*thunk_sequence*"):
            launches.update(ptxas_log.parse_launches(f.read_text(errors="replace")))
        kernels = ptxas_log.merge(ptxas_log.parse_ptxas(log[0]), launches) if status == "compiled" else []
        if message is not None:
            message = _first_lines(message)
        return CompileResult(status, seconds, message, kernels)


def _first_lines(text: str, n: int = 6) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("-----")]
    return "\n".join(lines[:n])
