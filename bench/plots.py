"""PNG plots of the serving benchmarks (matplotlib, Agg backend: no display needed).

Every function takes the per-run summaries the benchmarks produce (label -> summary dict with ``requests``
and ``occupancy``) and a directory, writes one file, and returns its path.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _cdf(ax, values, label: str) -> None:
    v = np.sort(np.asarray(values, dtype=np.float64))
    if v.size == 0:
        return
    ax.step(v, np.arange(1, v.size + 1) / v.size, where="post", label=label)


def latency_cdf(runs: dict[str, dict], path: str | Path, metrics=(("e2e_s", "end-to-end latency"),
                                                                  ("ttft_s", "time to first token"))) -> Path:
    """One panel per metric: the empirical CDF over requests, one line per run."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 4), squeeze=False)
    for ax, (key, title) in zip(axes[0], metrics):
        for label, run in runs.items():
            _cdf(ax, [r[key] for r in run["requests"]], label)
        ax.set_title(title)
        ax.set_xlabel("seconds")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def occupancy(runs: dict[str, dict], path: str | Path) -> Path:
    """Sequences in each step's batch (solid) and requests queued (dashed) over time, one panel per run.

    A sample is taken when its step returns, so its value holds over the step that ended there."""
    plt = _pyplot()
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.6 * len(runs)), squeeze=False, sharex=True)
    for ax, (label, run) in zip(axes[:, 0], runs.items()):
        t = [s["time_s"] for s in run["occupancy"]]
        ax.step(t, [s["num_running"] for s in run["occupancy"]], where="pre", label="running (batch)")
        ax.step(t, [s["num_waiting"] for s in run["occupancy"]], where="pre", linestyle="--", label="waiting")
        arrivals = [r["arrival_s"] for r in run["requests"]]
        ax.plot(arrivals, np.zeros(len(arrivals)), "|", color="k", markersize=10, label="arrivals")
        ax.set_title(f"{label}: mean batch {run['mean_batch_occupancy']:.1f}")
        ax.set_ylabel("sequences")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the first arrival")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def serving_plots(runs: dict[str, dict], out_dir: str | Path, prefix: str) -> dict[str, str]:
    """The latency CDF and the occupancy timeline of a set of runs, as ``{name: path}``."""
    out = Path(out_dir)
    return {
        "latency_cdf": str(latency_cdf(runs, out / f"{prefix}_latency_cdf.png")),
        "occupancy": str(occupancy(runs, out / f"{prefix}_occupancy.png")),
    }
