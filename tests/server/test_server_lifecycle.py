"""The server when things go wrong or end: a step that raises (fault injection) kills the engine loudly
instead of hanging it; backpressure answers 503 with Retry-After while everyone else is served; SIGTERM
stops accepting, drains in-flight streams and exits 0. Each case needs its own server: kept minimal."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")
pytest.importorskip("fastapi")

from jaxinfer.server import launch  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--compilation", "lazy", "--max-model-len", "512"]


def _free_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


def test_step_that_raises_kills_the_engine_and_fails_requests_fast(caplog):
    parser = argparse.ArgumentParser()
    launch.add_arguments(parser)
    app, _ = launch.build(parser.parse_args([*SMALL, "--max-num-seqs", "1"]))
    engine = app.state.engine.engine
    real_step, calls = engine.step, []

    def broken_step():  # three good steps, then every step raises
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("injected fault")
        return real_step()

    engine.step = broken_step
    sock = _free_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive()
            time.sleep(0.05)
        assert httpx.get(url + "/health").status_code == 200
        body = {"prompt": "def f(x):", "max_tokens": 8}
        with caplog.at_level("ERROR", logger="jaxinfer.server"):  # in flight when the engine dies: an error event
            r = httpx.post(url + "/v1/completions", json={**body, "ignore_eos": True, "stream": True}, timeout=60)
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        assert r.status_code == 200 and 1 <= len(events) < 8 and r.text.rstrip().endswith("data: [DONE]")
        assert "injected fault" in events[-1]["error"]["message"] and events[-1]["error"]["code"] == "engine_dead"
        assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])
        tracebacks = [rec for rec in caplog.records if rec.exc_info and "injected fault" in str(rec.exc_info[1])]
        assert len(tracebacks) == 1  # logged once
        health = httpx.get(url + "/health")
        assert health.status_code == 503 and "injected fault" in health.json()["error"]["message"]
        for stream in (False, True):  # later requests fail at once, streamed or not
            r = httpx.post(url + "/v1/completions", json={**body, "stream": stream}, timeout=60)
            assert r.status_code == 500 and "dead" in r.json()["error"]["message"]
        r = httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                       timeout=60)
        assert r.status_code == 500
        assert "jaxinfer:engine_dead{model_name=\"jaxinfer-default\"} 1.0" in httpx.get(url + "/metrics").text
    finally:
        server.should_exit = True
        thread.join(30)


def _read_stream(resp, tokens: list, first: threading.Event):
    for line in resp.iter_lines():
        if line.startswith("data: {"):
            chunk = json.loads(line[6:])
            tokens.extend(chunk["choices"][0]["token_ids"] if chunk["choices"] else [])
            first.set()
        elif line == "data: [DONE]":
            tokens.append("DONE")


def _stream_in_thread(client, url, body):
    tokens, first = [], threading.Event()
    state = {}

    def run():
        with client.stream("POST", url + "/v1/completions", json=body, timeout=120) as resp:
            state["status"] = resp.status_code
            _read_stream(resp, tokens, first)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, tokens, first, state


def _waiting(url) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("jaxinfer:num_requests_waiting{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError("num_requests_waiting")


def test_backpressure_503_then_sigterm_drains_in_flight_and_exits_0(tmp_path):
    port = _free_socket().getsockname()[1]  # closed again: the server binds it
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jaxinfer.cli", "serve", "--port", str(port), *SMALL, "--max-num-seqs", "1",
         "--max-waiting-requests", "1", "--graceful-shutdown-timeout", "60", "--log-level", "warning"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    try:
        for _ in range(1200):
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        n = 300
        body = {"prompt": "def f(x):", "max_tokens": n, "temperature": 0.0, "ignore_eos": True, "stream": True,
                "return_token_ids": True}
        client = httpx.Client()
        a = _stream_in_thread(client, url, body)  # runs (max_num_seqs=1)
        assert a[2].wait(120)
        b = _stream_in_thread(client, url, {**body, "max_tokens": 20})  # waits behind it
        while _waiting(url) < 1:
            time.sleep(0.02)
        r = httpx.post(url + "/v1/completions", json={**body, "stream": False})  # would be the 2nd waiting
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert "max-waiting-requests" in r.json()["error"]["message"]
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.TransportError):  # no new connections once draining
            httpx.get(url + "/health", timeout=5)
        for t, tokens, _, state in (a, b):
            t.join(120)
            assert state["status"] == 200
        assert len(a[1]) == n + 1 and a[1][-1] == "DONE"  # both finished in full during the drain
        assert len(b[1]) == 20 + 1 and b[1][-1] == "DONE"
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
