"""The child process of ``gpu-compile``: compiles each case for each target and writes one JSON line per result.

Started by ``bench.gpu_compile.cli`` with ``deviceless.compile_environment`` (so the CUDA plugin stays off
the GPU it does not have and ptxas's report is logged); run by hand the same way::

    python -m bench.gpu_compile.worker --targets a100 h200 --groups attention --output results.jsonl
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

from bench.gpu_compile import deviceless, targets


def select_cases(groups: list[str], quick: bool, layers: int | None, match: str | None = None):
    from bench.gpu_compile import engine_cases, kernel_cases, mosaic_cases

    builders = {"attention": kernel_cases.attention_cases, "matmul": kernel_cases.matmul_cases,
                "engine": lambda: engine_cases.engine_cases(layers), "mosaic": mosaic_cases.mosaic_cases,
                "oversized": kernel_cases.oversized_cases}
    cases = [c for g in groups for c in builders[g]()]
    if quick:
        cases = [c for c in cases if c.quick]
    if match:
        cases = [c for c in cases if match in c.name]
    return cases


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--targets", nargs="+", default=list(targets.DEFAULT_TARGETS))
    p.add_argument("--groups", nargs="+", default=["attention", "matmul", "engine", "mosaic"])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--match", default=None)
    p.add_argument("--output", required=True)
    args = p.parse_args(argv)
    cases = select_cases(args.groups, args.quick, args.layers, args.match)
    compilers: dict = {}
    with open(args.output, "a") as out:
        for name in args.targets:
            target = targets.target(name)
            for i, case in enumerate(cases):
                key = (name, case.num_devices)
                if key not in compilers:
                    compilers[key] = deviceless.TargetCompiler(target, case.num_devices)
                compiler = compilers[key]
                result = compiler.compile(functools.partial(case.build, compiler))
                row = {"target": name, "sm": target.sm, "group": case.group, "case": case.name, **result.to_json()}
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(f"[{name} {i + 1}/{len(cases)}] {case.name}: {result.status} ({result.seconds:.1f} s)",
                      file=sys.stdout, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
