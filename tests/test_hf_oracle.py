"""The HF oracle's out-of-process mode (tests/hf_oracle.py, used where torch is not importable, as on CI's
Python 3.12 leg) gives what the in-process oracle gives: the same checkpoint files, logits, greedy tokens and
logprobs, parameter counts; errors in the oracle process come back with their traceback.

Comparing needs both, so the comparisons run where torch is importable in process (CI's 3.11 leg), against
an oracle process of ``$JAXINFER_TEST_ORACLE_PYTHON`` or, unset, of this same interpreter."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests import hf_oracle

needs_both = pytest.mark.skipif(
    not hf_oracle.torch_in_process(),
    reason="compares the oracle process against the in-process oracle: needs torch importable here (CI's 3.11 "
           "leg); on the 3.12 leg the oracle process serves every HF parity test instead")

PROMPT = [1, 17, 33, 90, 4, 250, 7]


@pytest.fixture(scope="module")
def python():
    return str(hf_oracle.oracle_python() or sys.executable)


@pytest.fixture(scope="module")
def remote(python):
    return hf_oracle.remote_client(python)


def _tensors(path):
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@needs_both
@pytest.mark.parametrize("name", ["llama_gqa", "qwen2_moe"])
def test_remote_checkpoint_and_outputs_equal_in_process(name, remote, tmp_path):
    local_dir = hf_oracle.build_checkpoint(name, tmp_path / "local")
    remote_dir = Path(remote.call("build_checkpoint", name=name, out_dir=str(tmp_path / "remote"), seed=0))
    assert remote_dir == tmp_path / "remote" / name
    assert sorted(p.name for p in local_dir.iterdir()) == sorted(p.name for p in remote_dir.iterdir())
    assert json.loads((local_dir / "config.json").read_text()) == json.loads((remote_dir / "config.json").read_text())
    local_t, remote_t = _tensors(local_dir), _tensors(remote_dir)
    assert local_t.keys() == remote_t.keys()
    for k in local_t:
        np.testing.assert_array_equal(local_t[k], remote_t[k], err_msg=k)

    local_model, remote_model = hf_oracle.load_hf(local_dir), remote.call("load_hf", path=str(remote_dir))
    assert isinstance(remote_model, hf_oracle.RemoteModel) and not isinstance(local_model, hf_oracle.RemoteModel)
    assert hf_oracle.num_parameters(remote_model) == hf_oracle.num_parameters(local_model)
    # the public functions route a RemoteModel to its process, whatever this interpreter has
    remote_logits = hf_oracle.hf_logits(remote_model, PROMPT)
    assert remote_logits.dtype == np.float32 and remote_logits.shape == (len(PROMPT), 256)
    np.testing.assert_allclose(remote_logits, hf_oracle.hf_logits(local_model, PROMPT), rtol=0, atol=1e-6)
    tokens, lps = hf_oracle.hf_greedy(remote_model, PROMPT, 8)
    local_tokens, local_lps = hf_oracle.hf_greedy(local_model, PROMPT, 8)
    assert tokens == local_tokens
    np.testing.assert_allclose(lps, local_lps, rtol=0, atol=1e-9)


@needs_both
def test_remote_state_dict_parameter_counts_and_versions(remote, python, tmp_path):
    config = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                  num_key_value_heads=2)
    _, local_state = hf_oracle.write_random_checkpoint("Qwen2Config", config, tmp_path / "a", seed=3,
                                                       dtype="bfloat16", return_state=True)
    path, remote_state = remote.call("write_random_checkpoint", config_class="Qwen2Config", config_kwargs=config,
                                     path=str(tmp_path / "b"), seed=3, dtype="bfloat16", return_state=True)
    assert path == str(tmp_path / "b") and local_state.keys() == remote_state.keys()
    for k in local_state:  # numpy arrays cross the pipe bit-exactly, dtype and shape included
        assert remote_state[k].dtype == np.float32
        np.testing.assert_array_equal(remote_state[k], local_state[k], err_msg=k)
    assert remote.call("count_parameters", model_type="qwen2", config_kwargs=config) == \
        hf_oracle.count_parameters("qwen2", config)
    versions = remote.call("versions")
    assert set(versions) == {"python", "torch", "transformers"}
    if python == sys.executable:
        assert versions == hf_oracle.versions()


@needs_both
def test_an_error_in_the_oracle_process_carries_its_traceback_and_the_process_lives_on(remote, tmp_path):
    with pytest.raises(hf_oracle.OracleError, match=r"(?s)build_checkpoint failed in the oracle process.*KeyError"):
        remote.call("build_checkpoint", name="no_such_arch", out_dir=str(tmp_path), seed=0)
    assert remote.alive() and remote.call("versions")["torch"]


def test_mode_follows_torch_and_the_variable(monkeypatch, tmp_path):
    monkeypatch.setattr(hf_oracle, "torch_in_process", lambda: True)
    monkeypatch.setenv(hf_oracle.ORACLE_PYTHON_VAR, str(tmp_path / "python"))
    assert hf_oracle.mode() == "local"  # torch here wins over the variable
    monkeypatch.setattr(hf_oracle, "torch_in_process", lambda: False)
    assert hf_oracle.mode() == "remote" and hf_oracle.available()
    with pytest.raises(hf_oracle.OracleError, match="no such interpreter"):
        hf_oracle.versions()
    monkeypatch.delenv(hf_oracle.ORACLE_PYTHON_VAR)
    assert hf_oracle.mode() is None and not hf_oracle.available()
    assert hf_oracle.ORACLE_PYTHON_VAR in hf_oracle.unavailable_reason()
    with pytest.raises(pytest.skip.Exception, match="HF oracle unavailable"):
        hf_oracle.skip_unless_available()
