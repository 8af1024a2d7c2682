"""A Mosaic GPU probe: two small Hopper matmul kernels written for Pallas's Mosaic GPU backend, compiled
for a GPU on a machine that has none.

Why: our kernels (``pallas_kernels/``) use Pallas's Triton backend, deprecated from jax 0.11. A port to
Mosaic GPU (``jax.experimental.pallas.mosaic_gpu``) means writing by hand what Triton did for us: TMA
copies into shared memory, mbarriers, a multi-buffered K loop, ``wgmma`` with a register accumulator.
This module holds the smallest kernels that use all of those - a bf16 matmul and the W8A8 e4m3 form of
``pallas_kernels.fp8_matmul`` - and compiles them for a shipped target (``bench/gpu_compile/targets``,
through the same ``TargetCompiler`` as ``gpu-compile``), so a jax upgrade shows at once whether the pieces a port needs
still lower, and what ptxas makes of them (registers, spills), without a GPU.

The kernel: ``out[M, N] = a[M, K] @ b[K, N]`` with a float32 accumulator, bf16 out. One CUDA block (one
warpgroup, 128 threads) per ``block_m x block_n`` output tile, grid ``(M / block_m, N / block_n)``. The
K loop keeps ``stages`` shared-memory slots for the A and B tiles (128-byte swizzled, as wgmma wants);
slot ``s`` has one mbarrier that both TMA copies arrive on. Step ``k`` waits for its slot, issues
``wgmma`` on it, and refills the slot the previous step read (after ``wgmma_wait(1)`` only step ``k``'s
wgmma may still be reading) with step ``k + stages - 1``. The epilogue (fp8: times the per-row and
per-column scales) casts the accumulator to bf16, stores it to shared memory and TMA-copies it out.
Lowering semantics are set explicitly (Warpgroup by default): jax changed the default from Lane (0.10)
to Warpgroup (0.11).

Seen in jax 0.12 (the source and these compiles): Mosaic GPU is reached only through ``plgpu.kernel``
(``pl.pallas_call`` on a GPU lowers to Triton; with Mosaic GPU compiler params it finds no rule). Its
kernels are compiled to PTX and by ptxas inside XLA's compile (the ``mosaic_gpu_v2`` custom call), so a
deviceless ``.compile()`` runs the whole pipeline, and ``MOSAIC_GPU_DUMP_PTXAS`` / ``MOSAIC_GPU_DUMP_PTX``
print ptxas's report and the PTX to the process's stdout (``MOSAIC_GPU_DUMP_TO=DIR`` writes them, and
every MLIR pass, as files). Mosaic picks its instruction set from the device: deviceless, it sees none
and assumes sm_90 whatever the target says, so for an sm_80 target LLVM aborts the process.
``compile_deviceless`` therefore compiles in a child process (with ``JAX_PLATFORMS=cpu``, which the CUDA
plugin needs on a machine without a GPU) and parses its output.

    python -m bench.gpu_compile.mosaic_probe [--target h100] [--fp8]  # compile (default: H100), print JSON
    python -m bench.gpu_compile.mosaic_probe --interpret [--fp8]     # run in GPU interpret mode on the CPU
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULT_MARKER = "MOSAIC_PROBE_RESULT "
DEFAULT_SHAPE = (256, 256, 512)  # M, N, K: a 2 x 2 grid of tiles, 8 K steps
INTERPRET_SHAPE = (128, 256, 256)  # 1 x 2 tiles, 4 K steps (bf16): small, for the interpreter

def _error_text(e: BaseException, limit: int = 2000) -> str:
    text = f"{type(e).__name__}: {str(e).strip()}"
    return text if len(text) <= limit else f"{text[:limit // 4]} [...] {text[-3 * limit // 4:]}"


def _kernel_entry(plgpu):
    """``plgpu.kernel`` spelled its output / scratch arguments ``out_shape`` / ``scratch_shapes`` before
    jax 0.10 and ``out_type`` / ``scratch_types`` since: return keyword names that work here."""
    params = inspect.signature(plgpu.kernel).parameters
    if "out_type" in params:
        return "out_type", "scratch_types"
    return "out_shape", "scratch_shapes"


def mosaic_probe_case(m: int = DEFAULT_SHAPE[0], n: int = DEFAULT_SHAPE[1], k: int = DEFAULT_SHAPE[2], *,
                      fp8: bool = False, block_m: int = 128, block_n: int = 128, block_k: int | None = None,
                      stages: int = 3, semantics: str = "Warpgroup", interpret=None):
    """``(fn, arg_shape_dtypes, description)`` for the kernel of the module docstring.

    ``fp8=False``: ``fn(a [M, K] bf16, b [K, N] bf16) -> [M, N] bf16``. ``fp8=True``: the W8A8 form of
    ``pallas_kernels.fp8_matmul``, ``fn(x_q [M, K] e4m3, w_q [N, K] e4m3, x_scale [M] f32, w_scale [N]
    f32) -> (x_q @ w_q.T) * x_scale[:, None] * w_scale[None, :]`` in bf16: the weight tile is loaded K-major
    as stored and handed to wgmma transposed (8-bit wgmma wants both operands K-major), and the scales
    multiply the float32 accumulator in registers before the bf16 store. ``block_k`` (default: 128 bytes of
    a row, 64 bf16 or 128 e4m3 elements, the 128-byte swizzle); wgmma wants ``block_m % 64 == 0``,
    ``block_n % 8 == 0``, ``block_n <= 256``. ``interpret``: an ``InterpretGPUParams`` to run on the CPU."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu

    in_dtype = jnp.dtype(jnp.float8_e4m3fn if fp8 else jnp.bfloat16)
    out_dtype = jnp.dtype(jnp.bfloat16)
    swizzle = 128
    block_k = swizzle // in_dtype.itemsize if block_k is None else block_k
    if m % block_m or n % block_n or k % block_k:
        raise ValueError(f"({m}, {n}, {k}) is not a multiple of the tile ({block_m}, {block_n}, {block_k})")
    num_steps = k // block_k
    if not 2 <= stages <= num_steps + 1:
        raise ValueError(f"stages={stages} needs 2 <= stages <= K steps + 1 = {num_steps + 1}")
    if block_m % 64 or block_n % 8 or block_n > 256:
        raise ValueError("wgmma needs block_m % 64 == 0, block_n % 8 == 0 and block_n <= 256")

    def smem(shape, dtype):
        # rows of 8 x (128 bytes), 128-byte swizzled: the shared-memory form wgmma and TMA agree on
        return plgpu.SMEM(shape, dtype, transforms=(plgpu.TilingTransform((8, swizzle // dtype.itemsize)),
                                                    plgpu.SwizzleTransform(swizzle)))

    def body(a_gmem, b_gmem, *refs):
        if fp8:
            a_scale_gmem, b_scale_gmem, out_gmem, a_tiles, b_tiles, out_tile, loaded = refs
        else:
            out_gmem, a_tiles, b_tiles, out_tile, loaded = refs
        row = jax.lax.axis_index("m") * block_m
        col = jax.lax.axis_index("n") * block_n

        def start_load(step, slot):  # two TMA copies, one barrier: it completes when both have landed
            kk = pl.ds(step * block_k, block_k)
            plgpu.copy_gmem_to_smem(a_gmem.at[pl.ds(row, block_m), kk], a_tiles.at[slot], loaded.at[slot])
            b_src = b_gmem.at[pl.ds(col, block_n), kk] if fp8 else b_gmem.at[kk, pl.ds(col, block_n)]
            plgpu.copy_gmem_to_smem(b_src, b_tiles.at[slot], loaded.at[slot])

        for step in range(stages - 1):  # prologue: the first stages - 1 slots in flight
            start_load(step, step)

        def k_loop(acc):
            def k_step(step, carry):
                slot = jax.lax.rem(step, stages)
                plgpu.barrier_wait(loaded.at[slot])
                b_tile = b_tiles.at[slot].T if fp8 else b_tiles.at[slot]  # [N, K] tile read as [K, N]
                plgpu.wgmma(acc, a_tiles.at[slot], b_tile)
                plgpu.wgmma_wait(1)  # the previous step's wgmma is done: its slot may be refilled
                ahead = step + stages - 1

                @pl.when(ahead < num_steps)
                def _():
                    start_load(ahead, jax.lax.rem(ahead, stages))
                return carry

            jax.lax.fori_loop(0, num_steps, k_step, None)
            return acc[...]  # reading the accumulator waits for the last wgmma

        result = pl.run_scoped(k_loop, plgpu.ACC((block_m, block_n), jnp.float32))
        if fp8:  # the epilogue: per-token and per-channel scales on the float32 accumulator
            result = (result * a_scale_gmem[pl.ds(row, block_m)][:, None]
                      * b_scale_gmem[pl.ds(col, block_n)][None, :])
        out_tile[...] = result.astype(out_dtype)
        plgpu.commit_smem()  # make the stores visible to the TMA engine
        plgpu.copy_smem_to_gmem(out_tile, out_gmem.at[pl.ds(row, block_m), pl.ds(col, block_n)])
        plgpu.wait_smem_to_gmem(0)

    body.__name__ = "fp8_matmul_probe" if fp8 else "bf16_matmul_probe"  # the kernel's name in ptxas's log
    b_tile_shape = (stages, block_n, block_k) if fp8 else (stages, block_k, block_n)
    out_kw, scratch_kw = _kernel_entry(plgpu)
    kwargs = {out_kw: jax.ShapeDtypeStruct((m, n), out_dtype),
              scratch_kw: [smem((stages, block_m, block_k), in_dtype), smem(b_tile_shape, in_dtype),
                           smem((block_m, block_n), out_dtype),
                           plgpu.Barrier(num_arrivals=2, num_barriers=stages)]}
    if interpret is not None:
        kwargs["interpret"] = interpret
    fn = plgpu.kernel(body, grid=(m // block_m, n // block_n), grid_names=("m", "n"),
                      compiler_params=plgpu.CompilerParams(
                          lowering_semantics=getattr(plgpu.LoweringSemantics, semantics)),
                      **kwargs)
    if fp8:
        args = (jax.ShapeDtypeStruct((m, k), in_dtype), jax.ShapeDtypeStruct((n, k), in_dtype),
                jax.ShapeDtypeStruct((m,), jnp.float32), jax.ShapeDtypeStruct((n,), jnp.float32))
        what = f"W8A8 e4m3 matmul [{m},{k}]@[{n},{k}].T with per-row / per-column scales in the epilogue"
    else:
        args = (jax.ShapeDtypeStruct((m, k), in_dtype), jax.ShapeDtypeStruct((k, n), in_dtype))
        what = f"bf16 matmul [{m},{k}]@[{k},{n}]"
    description = (f"Mosaic GPU {what}: {block_m}x{block_n} tiles, block_k {block_k}, {stages}-slot TMA "
                   f"pipeline with mbarriers, wgmma into a float32 register accumulator, TMA store; "
                   f"{semantics} lowering semantics")
    return fn, args, description


def reference(*args):
    """What ``mosaic_probe_case``'s ``fn`` computes, in plain jnp (two arguments: bf16; four: fp8)."""
    import jax.numpy as jnp
    if len(args) == 2:
        a, b = args
        return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
    x_q, w_q, x_scale, w_scale = args
    acc = jnp.dot(x_q.astype(jnp.float32), w_q.astype(jnp.float32).T)
    return (acc * x_scale[:, None] * w_scale[None, :]).astype(jnp.bfloat16)


# ----------------------------------------------------------------------------------------------
# Deviceless compile
# ----------------------------------------------------------------------------------------------


def _compile_here(target_name: str, fp8: bool = False, semantics: str = "Warpgroup") -> dict:
    """Compile the probe in this process (started with ``deviceless.compile_environment``) for the shipped
    target ``target_name``, through the same ``TargetCompiler`` as ``gpu-compile``. Returns what
    ``compile_deviceless`` returns, less what only stdout shows."""
    import jax

    from bench.gpu_compile import targets
    from bench.gpu_compile.deviceless import TargetCompiler

    result = {"compiled": False, "seconds": None, "error": None, "jax": jax.__version__}
    try:
        compiler = TargetCompiler(targets.target(target_name))
        fn, args, description = mosaic_probe_case(fp8=fp8, semantics=semantics)
        result["description"] = description
        compiled = compiler.compile(lambda: (jax.jit(fn), compiler.place(args), {}))
        result.update(compiled=compiled.status == "compiled", seconds=round(compiled.seconds, 3),
                      error=compiled.message)
    except Exception as e:  # noqa: BLE001 - reported, not raised: the caller wants to know what failed
        result["error"] = _error_text(e)
    return result


def parse_mosaic_dump(text: str) -> dict:
    """Numbers from ptxas's report and the PTX that Mosaic GPU prints (MOSAIC_GPU_DUMP_PTXAS / _PTX)."""
    stats = {}
    patterns = {"ptxas_registers": r"ptxas info\s*: Used (\d+) registers",
                "ptxas_spill_stores": r"(\d+) bytes spill stores",
                "ptxas_spill_loads": r"(\d+) bytes spill loads",
                "ptxas_stack_frame_bytes": r"(\d+) bytes stack frame"}
    for key, pattern in patterns.items():
        found = re.search(pattern, text)
        if found:
            stats[key] = int(found.group(1))
    found = re.search(r"Compiling entry function '([^']+)' for '([^']+)'", text)
    if found:
        stats["kernel_name"], stats["ptxas_target"] = found.group(1), found.group(2)
    found = re.search(r"^\.maxntid (\d+)", text, re.MULTILINE)
    if found:
        stats["threads_per_block"] = int(found.group(1))
    stats["ptx_wgmma"] = len(re.findall(r"\bwgmma\.mma_async\.\S+", text))
    stats["ptx_tma_loads"] = len(re.findall(r"cp\.async\.bulk\.tensor\.\S+\.shared::cta\.global", text))
    stats["ptx_tma_stores"] = len(re.findall(r"cp\.async\.bulk\.tensor\.\S+\.global\.shared::cta", text))
    shapes = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+\.\S+?)\s", text)))
    if shapes:
        stats["ptx_wgmma_shapes"] = shapes
    return stats


def _run_child(args: list[str], env_extra: dict, python: str | None, timeout: float):
    """Run ``python -m bench.gpu_compile.mosaic_probe ARGS --child`` on the CPU platform: (the dict it
    reported or None, its stdout and stderr, a line on how it ended, wall seconds)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.update(env_extra)
    env.pop("MOSAIC_GPU_DUMP_TO", None)  # keep Mosaic's dumps on stdout, where they are parsed
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    start = time.perf_counter()
    try:
        proc = subprocess.run([python or sys.executable, "-m", "bench.gpu_compile.mosaic_probe", *args, "--child"],
                              env=env, cwd=root, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, "", "", f"timed out after {timeout} s", round(time.perf_counter() - start, 3)
    wall = round(time.perf_counter() - start, 3)
    payload = [line[len(RESULT_MARKER):] for line in proc.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    output = [line for line in (proc.stderr or proc.stdout).splitlines()
              if line.strip() and not re.match(r"[IWEF]\d{4} ", line)]  # XLA's log lines: not the cause
    tail = "\n".join(output[-5:])
    ended = f"child exited {proc.returncode}: {tail}"
    return (json.loads(payload[-1]) if payload else None), proc.stdout, proc.stderr, ended, wall


def compile_deviceless(target: str = "h100", *, fp8: bool = False, semantics: str = "Warpgroup",
                       python: str | None = None, timeout: float = 300.0) -> dict:
    """Compile the probe for the shipped GPU target ``target`` (a100, h100, h200), in a child process.

    Returns ``{"compiled": bool, "seconds": float (trace + lower + compile, in the child), "error": str
    or None, "wall_seconds": float (the whole child: interpreter start and jax import included),
    "ptxas_registers", "ptxas_spill_stores", "ptxas_spill_loads", "ptxas_target", "threads_per_block",
    "ptx_wgmma", "ptx_tma_loads", "ptx_tma_stores", ...}`` (the ptxas / PTX keys when Mosaic printed
    them). A compile that LLVM aborts (e.g. sm_90 instructions for an sm_80 target) comes back as
    ``compiled: False`` with LLVM's message."""
    from bench.gpu_compile.deviceless import compile_environment

    with tempfile.TemporaryDirectory(prefix="mosaic-probe-") as dump_dir:
        # MOSAIC_GPU_DUMP_*: ptxas's report and the PTX on stdout
        env = dict(compile_environment(dump_dir), MOSAIC_GPU_DUMP_PTXAS="1", MOSAIC_GPU_DUMP_PTX="1")
        args = ["--target", target, "--semantics", semantics] + (["--fp8"] if fp8 else [])
        result, stdout, _, ended, wall = _run_child(args, env, python, timeout)
    if result is None:  # the child died before reporting
        result = {"compiled": False, "seconds": None, "error": ended}
    result["wall_seconds"] = wall
    result.update(parse_mosaic_dump(stdout))
    return result


# ----------------------------------------------------------------------------------------------
# GPU interpret mode (CPU)
# ----------------------------------------------------------------------------------------------


def run_interpret(shape=INTERPRET_SHAPE, *, fp8: bool = False, seed: int = 0) -> dict:
    """Run the probe under Mosaic GPU's interpret mode on the CPU (this process) against ``reference``."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental.pallas import mosaic_gpu as plgpu

    params = getattr(plgpu, "InterpretGPUParams", None)
    if params is None:  # private before jax 0.12
        from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams as params
    m, n, k = shape
    steps = k // (128 if fp8 else 64)
    fn, arg_types, description = mosaic_probe_case(m, n, k, fp8=fp8, stages=min(3, steps + 1),
                                                    interpret=params())
    keys = jax.random.split(jax.random.key(seed), len(arg_types))
    args = [jax.random.normal(key, t.shape, jnp.float32).astype(t.dtype) if t.ndim == 2
            else jax.random.uniform(key, t.shape, jnp.float32, 0.5, 1.5) for key, t in zip(keys, arg_types)]
    start = time.perf_counter()
    out = np.asarray(jax.block_until_ready(fn(*args)), np.float32)
    seconds = time.perf_counter() - start
    want = np.asarray(reference(*args), np.float32)
    err = float(np.max(np.abs(out - want)))
    scale = float(np.max(np.abs(want)))
    # both sides round a float32 result to bf16 (8 bits of mantissa): allow a few of its ulps
    return {"description": description, "seconds": round(seconds, 3), "max_abs_error": err,
            "max_abs_reference": scale, "ok": bool(err <= 2 ** -6 * scale), "jax": jax.__version__}


def interpret_check(shape=INTERPRET_SHAPE, *, fp8: bool = False, python: str | None = None,
                    timeout: float = 600.0) -> dict:
    """``run_interpret`` in a child process on the CPU platform; ``{"ok": False, "error": ...}`` if the
    child fails."""
    args = ["--interpret", "--shape", ",".join(map(str, shape))] + (["--fp8"] if fp8 else [])
    result, _, _, ended, wall = _run_child(args, {}, python, timeout)
    result = {"ok": False, "error": ended} if result is None else result
    result["wall_seconds"] = wall
    return result


def main(argv=None) -> int:
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="h100", help="a shipped GPU target: a100, h100, h200")
    parser.add_argument("--fp8", action="store_true", help="the W8A8 e4m3 kernel instead of bf16")
    parser.add_argument("--semantics", default="Warpgroup", choices=("Warpgroup", "Lane"))
    parser.add_argument("--interpret", action="store_true", help="run in GPU interpret mode instead")
    parser.add_argument("--shape", default=",".join(map(str, INTERPRET_SHAPE)), help="M,N,K (--interpret)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.interpret:
        shape = tuple(int(v) for v in opts.shape.split(","))
        if opts.child:
            try:
                result = run_interpret(shape, fp8=opts.fp8)
            except Exception as e:  # noqa: BLE001 - reported to the parent
                result = {"ok": False, "error": _error_text(e)}
            print(RESULT_MARKER + json.dumps(result), flush=True)
        else:
            result = interpret_check(shape, fp8=opts.fp8)
            print(json.dumps(result, indent=1))
        return 0 if result["ok"] else 1
    if opts.child:  # compile here and report on one marked line
        result = _compile_here(opts.target, opts.fp8, opts.semantics)
        sys.stdout.flush()
        print(RESULT_MARKER + json.dumps(result), flush=True)
        return 0 if result["compiled"] else 1
    result = compile_deviceless(opts.target, fp8=opts.fp8, semantics=opts.semantics)
    print(json.dumps(result, indent=1))
    return 0 if result["compiled"] else 1


if __name__ == "__main__":
    sys.exit(main())
