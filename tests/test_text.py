"""Text in, text out: tokenization, incremental detokenization, stop strings, the CLI, on a tiny random
Llama that carries a real byte-level BPE tokenizer."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.cli import main as cli_main
from tests import hf_oracle


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    hf_oracle.skip_unless_available()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("text_model")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = (Path(sysconfig.get_paths()["stdlib"]) / "json" / "decoder.py").read_text()
    tok.train_from_iterator([corpus], trainer)
    tok.save(str(root / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    config = dict(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.08,
                  eos_token_id=eos, bos_token_id=eos)
    hf_oracle.write_random_checkpoint("LlamaConfig", config, root, seed=0)
    return root


@pytest.fixture(scope="module")
def llm(text_model):
    return LLM(compilation="lazy", model=str(text_model), max_model_len=128, num_kv_blocks=32, max_num_seqs=4)


def test_text_roundtrip(llm):
    tok = llm.get_tokenizer()
    out = llm.generate("def decode(self, s):", SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),
                       use_tqdm=False)[0]
    assert out.prompt == "def decode(self, s):"
    assert out.prompt_token_ids == tok.encode("def decode(self, s):")
    assert out.outputs[0].text == tok.decode(out.outputs[0].token_ids)


def test_stop_strings(llm):
    p = "class JSONDecoder"
    free = llm.generate(p, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True), use_tqdm=False)[0]
    text = free.outputs[0].text
    assert len(text) > 12
    stop = text[6:9]
    first = text.index(stop)
    out = llm.generate(p, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[stop, "\x00"]),
                       use_tqdm=False)[0].outputs[0]
    assert out.text == text[:first] and out.finish_reason == "stop" and out.stop_reason == stop
    out = llm.generate(p, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=stop,
                                         include_stop_str_in_output=True), use_tqdm=False)[0].outputs[0]
    assert out.text == text[: first + len(stop)]


def test_cli_generate_and_convert(text_model, tmp_path, capsys):
    # `jaxinfer generate` as a user runs it: its own process (its eager start compiles the whole default plan; in
    # a full test run, inside the pytest process late in the session, XLA's compile threads crashed twice)
    run = subprocess.run([sys.executable, "-m", "jaxinfer.cli", "generate", "--model", str(text_model),
                          "--max-tokens", "5", "--json", "def f(x):"], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    line = json.loads(run.stdout.strip().splitlines()[-1])
    assert line["prompt"] == "def f(x):" and len(line["token_ids"]) <= 5
    out_dir = tmp_path / "converted"
    assert cli_main(["convert", str(text_model), str(out_dir), "--dtype", "float32"]) == 0
    a = LLM(compilation="lazy", model=str(text_model), max_model_len=64, num_kv_blocks=16)
    b = LLM(compilation="lazy", model=str(out_dir), max_model_len=64, num_kv_blocks=16)
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    assert a.generate("import", sp, use_tqdm=False)[0].outputs[0].token_ids == \
        b.generate("import", sp, use_tqdm=False)[0].outputs[0].token_ids
