"""`jaxinfer-bench host-loop` on a tiny workload: the simulated device really replaces the model (nothing is
compiled), both modes give the same tokens, async steps ran ahead. Structure only, no timing thresholds."""

from __future__ import annotations

import argparse

from bench import host_loop


def test_host_loop_sync_and_async_give_the_same_tokens(tmp_path):
    p = argparse.ArgumentParser()
    host_loop.add_arguments(p)
    args = p.parse_args(["--batch-sizes", "1", "4", "--output-len", "6", "--step-ms", "1",
                         "--prompt-len-range", "20", "40", "--output", str(tmp_path / "host.json")])
    payload = host_loop.run(args)
    rows = {(r["batch_size"], r["mode"]): r for r in payload["rows"]}
    assert set(rows) == {(1, "sync"), (1, "async"), (4, "sync"), (4, "async")}
    for (batch, mode), r in rows.items():
        assert r["tokens_identical_sync_async"] is True
        assert r["tpot_ms"] >= 1.0  # a token per device step at best: the simulated step is 1 ms
        assert r["device_steps"] == r["engine_steps"] >= 6
        assert (r["async_steps"] > 0) == (mode == "async")
        assert set(r["host_ms_per_step"]) == set(host_loop.PHASES)
    assert (tmp_path / "host.json").is_file()


def test_simulated_tokens_are_text_without_eos():
    ids = host_loop.text_token_ids(_Tok(), {0})
    device = host_loop.SimulatedDevice(0.001, ids)
    assert 0 not in ids and device.token(3, 10) == ids[(3 * 7919 + 10) % len(ids)]


class _Tok:
    @staticmethod
    def encode(text, add_special_tokens=False):
        return [ord(c) % 50 for c in text[:500]]
