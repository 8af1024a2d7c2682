"""``jaxinfer-bench gpu-compile``: every GPU kernel and the engine's 7B executables compiled to machine code for
A100 (sm_80) and H100/H200 (sm_90) on a machine without a GPU, with registers, spills and shared memory.

Needs ``pip install -e ".[gpu-compile]"`` (jax's CUDA plugin without the CUDA libraries, and ptxas; Python 3.12
for jax >= 0.11). The compiles run in a child process (``bench.gpu_compile.worker``) prepared by
``bench.gpu_compile.deviceless``. Each entry — a case (``kernel_cases``, ``engine_cases``, ``mosaic_cases``) on
a target (``targets``) — is one of

* ``ok``: compiled; no kernel spills registers, none is over 255 registers per thread or over the target's
  registers per block, and none asks for more shared memory than the target lets a block opt into;
* ``spills`` / ``over-limit``: compiled, but some kernel spills (ptxas's spill stores / loads) or is over a limit;
* ``refused``: the code declines the target by design, saying why (fp8 tensor cores on sm_80, Mosaic GPU
  below sm_90);
* ``failed``: XLA's compile failed (its message is kept: e.g. a tile over the shared-memory limit).

A table on stdout, the whole JSON (each kernel's registers, spill bytes, stack frame, threads, shared memory,
and the compile time) under ``--output``; the exit status is 1 if any entry failed, spilled or is over a limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import report
from bench.gpu_compile import deviceless, targets

PALLAS_KERNELS = ("ragged_paged_attention", "fp8_matmul", "w8a16_matmul", "fp8_block_matmul")
BAD = ("failed", "spills", "over-limit")


def verdict(row: dict, target: targets.GpuTarget) -> str:
    if row["status"] != "compiled":
        return row["status"]
    kernels = row["kernels"]
    if any(k["spill_store_bytes"] or k["spill_load_bytes"] for k in kernels):
        return "spills"
    for k in kernels:
        regs, threads, shared = k["registers"] or 0, k["threads_per_block"] or 0, k["shared_memory_bytes"] or 0
        if (regs > targets.MAX_REGISTERS_PER_THREAD or regs * threads > target.registers_per_block
                or shared > target.shared_memory_per_block_optin):
            return "over-limit"
    return "ok"


def summarize(row: dict, target: targets.GpuTarget) -> dict:
    """The figures of one entry's table row: its Pallas kernels' (or, without one, all kernels') worst."""
    kernels = row["kernels"]
    focus = [k for k in kernels if k["name"].startswith(PALLAS_KERNELS)] or kernels
    return {
        "verdict": verdict(row, target),
        "kernels": len(kernels),
        "registers": max((k["registers"] or 0 for k in focus), default=None),
        "spill_bytes": sum(k["spill_store_bytes"] + k["spill_load_bytes"] for k in kernels),
        "shared_memory_bytes": max((k["shared_memory_bytes"] or 0 for k in focus), default=None),
        "shared_memory_limit": target.shared_memory_per_block_optin,
    }


def print_rows(rows: list[dict], title: str) -> None:
    header = ["target", "group", "case", "verdict", "kernels", "max regs", "spill B", "smem KiB / limit", "s"]
    body = []
    for r in rows:
        s = r["summary"]
        smem = ("" if s["shared_memory_bytes"] is None or r["status"] != "compiled"
                else f"{s['shared_memory_bytes'] / 1024:.0f} / {s['shared_memory_limit'] / 1024:.0f}")
        note = "" if s["verdict"] in ("ok", "spills", "over-limit") else f"  ({(r['message'] or '').splitlines()[0][:70]})"
        body.append([r["sm"], r["group"], r["case"] + note, s["verdict"], s["kernels"] or "",
                     s["registers"] if r["status"] == "compiled" else "", s["spill_bytes"] or "", smem,
                     f"{r['seconds']:.1f}"])
    report.print_table(title, header, body)


def run_worker(worker_args: list[str], log=sys.stdout) -> list[dict]:
    """Compile in a child process prepared for deviceless compiles; its JSON lines, in order."""
    with tempfile.TemporaryDirectory(prefix="jaxinfer-gpu-compile-") as tmp:
        out = Path(tmp) / "rows.jsonl"
        dump = Path(tmp) / "xla_dump"
        dump.mkdir()
        env = deviceless.compile_environment(str(dump))
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "-m", "bench.gpu_compile.worker", *worker_args, "--output", str(out)]
        child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        tail: list[str] = []
        for line in child.stdout:
            if line.startswith("["):
                print(line.rstrip(), file=log, flush=True)
            else:
                tail = (tail + [line.rstrip()])[-40:]
        rc = child.wait()
        rows = [json.loads(ln) for ln in out.read_text().splitlines()] if out.exists() else []
        if rc != 0:
            raise RuntimeError(f"gpu-compile worker exited with {rc}:\n" + "\n".join(tail))
        return rows


def run(args) -> dict:
    missing = deviceless.tools_missing()
    if missing:
        print(f"gpu-compile: {missing}", file=sys.stderr)
        raise SystemExit(2)
    worker_args = ["--targets", *args.targets, "--groups", *args.groups]
    if args.quick:
        worker_args.append("--quick")
    if args.layers is not None:
        worker_args += ["--layers", str(args.layers)]
    if args.match:
        worker_args += ["--match", args.match]
    start = time.perf_counter()
    rows = run_worker(worker_args)
    by_name = {t.name: t for t in targets.all_targets()}
    for r in rows:
        r["summary"] = summarize(r, by_name[r["target"]])
    counts: dict[str, dict[str, int]] = {}
    for r in rows:
        c = counts.setdefault(r["sm"], {})
        c[r["summary"]["verdict"]] = c.get(r["summary"]["verdict"], 0) + 1
    import jax

    payload = {"experiment": "gpu-compile", "date": time.strftime("%Y-%m-%d"), "jax": jax.__version__,
               "python": sys.version.split()[0], "targets": args.targets, "groups": args.groups,
               "quick": args.quick, "layers": args.layers, "seconds": round(time.perf_counter() - start, 1),
               "counts": counts, "results": rows}
    print_rows(rows, f"gpu-compile, jax {jax.__version__}: verdict per case and target")
    for sm, c in counts.items():
        print(f"{sm}: " + ", ".join(f"{v} {k}" for k, v in sorted(c.items())))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(payload, indent=1) + "\n")
    if any(r["summary"]["verdict"] in BAD for r in rows):
        bad = [f"{r['sm']} {r['case']}: {r['summary']['verdict']}" for r in rows if r["summary"]["verdict"] in BAD]
        print("gpu-compile: " + "; ".join(bad), file=sys.stderr)
        raise SystemExit(1)
    return payload


def add_arguments(p) -> None:
    p.add_argument("--targets", nargs="+", default=list(targets.DEFAULT_TARGETS),
                   choices=[t.name for t in targets.all_targets()],
                   help="GPUs to compile for (a100: sm_80; h100, h200: sm_90)")
    p.add_argument("--groups", nargs="+", default=["attention", "matmul", "engine", "mosaic"],
                   choices=["attention", "matmul", "engine", "mosaic", "oversized"],
                   help="what to compile (oversized: a tile past every GPU's shared memory, which must fail)")
    p.add_argument("--quick", action="store_true", help="a few cases of each group (the test suite's)")
    p.add_argument("--layers", type=int, default=None,
                   help="compile the engine's models cut to their first N layers (default: all layers)")
    p.add_argument("--match", default=None, help="only the cases whose name contains this text")
    p.add_argument("--output", default=None, help="write the JSON here")
