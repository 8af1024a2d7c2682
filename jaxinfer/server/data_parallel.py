"""``jaxinfer serve --data-parallel-size N``: N engine replicas, each its own process on its own devices, behind
SMG (the Shepherd Model Gateway, PyPI ``smg``), which is the one endpoint clients see.

* Devices: on a GPU machine each replica gets ``--devices-per-replica`` GPUs (default: the tensor-parallel
  size) through ``CUDA_VISIBLE_DEVICES``; on a CPU each gets a disjoint set of cores (default: the cores this
  process may run on, split evenly) through its CPU affinity, which XLA's thread pool and the C++ kernels
  size themselves from.
* Start-up: the replicas start together on free loopback ports (``--data-parallel-rank`` i each, so their
  KV-event ports differ); each opens its port only once warm (nothing compiles after start). Then the router
  starts on ``--host``/``--port`` and the launcher waits until it reports every replica healthy.
* A replica that dies is reported and restarted on its port after a backoff (1 s, doubling to 30 s; reset
  once it has served for a minute). The router's health checks take it out of rotation meanwhile and put it
  back when it is healthy again. If the router dies, everything stops (exit status 1).
* SIGTERM / SIGINT: the router drains first (in-flight requests finish, up to ``--graceful-shutdown-timeout``),
  then each replica drains and exits; the launcher exits 0 when all of them did.
* ``--worker-urls URL ...``: only the router, in front of replicas started elsewhere (other hosts).

The launcher never initializes a JAX backend: it must not take the devices its replicas are given.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

logger = logging.getLogger("jaxinfer.server.dp")

ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "random", "least_load", "consistent_hashing",
                   "prefix_hash")
INSTALL_HINT = "pip install 'jaxinfer[router]'  (SMG, the Shepherd Model Gateway: PyPI smg)"
# `jaxinfer serve` options of the launcher, not passed on to the replicas
LAUNCHER_DESTS = ("data_parallel_size", "devices_per_replica", "router_policy", "router_args", "worker_urls",
                  "replica_startup_timeout", "host", "port", "data_parallel_rank")
# SMG's defaults check a worker's health once a minute and retry a worker that is not up yet every 30 s; a
# launcher that restarts replicas wants them seen (out and back in) within seconds. Later --router-args win.
ROUTER_DEFAULTS = ("--health-check-interval-secs", "1", "--health-failure-threshold", "2",
                   "--health-success-threshold", "1", "--worker-startup-check-interval", "1")
BACKOFF_FIRST_S, BACKOFF_MAX_S, BACKOFF_RESET_AFTER_S = 1.0, 30.0, 60.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data parallel (several replicas behind the SMG router)")
    g.add_argument("--data-parallel-size", type=int, default=1,
                   help="engine replicas, each its own process on its own devices, behind one router endpoint")
    g.add_argument("--devices-per-replica", type=int, default=None,
                   help="GPUs per replica (default: the tensor-parallel size); on a CPU, cores per replica "
                        "(default: the cores split evenly)")
    g.add_argument("--router-policy", default="cache_aware", choices=ROUTER_POLICIES,
                   help="SMG's routing policy (default cache_aware: requests sharing a prefix go to one replica)")
    g.add_argument("--router-args", default="", metavar="'FLAGS'",
                   help="more `smg launch` flags, one string (e.g. \"--cache-threshold 0.5\")")
    g.add_argument("--worker-urls", nargs="+", default=None, metavar="URL",
                   help="start only the router, in front of replicas started elsewhere")
    g.add_argument("--replica-startup-timeout", type=float, default=1800.0,
                   help="seconds a replica (or the router) may take to become healthy")


def uses_router(args: argparse.Namespace) -> bool:
    return args.data_parallel_size > 1 or bool(args.worker_urls)


# ------------------------------------------------------------------------------------------------ the plan
@dataclasses.dataclass(frozen=True)
class ReplicaPlan:
    rank: int
    port: int
    cpus: tuple[int, ...] | None = None  # CPU affinity (replicas on a CPU)
    cuda_visible_devices: str | None = None  # replicas on GPUs

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def visible_gpus() -> list[str]:
    """GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else what ``nvidia-smi -L`` lists."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d for d in env.split(",") if d.strip() and d.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i in range(sum(line.startswith("GPU ") for line in out.splitlines()))]


def plan_replicas(n: int, ports: list[int], *, devices_per_replica: int | None, tensor_parallel_size: int,
                  gpus: list[str], cpus: list[int]) -> list[ReplicaPlan]:
    """Which devices each of ``n`` replicas gets: GPUs when there are any, else CPU cores."""
    if n < 1:
        raise ValueError(f"--data-parallel-size must be >= 1, got {n}")
    if gpus:
        per = devices_per_replica or tensor_parallel_size
        if per * n > len(gpus):
            raise ValueError(f"{n} replicas x {per} GPUs need {per * n} GPUs; {len(gpus)} are visible")
        return [ReplicaPlan(r, ports[r], cuda_visible_devices=",".join(gpus[r * per:(r + 1) * per]))
                for r in range(n)]
    per = devices_per_replica or len(cpus) // n
    if per < 1 or per * n > len(cpus):
        raise ValueError(f"{n} replicas need at least {n} CPU cores ({per or 1} each); this process may use "
                         f"{len(cpus)}: {cpus}")
    return [ReplicaPlan(r, ports[r], cpus=tuple(cpus[r * per:(r + 1) * per])) for r in range(n)]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (held open together while chosen so they differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def replica_argv(parser: argparse.ArgumentParser, args: argparse.Namespace, plan: ReplicaPlan) -> list[str]:
    """The ``jaxinfer serve`` command line of one replica: the launcher's own options that differ from their
    defaults (the launcher's and the port's excepted), then its loopback port and rank."""
    argv = [sys.executable, "-m", "jaxinfer.cli", "serve"]
    if args.model is not None:
        argv.append(args.model)
    for action in parser._actions:  # noqa: SLF001 - argparse has no public list of actions
        if not action.option_strings or action.dest in LAUNCHER_DESTS or action.dest in ("help", "model"):
            continue
        value = getattr(args, action.dest, None)
        if value is None or value == action.default:
            continue
        flag = next(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse.BooleanOptionalAction):
            argv.append(flag if value else "--no-" + flag[2:])
        elif isinstance(action, argparse._StoreTrueAction):  # noqa: SLF001
            argv.append(flag)
        elif isinstance(value, dict):
            argv += [flag, json.dumps(value)]
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv + ["--host", "127.0.0.1", "--port", str(plan.port), "--data-parallel-rank", str(plan.rank)]


def find_smg() -> str:
    """The ``smg`` executable: next to this interpreter (its venv), else on PATH."""
    here = Path(sys.executable).parent / "smg"
    if here.exists():
        return str(here)
    found = shutil.which("smg")
    if found is None:
        raise SystemExit(f"--data-parallel-size > 1 and --worker-urls need the SMG router, which is not "
                         f"installed: {INSTALL_HINT}")
    return found


def router_argv(smg: str, host: str, port: int, worker_urls: list[str], policy: str, extra: str,
                graceful_s: float) -> list[str]:
    return [smg, "launch", "--host", host, "--port", str(port), "--worker-urls", *worker_urls,
            "--policy", policy, "--shutdown-grace-period-secs", str(int(max(1, graceful_s))),
            *ROUTER_DEFAULTS, *shlex.split(extra)]


# ------------------------------------------------------------------------------------------- processes
def _pump(stream, prefix: str) -> None:
    """Copy a child's output to our stderr, each line prefixed with the child's name."""
    for line in iter(stream.readline, b""):
        sys.stderr.write(prefix + line.decode(errors="replace"))
        sys.stderr.flush()


class Child:
    """One supervised process (a replica or the router) with its restart backoff."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None,
                 cpus: tuple[int, ...] | None = None):
        self.name, self.argv, self.env, self.cpus = name, argv, env, cpus
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.backoff_s = BACKOFF_FIRST_S
        self.restart_at: float | None = None
        self.num_restarts = 0

    def start(self) -> None:
        cpus = self.cpus
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        threading.Thread(target=_pump, args=(self.proc.stdout, f"[{self.name}] "), daemon=True).start()
        self.started_at = time.monotonic()
        self.restart_at = None

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout_s: float) -> int:
        """Exit status after at most ``timeout_s`` (then SIGKILL: -9)."""
        if self.proc is None:
            return 0
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            logger.error("%s did not exit within %.0f s: killing it", self.name, timeout_s)
            self.proc.kill()
            self.proc.wait()
            return -9


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def router_ready(router_url: str, num_workers: int) -> bool:
    """True once SMG's ``GET /readiness`` reports all ``num_workers`` workers healthy (it answers 503 until one is,
    then ``{"status": "ready", "healthy_workers": H, "total_workers": T}``)."""
    try:
        with urllib.request.urlopen(router_url + "/readiness", timeout=5) as r:
            body = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return body.get("status") == "ready" and body.get("healthy_workers", 0) >= num_workers


class Launcher:
    """Starts and supervises the replicas and the router of one ``jaxinfer serve --data-parallel-size N``."""

    def __init__(self, parser: argparse.ArgumentParser, args: argparse.Namespace):
        self.args = args
        self.stop = threading.Event()
        self.replicas: list[tuple[ReplicaPlan, Child]] = []
        smg = find_smg()
        if args.worker_urls:
            if args.data_parallel_size > 1:
                raise SystemExit("--worker-urls starts only the router: drop --data-parallel-size (the replicas "
                                 "run elsewhere) or drop --worker-urls")
            urls = list(args.worker_urls)
        else:
            gpus = visible_gpus()
            plans = plan_replicas(args.data_parallel_size, free_ports(args.data_parallel_size),
                                  devices_per_replica=args.devices_per_replica,
                                  tensor_parallel_size=args.tensor_parallel_size or 1, gpus=gpus,
                                  cpus=sorted(os.sched_getaffinity(0)))
            for plan in plans:
                env = dict(os.environ)
                if plan.cuda_visible_devices is not None:
                    env["CUDA_VISIBLE_DEVICES"] = plan.cuda_visible_devices
                self.replicas.append((plan, Child(f"replica {plan.rank}", replica_argv(parser, args, plan), env,
                                                  plan.cpus)))
            urls = [plan.url for plan, _ in self.replicas]
        self.worker_urls = urls
        self.router_url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::', '') else args.host}:{args.port}"
        self.router = Child("router", router_argv(smg, args.host, args.port, urls, args.router_policy,
                                                  args.router_args, args.graceful_shutdown_timeout))

    # ------------------------------------------------------------------ start-up
    def _wait(self, what: str, ready, children: list[Child]) -> bool:
        deadline = time.monotonic() + self.args.replica_startup_timeout
        while not self.stop.is_set():
            if ready():
                return True
            dead = [c for c in children if c.exited() is not None]
            if dead:
                logger.error("%s exited with status %s during start-up", dead[0].name, dead[0].exited())
                return False
            if time.monotonic() > deadline:
                logger.error("%s not ready after %.0f s", what, self.args.replica_startup_timeout)
                return False
            time.sleep(0.5)
        return False

    def start(self) -> bool:
        t0 = time.monotonic()
        for plan, child in self.replicas:
            child.start()
            where = f"cores {list(plan.cpus)}" if plan.cpus else f"CUDA_VISIBLE_DEVICES={plan.cuda_visible_devices}"
            logger.info("replica %d (pid %d): %s, port %d, %s", plan.rank, child.proc.pid, plan.url, plan.port, where)
        children = [c for _, c in self.replicas]
        if not self._wait("the replicas", lambda: all(http_ok(p.url + "/health") for p, _ in self.replicas),
                          children):
            return False
        if self.replicas:
            logger.info("%d replicas warm after %.1f s", len(self.replicas), time.monotonic() - t0)
        self.router.start()
        logger.info("router (pid %d): %s, policy %s, in front of %s", self.router.proc.pid, self.router_url,
                    self.args.router_policy, " ".join(self.worker_urls))
        if not self._wait("the router", lambda: router_ready(self.router_url, len(self.worker_urls)),
                          [self.router, *children]):
            return False
        logger.info("serving on %s: the router reports all %d replicas healthy (%.1f s after start)",
                    self.router_url, len(self.worker_urls), time.monotonic() - t0)
        return True

    # ---------------------------------------------------------------- supervision
    def supervise_once(self, now: float) -> bool:
        """One look at every process; False when the router is gone (serving cannot go on)."""
        if self.router.exited() is not None:
            logger.error("the router exited with status %s: stopping the replicas", self.router.exited())
            return False
        for plan, child in self.replicas:
            code = child.exited()
            if code is None:
                if now - child.started_at > BACKOFF_RESET_AFTER_S:
                    child.backoff_s = BACKOFF_FIRST_S
                continue
            if child.restart_at is None:
                child.restart_at = now + child.backoff_s
                logger.error("replica %d (pid %d) exited with status %s; restarting it in %.0f s", plan.rank,
                             child.proc.pid, code, child.backoff_s)
                child.backoff_s = min(BACKOFF_MAX_S, child.backoff_s * 2)
            elif now >= child.restart_at:
                child.num_restarts += 1
                child.start()
                logger.info("replica %d restarted (pid %d, restart %d)", plan.rank, child.proc.pid,
                            child.num_restarts)
        return True

    def shutdown(self) -> int:
        """Drain the router, then the replicas; 0 when every one exited cleanly."""
        grace = self.args.graceful_shutdown_timeout + 30
        self.router.terminate()
        status = [self.router.wait(grace)]
        for _, child in self.replicas:
            child.terminate()
        status += [child.wait(grace) for _, child in self.replicas]
        logger.info("stopped: exit statuses router %s, replicas %s", status[0], status[1:])
        return 0 if all(s == 0 for s in status) else 1

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: self.stop.set())
        ok = False
        try:
            ok = self.start()
            while ok and not self.stop.is_set():
                ok = self.supervise_once(time.monotonic())
                self.stop.wait(0.5)
        finally:
            code = self.shutdown()
        return code if ok or self.stop.is_set() else 1


def serve_data_parallel(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return Launcher(parser, args).run()
