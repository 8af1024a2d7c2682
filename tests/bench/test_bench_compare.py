"""`jaxinfer-bench compare`: argument parsing, the runner-process protocol (with stand-in runners), the
correctness diff, the summary rows and the JSON; one end-to-end run of jaxinfer beside HF on a tiny
HF-written checkpoint. Structure and correctness only, never timing."""

from __future__ import annotations

import argparse
import json
import os
import signal

import numpy as np
import pytest

from bench import compare


def _parse(argv):
    p = argparse.ArgumentParser()
    compare.add_arguments(p)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------ stand-in runners
class EchoRunner:
    """Greedy "model": token i of a row is (sum of the prompt row + i) % 97; logprob -0.5 each."""

    max_batch_size = None

    @staticmethod
    def unavailable_reason(settings):
        return None

    def __init__(self, checkpoint, settings):
        self.offset = settings.get("offset", 0)
        self.calls = 0

    def generate(self, prompts, n, logprobs):
        self.calls += 1
        base = prompts.sum(axis=1, keepdims=True)
        tokens = (base + np.arange(n)[None]) % 97
        tokens[:, self.offset:] += 1 if self.offset else 0  # diverge from position `offset` on
        lp = np.full(tokens.shape, -0.5 - 1e-3 * bool(self.offset), np.float32) if logprobs else None
        return {"seconds": 0.01 * n, "tokens": tokens, "logprobs": lp}

    def info(self):
        return {"pid": os.getpid(), "decode_bytes": {"weights": 1000, "kv_per_token": 10}}

    def stats(self):
        return {"calls": self.calls}

    def bandwidth(self):
        return {"bytes_per_s": 1e6, "gb_per_s": 1e-3, "probe": "fake"}


class BatchOneRunner(EchoRunner):
    max_batch_size = 1


class UnavailableRunner(EchoRunner):
    @staticmethod
    def unavailable_reason(settings):
        return "needs a thing this machine lacks"


class BrokenInitRunner(EchoRunner):
    def __init__(self, checkpoint, settings):
        raise RuntimeError("cannot load this checkpoint")


class FailsOnLongRunner(EchoRunner):
    def generate(self, prompts, n, logprobs):
        if n > 1 and not logprobs:
            raise ValueError("long generations fail")
        return super().generate(prompts, n, logprobs)


class DiesRunner(EchoRunner):
    def generate(self, prompts, n, logprobs):
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would


_HERE = "tests.bench.test_bench_compare"


def _fake_runners(**extra):
    runners = {compare.REFERENCE: (f"{_HERE}:EchoRunner", {}),
               "diverges": (f"{_HERE}:EchoRunner", {"offset": 2}),
               "batch-one": (f"{_HERE}:BatchOneRunner", {}),
               "unavailable": (f"{_HERE}:UnavailableRunner", {}),
               "broken": (f"{_HERE}:BrokenInitRunner", {}),
               "fails-timed": (f"{_HERE}:FailsOnLongRunner", {}),
               "dies": (f"{_HERE}:DiesRunner", {})}
    runners.update(extra)
    return runners


def test_protocol_schedule_and_rows_with_stand_in_runners():
    prompts = {1: np.arange(3)[None], 2: np.arange(6).reshape(2, 3)}
    lines = []
    workers = compare.start_workers(_fake_runners(), "unused", {}, timeout_s=60, log=lines.append)
    assert {n: w.status for n, w in workers.items()} == {
        "jaxinfer": "ready", "diverges": "ready", "batch-one": "ready", "unavailable": "skipped",
        "broken": "failed", "fails-timed": "ready", "dies": "ready"}
    assert workers["unavailable"].reason == "needs a thing this machine lacks"
    assert "RuntimeError: cannot load this checkpoint" in workers["broken"].reason
    pids = {workers[n].info["pid"] for n in ("jaxinfer", "diverges", "batch-one")}
    assert len(pids) == 3 and os.getpid() not in pids  # each runner in its own process

    measured = compare.measure(workers, prompts, n=5, repeats=3, log=lines.append)
    runners = measured["runners"]
    assert measured["bandwidth"]["probe"] == "fake"
    assert runners["dies"]["status"] == "failed" and "died (signal SIGKILL)" in runners["dies"]["reason"]
    assert runners["fails-timed"]["status"] == "failed" and "long generations fail" in runners["fails-timed"]["reason"]
    assert len(runners["jaxinfer"]["batches"][2]["tn"]) == 3
    assert runners["batch-one"]["batches"][2]["tn"] == []  # never asked to run a batch it cannot
    # per batch size: 1 correctness + 2 warm-up calls, then 2 calls per timed round
    assert runners["jaxinfer"]["stats"]["after"]["calls"] == 2 * (3 + 2 * 3)
    assert runners["batch-one"]["stats"]["after"]["calls"] == 3 + 2 * 3
    first_per_round = {}
    for line in lines:  # "[compare] round 1/3 batch 1 jaxinfer: 0.05 s"
        if line.startswith("[compare] round"):
            parts = line.split()
            first_per_round.setdefault((parts[2], parts[4]), parts[5].rstrip(":"))
    assert len({first_per_round[f"{r}/3", "1"] for r in (1, 2, 3)}) == 3  # the order rotates every round

    rows = {(r["runner"], r["batch_size"]): r for r in compare.summarize(measured, [1, 2], n=5, mean_context=5.5)}
    ref, div = rows["jaxinfer", 2], rows["diverges", 2]
    assert ref["status"] == "ok" and ref["tok_per_s"] == pytest.approx(2 * 5 / 0.05)
    assert ref["tpot_s"] == pytest.approx((0.05 - 0.01) / 4)
    assert ref["floor_s"] == pytest.approx((1000 + 2 * 5.5 * 10) / 1e6)
    assert ref["timed_tokens_match_correctness_pass"]
    assert ref["stats_change_during_timed_rounds"] == {"calls": 2 * 2 * 3}  # both batch sizes' timed calls
    assert div["greedy_sequences_identical"] == 0.0 and div["greedy_mean_identical_prefix"] == 2.0
    assert div["logprob_drift"] == {"max_abs": pytest.approx(1e-3, rel=1e-4), "mean_abs": pytest.approx(1e-3, rel=1e-4),
                                   "positions": 4}
    assert div["jaxinfer_speedup_tpot"] == pytest.approx(1.0)
    assert rows["batch-one", 1]["status"] == "ok" and rows["batch-one", 1]["greedy_sequences_identical"] == 1.0
    unsupported = rows["batch-one", 2]
    assert unsupported["status"] == "unsupported" and "one sequence at a time" in unsupported["reason"]
    assert rows["unavailable", 1]["status"] == "skipped" and rows["broken", 2]["status"] == "failed"
    for r in rows.values():
        compare._fmt_row(r, 5)  # every kind of row prints


def test_greedy_agreement_and_logprob_drift():
    ref = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]])
    other = np.array([[1, 2, 3, 4], [5, 0, 7, 8], [0, 9, 9, 9]])
    identical, mean_prefix, prefix = compare.greedy_agreement(ref, other)
    assert identical == pytest.approx(1 / 3) and prefix == [4, 1, 0] and mean_prefix == pytest.approx(5 / 3)
    lp_ref = np.array([[-1.0, -2.0, -3.0, -4.0], [-1.0, -1.0, -1.0, -1.0], [-1.0] * 4])
    lp = lp_ref + np.array([[0.1, 0.0, -0.3, 0.0], [0.2, 9.0, 9.0, 9.0], [9.0] * 4])  # drift after a divergence ignored
    drift = compare.logprob_drift(lp_ref, lp, prefix)
    assert drift["positions"] == 5 and drift["max_abs"] == pytest.approx(0.3)
    assert drift["mean_abs"] == pytest.approx(0.6 / 5)
    assert compare.logprob_drift(lp_ref, lp, [0, 0, 0]) is None


def test_arguments_defaults_choices_and_reproduce_command(capsys):
    args = _parse([])
    assert args.baselines is None and args.batch_sizes == [1, 16] and args.compilation == "eager"
    assert set(compare.DEFAULT_BASELINES["cpu"]) == set(compare.BASELINES) - {"vllm-default-bind"}
    assert _parse(["--baselines"]).baselines == []
    with pytest.raises(SystemExit):
        _parse(["--baselines", "sglang"])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parse(["--repeats", "0"])
    args = _parse(["--model", "/m dir", "--output-len", "8", "--compilation", "lazy"])
    cmd = compare.reproduce_command(args, ["llama.cpp-q8_0"], [1])
    assert cmd == ("jaxinfer-bench compare --model '/m dir' --baselines llama.cpp-q8_0 --batch-sizes 1 "
                   "--input-len 32 --output-len 8 --repeats 3 --compilation lazy")
    assert compare.reproduce_command(_parse([]), [], [1, 16]).startswith("jaxinfer-bench compare --baselines --batch")


def test_machine_names_cpu_and_versions():
    m = compare.machine({"platform": "cpu"}, [9.0, 8.0, 7.0])
    assert m["cpu_model"] and m["cpu_count"] >= 1 and m["jax"] == {"platform": "cpu"}
    assert m["load_average_at_start"] == [9.0, 8.0, 7.0] and len(m["load_average_at_end"]) == 3
    assert m["versions"]["numpy"] == np.__version__ and "llama-cpp-python" in m["versions"]


# ------------------------------------------------------------------------------------------ real runners
@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    # compare's hf-eager / hf-compile baselines run torch inside jaxinfer-bench's own runner processes (this
    # interpreter), not through the test oracle: only where torch is installed here (CI's 3.11 leg).
    why = "the compare bench's HF baselines need torch in this interpreter (CI's 3.11 leg)"
    pytest.importorskip("torch", reason=why)
    pytest.importorskip("transformers", reason=why)
    from tests import hf_oracle

    return hf_oracle.build_checkpoint("llama_gqa", tmp_path_factory.mktemp("compare_ckpt"))


@pytest.fixture(scope="module")
def tiny_compare(tiny_llama, tmp_path_factory):
    """One `compare` run on the tiny checkpoint: jaxinfer, hf-eager, and llama.cpp when it is installed."""
    import importlib.util

    tmp = tmp_path_factory.mktemp("compare_run")
    llama = ["llama.cpp-f32", "llama.cpp-q8_0"] if importlib.util.find_spec("llama_cpp") else []
    args = _parse(["--model", str(tiny_llama), "--baselines", "hf-eager", "jaxinfer-multistep", *llama,
                   "--batch-sizes", "1", "3",
                   "--input-len", "5", "--output-len", "6", "--repeats", "1", "--compilation", "lazy",
                   "--llamacpp-cache-dir", str(tmp / "llamacpp"), "--output", str(tmp / "compare.json")])
    payload = compare.run(args)
    return payload, json.loads((tmp / "compare.json").read_text())


def test_compare_jaxinfer_and_hf_end_to_end(tiny_compare, tiny_llama):
    payload, written = tiny_compare
    assert written["rows"] == json.loads(json.dumps(payload["rows"], default=str))
    assert written["command"].startswith(f"jaxinfer-bench compare --model {tiny_llama} --baselines hf-eager")
    rows = {(r["runner"], r["batch_size"]): r for r in payload["rows"]}
    for runner in ("jaxinfer", "hf-eager"):
        for b in (1, 3):
            r = rows[runner, b]
            assert r["status"] == "ok", (runner, b, r["reason"])
            assert r["tok_per_s"] > 0 and r["timed_tokens_match_correctness_pass"]
            assert r["machine"]["versions"]["torch"] and r["machine"]["jax"]["platform"] == "cpu"
            assert r["command"].startswith(f"jaxinfer-bench compare --model {tiny_llama} --baselines")
            assert f"--batch-sizes {b} " in r["command"]
    for b in (1, 3):  # float32 HF and jaxinfer agree token for token on this checkpoint
        r = rows["hf-eager", b]
        assert r["greedy_sequences_identical"] == 1.0 and r["greedy_mean_identical_prefix"] == 6
        assert r["logprob_drift"]["positions"] == 6 * b and r["logprob_drift"]["max_abs"] < 1e-4
    # the warm-up used the timed calls' own flags: nothing compiled while timing, even with lazy compilation
    assert rows["jaxinfer", 1]["stats_change_during_timed_rounds"] == {"compilations_after_start": 0}
    for b in (1, 3):  # multi-step decoding: the same tokens as single steps
        r = rows["jaxinfer-multistep", b]
        assert r["status"] == "ok" and r["machine"]["runner"]["num_scheduler_steps"] == 8
        assert r["greedy_sequences_identical"] == 1.0 and r["logprob_drift"]["max_abs"] < 1e-5


def test_compare_llama_cpp_batch_one(tiny_compare):
    pytest.importorskip("llama_cpp")
    rows = {(r["runner"], r["batch_size"]): r for r in tiny_compare[0]["rows"]}
    for name in ("llama.cpp-f32", "llama.cpp-q8_0"):
        assert rows[name, 1]["status"] == "ok", rows[name, 1]["reason"]
        assert rows[name, 3]["status"] == "unsupported" and "one sequence at a time" in rows[name, 3]["reason"]
        info = rows[name, 1]["machine"]["runner"]
        assert info["gguf"].endswith(f"model-{name.split('-')[1]}.gguf") and info["llama_cpp_python_version"]
        assert 0 < info["decode_bytes"]["weights"] < info["gguf_bytes"]
    f32, q8 = rows["llama.cpp-f32", 1], rows["llama.cpp-q8_0", 1]
    assert f32["greedy_sequences_identical"] == 1.0 and f32["logprob_drift"]["max_abs"] < 1e-2  # its KV cache is f16
    assert q8["machine"]["runner"]["gguf_bytes"] < f32["machine"]["runner"]["gguf_bytes"] / 2


def test_hf_compile_runner_matches_eager_and_really_compiles(tiny_llama):
    from bench import hf_baselines

    prompts = np.random.default_rng(0).integers(0, 256, size=(2, 5))
    eager = hf_baselines.HFEagerRunner(str(tiny_llama), {}).generate(prompts, 6, True)
    runner = hf_baselines.HFCompileRunner(str(tiny_llama), {"torch_compile_backend": "eager"})  # dynamo only: fast
    assert runner.info()["cache_implementation"] == "static"
    graphs_before = runner.stats()["dynamo_unique_graphs"]
    compiled = runner.generate(prompts, 6, True)
    assert runner.stats()["dynamo_unique_graphs"] > graphs_before  # the decode went through torch.compile
    np.testing.assert_array_equal(compiled["tokens"], eager["tokens"])
    np.testing.assert_allclose(compiled["logprobs"], eager["logprobs"], atol=1e-5)


def test_unavailable_baselines_say_why(monkeypatch):
    import importlib.util

    from bench import hf_baselines, llamacpp

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("llama_cpp", "torch") else real_find_spec(name, *a))
    assert "llama-cpp-python is not installed" in llamacpp.LlamaCppRunner.unavailable_reason({"platform": "cpu"})
    assert "CPU baseline" in llamacpp.LlamaCppRunner.unavailable_reason({"platform": "gpu"})
    assert "torch is not installed" in hf_baselines.HFEagerRunner.unavailable_reason({"platform": "cpu"})
    with pytest.raises(ValueError, match="outtype must be one of"):
        llamacpp.convert("unused", "q4_0")
