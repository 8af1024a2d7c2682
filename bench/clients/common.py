"""What every client check reports (``ClientResult``), and finding and running a client's command.

A result is ``ok`` or ``failed`` with the first line of the error that explains it (``first_error_line``
picks it out of a client's output: an HTTP status line before a traceback's last line), plus the client's
name, version and the command that ran, and a few key numbers (scores, latencies, counts).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

OK, FAILED, SKIPPED = "ok", "failed", "skipped"


@dataclasses.dataclass
class ClientResult:
    client: str  # the client, e.g. "openai", "lm-eval", "aiperf"
    check: str  # what was exercised, e.g. "chat", "jaxinfer_arith (generate_until)"
    version: str | None
    command: str
    result: str = OK  # ok | failed | skipped
    error: str | None = None  # failed / skipped: the first line that says why
    numbers: dict = dataclasses.field(default_factory=dict)
    seconds: float | None = None
    pending: str | None = None  # the server feature this check waits for, when it is still being built

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def package_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def tool_command(flag_value: str | None, module: str, executable: str) -> list[str] | None:
    """The command that runs a client's CLI: ``flag_value`` if given (split like a shell), else ``python -m
    MODULE`` when this interpreter has it, else ``EXECUTABLE`` next to this interpreter or on PATH; None
    when there is none."""
    if flag_value:
        return shlex.split(flag_value)
    if importlib.util.find_spec(module) is not None:
        return [sys.executable, "-m", module]
    beside = Path(sys.executable).with_name(executable)
    if beside.exists():
        return [str(beside)]
    found = shutil.which(executable)
    return [found] if found else None


def tool_version(cmd: list[str], dist: str) -> str | None:
    """The version of distribution ``dist`` in the environment that ``cmd`` runs in."""
    python = cmd[0] if cmd[1:2] == ["-m"] else _python_of(cmd[0])
    if python is None:
        return None
    try:
        out = subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _python_of(executable: str) -> str | None:
    """The interpreter of a console script (its ``#!`` line), or a ``python`` beside it."""
    path = Path(executable)
    try:
        first = path.read_bytes()[:256].split(b"\n", 1)[0].decode()
    except OSError:
        return None
    if first.startswith("#!") and "python" in first:
        return first[2:].strip().split()[0]
    beside = path.with_name("python")
    return str(beside) if beside.exists() else None


_HTTP_ERROR = re.compile(r"(Status code: ?\d{3}.*|Error code: \d{3}.*|HTTP \d{3}.*|\b[45]\d\d (Client|Server) Error.*)")
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit)|AssertionError|KeyError)(:.*)?$")


def first_error_line(text: str, limit: int = 300) -> str:
    """The line of a client's output that says why it failed: the first HTTP error status it reports, else
    the last exception line of a traceback, else the first line naming an error, else the last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in lines:
        m = _HTTP_ERROR.search(ln)
        if m:
            return clip(m.group(0), limit)
    for ln in reversed(lines):
        if _EXCEPTION.match(ln):
            return clip(ln, limit)
    for ln in lines:
        if re.search(r"\berror\b", ln, re.IGNORECASE):
            return clip(ln, limit)
    return clip(lines[-1], limit) if lines else "(no output)"


def clip(line: str, limit: int = 300) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."


@dataclasses.dataclass
class Completed:
    returncode: int
    output: str  # stdout and stderr together
    seconds: float
    timed_out: bool = False


def run_command(cmd: list[str], *, cwd: str | Path | None = None, env: dict | None = None,
                timeout_s: float = 900.0, log_path: Path | None = None) -> Completed:
    """Runs ``cmd`` to the end (or its timeout), its output kept (and written to ``log_path``)."""
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, errors="replace", timeout=timeout_s)
        done = Completed(proc.returncode, proc.stdout, time.monotonic() - t0)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        done = Completed(124, out + f"\nTimeoutError: did not finish within {timeout_s:.0f} s", time.monotonic() - t0,
                         timed_out=True)
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(f"$ {shlex.join(cmd)}\n{done.output}")
    return done


def shown(cmd: list[str]) -> str:
    """A command as a user would type it: ``python -m X`` for this interpreter, console scripts by name."""
    if cmd[:1] == [sys.executable]:
        cmd = ["python", *cmd[1:]]
    elif cmd and os.path.isabs(cmd[0]):
        cmd = [os.path.basename(cmd[0]), *cmd[1:]]
    return shlex.join(cmd)
