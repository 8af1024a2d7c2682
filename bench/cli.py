"""``jaxinfer-bench``: one subcommand per experiment. With no subcommand it runs ``latency`` on the
embedded default model."""

from __future__ import annotations

import argparse
import sys

from bench import registry

EXPERIMENTS = {name: registry.load(name) for name in registry.EXPERIMENTS}  # name -> module, in --help order


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="jaxinfer-bench", description=__doc__)
    sub = parser.add_subparsers(dest="experiment")
    for name, module in EXPERIMENTS.items():
        p = sub.add_parser(name, help=(module.__doc__ or "").strip().splitlines()[0])
        module.add_arguments(p)
    if not argv or argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        argv = ["latency", *argv]
    args = parser.parse_args(argv)
    EXPERIMENTS[args.experiment].run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
