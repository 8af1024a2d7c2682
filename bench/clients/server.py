"""``jaxinfer serve`` as a user starts it: a subprocess on a free port, waited for until ``/health`` answers
200, stopped with SIGTERM (what the server treats as a graceful shutdown), its log kept in a file."""

from __future__ import annotations

import dataclasses
import json
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, api_key: str | None = None, timeout: float = 10.0) -> dict:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


@dataclasses.dataclass
class Served:
    """A running server: its base URL (no ``/v1``), the model name it serves, its context length."""

    url: str
    model: str
    max_model_len: int
    command: list[str]
    start_s: float
    log_path: Path
    api_key: str | None = None
    proc: subprocess.Popen | None = None

    @property
    def shown_command(self) -> str:
        return shlex.join(["jaxinfer", *self.command[3:]])  # python -m jaxinfer.cli serve ... -> jaxinfer serve ...

    def stop(self, timeout_s: float = 60.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


def start(serve_args: list[str], log_path: Path, api_key: str | None = None, timeout_s: float = 900.0) -> Served:
    """``python -m jaxinfer.cli serve SERVE_ARGS --host 127.0.0.1 --port P``; returns once ``/health`` is 200."""
    port = free_port()
    cmd = [sys.executable, "-m", "jaxinfer.cli", "serve", *serve_args, "--host", "127.0.0.1", "--port", str(port),
           *(["--api-key", api_key] if api_key else [])]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, log_path, timeout_s)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise
    start_s = time.monotonic() - t0
    card = get_json(url + "/v1/models", api_key)["data"][0]
    return Served(url, card["id"], int(card["max_model_len"]), cmd, start_s, log_path, api_key, proc)


def wait_healthy(url: str, proc: subprocess.Popen, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"jaxinfer serve exited with status {proc.returncode} before /health answered: "
                               + " | ".join(tail))
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s:.0f} s (log: {log_path})")
