"""llama.cpp as a CPU baseline, through ``llama-cpp-python``: GGUF conversion, caching, greedy generation.

Reusable by any bench (``jaxinfer-bench compare`` today, the quantization bench later):

- ``convert(hf_dir, "f32" | "q8_0")`` writes a GGUF with **llama.cpp's own converter**
  (``convert_hf_to_gguf.py``). The converter is not in the wheel; it ships in the sdist of the installed
  ``llama-cpp-python`` version, which ``converter_dir`` fetches with ``pip download`` once and unpacks
  (the converter, its ``conversion/`` package and ``gguf-py/``; nothing of it is copied into this repo).
  The converter runs in its own process (``python -m bench.llamacpp CONVERTER_DIR ARGS...``) with one
  patch: a byte-level BPE tokenizer missing from llama.cpp's table of known pre-tokenizers ("BPE
  pre-tokenizer was not recognized") is declared "gpt-2". The GGUF is cached under
  ``cache_dir/gguf/<checkpoint name>-<hash of its files>/``, so a changed checkpoint converts afresh.
- A checkpoint with no tokenizer (the random ones transformers writes) is converted from a staging dir of
  links to its files plus a byte-level BPE ``tokenizer.json`` (bytes and one merge); the converter pads it to
  ``vocab_size``. The benches feed token ids, so the tokenizer only has to make the GGUF complete.
- ``GreedyLlama`` generates greedily (``temp=0``, one sequence: llama-cpp-python's ``Llama`` has no
  batch API) and scores tokens teacher-forced in a second context that keeps every position's logits.
- ``LlamaCppRunner`` is the ``compare`` runner built on these (batch 1 only).

Building llama.cpp: ``pip install llama-cpp-python`` compiles it with ``-march=native``. A CPU that
advertises AMX inside a VM that does not enable it (this project's dev machines: Xeon, AVX-512, AMX in
cpuinfo) then dies with SIGILL (``tilezero``) as soon as a q8_0 matmul runs; f32 works. Build it there
without AMX (``WITHOUT_AMX_CMAKE_ARGS``; every other instruction set of that CPU kept)::

    CMAKE_ARGS="$(python -c 'from bench.llamacpp import WITHOUT_AMX_CMAKE_ARGS as a; print(a)')" \
        pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

OUTTYPES = ("f32", "q8_0")
WITHOUT_AMX_CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
                          "-DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON "
                          "-DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF")
DEFAULT_CACHE = Path.home() / ".cache" / "jaxinfer" / "llama.cpp"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
_CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


def unavailable_reason() -> str | None:
    """Why llama.cpp cannot run here, or None."""
    if importlib.util.find_spec("llama_cpp") is None:
        return ("llama-cpp-python is not installed (pip install -e '.[baselines]'; it builds llama.cpp from "
                "source, ~5 min on 2 cores)")
    return None


def installed_version() -> str:
    return importlib.metadata.version("llama-cpp-python")


def converter_dir(cache_dir: Path = DEFAULT_CACHE, version: str | None = None) -> Path:
    """The dir holding llama.cpp's ``convert_hf_to_gguf.py`` for ``version`` (default: the installed one),
    unpacked from that version's sdist (``pip download``, once per cache dir)."""
    version = version or installed_version()
    cache_dir = Path(cache_dir)
    dest = cache_dir / f"llama-cpp-python-{version}-converter"
    if (dest / "convert_hf_to_gguf.py").is_file():
        return dest
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={version}", "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        sdists = sorted(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or not sdists:
            raise RuntimeError(f"could not download the llama-cpp-python {version} sdist ({' '.join(cmd)}):\n"
                               f"{done.stderr[-2000:]}")
        staging = Path(tmp) / "converter"
        with tarfile.open(sdists[0]) as tar:
            for member in tar.getmembers():
                parts = member.name.split("/", 3)  # <root>/vendor/llama.cpp/<rest>
                if len(parts) < 4 or parts[1:3] != ["vendor", "llama.cpp"] or not member.isfile():
                    continue
                rest = parts[3]
                if not any(rest == p or (p.endswith("/") and rest.startswith(p)) for p in _CONVERTER_PARTS):
                    continue
                target = staging / rest
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(member).read())
        if not (staging / "convert_hf_to_gguf.py").is_file():
            raise RuntimeError(f"{sdists[0].name} has no vendor/llama.cpp/convert_hf_to_gguf.py")
        staging.rename(dest)
    return dest


def checkpoint_key(hf_dir: Path) -> str:
    """A short hash of the checkpoint's files (name, size, mtime) and the llama-cpp-python version."""
    h = hashlib.sha256(installed_version().encode())
    for p in sorted(Path(hf_dir).iterdir()):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    return h.hexdigest()[:16]


def gguf_path(hf_dir: Path, outtype: str, cache_dir: Path = DEFAULT_CACHE) -> Path:
    hf_dir = Path(hf_dir).resolve()
    return Path(cache_dir) / "gguf" / f"{hf_dir.name}-{checkpoint_key(hf_dir)}" / f"model-{outtype}.gguf"


def convert(hf_dir: Path, outtype: str, cache_dir: Path = DEFAULT_CACHE) -> Path:
    """The GGUF (``f32`` or ``q8_0``) of an HF checkpoint dir, written by llama.cpp's converter (cached)."""
    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {OUTTYPES}, got {outtype!r}")
    out = gguf_path(hf_dir, outtype, cache_dir)
    if out.is_file():
        return out
    conv = converter_dir(cache_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    source = with_tokenizer(Path(hf_dir).resolve(), out.parent / "hf-with-tokenizer")
    partial = out.with_name(out.name + ".partial")
    log = out.with_name(f"convert-{outtype}.log")
    cmd = [sys.executable, "-m", "bench.llamacpp", str(conv), str(source), "--outtype", outtype,
           "--outfile", str(partial)]
    here = str(Path(__file__).resolve().parents[1])  # this bench package, whatever the child's cwd
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    with open(log, "w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0 or not partial.is_file():
        raise RuntimeError(f"llama.cpp's converter failed ({' '.join(cmd)}); its log ({log}) ends:\n"
                           f"{log.read_text()[-2000:]}")
    partial.rename(out)
    return out


def with_tokenizer(hf_dir: Path, staging: Path) -> Path:
    """``hf_dir`` if it has a tokenizer; otherwise ``staging``: links to its files and a byte-level BPE."""
    if any((hf_dir / name).is_file() for name in _TOKENIZER_FILES):
        return hf_dir
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab_size = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    staging.mkdir(parents=True, exist_ok=True)
    for p in hf_dir.iterdir():
        link = staging / p.name
        if p.is_file() and not link.exists():
            link.symlink_to(p)
    # byte tokens and one merge (llama.cpp refuses a BPE vocab without merges), within vocab_size
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())[: min(256, vocab_size - 1)]
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab[alphabet[0] + alphabet[1]] = len(alphabet)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(alphabet[0], alphabet[1])]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(staging / "tokenizer.json"))
    (staging / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    return staging


def gguf_weight_bytes(path: Path) -> int | None:
    """Bytes of the tensors a decode step reads (all but the token embedding, of which it reads one row per
    token, unless it doubles as the output layer); None without the ``gguf`` package."""
    try:
        import gguf
    except ImportError:
        return None
    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors}
    tied = "output.weight" not in tensors
    return sum(n for name, n in tensors.items() if tied or name != "token_embd.weight")


class GreedyLlama:
    """One GGUF in llama.cpp: greedy generation of one sequence, and teacher-forced token logprobs."""

    def __init__(self, path: Path, n_ctx: int, n_threads: int | None = None):
        from llama_cpp import Llama

        self.path, self.n_ctx = Path(path), n_ctx
        self.n_threads = n_threads or os.cpu_count()
        self._kwargs = dict(model_path=str(path), n_ctx=n_ctx, n_threads=self.n_threads,
                            n_threads_batch=self.n_threads, verbose=False, seed=0)
        self.llm = Llama(**self._kwargs)
        self._scorer = None  # a second context with logits_all=True, built on first use

    def generate(self, prompt_ids: list[int], n: int) -> list[int]:
        """``n`` greedy tokens after ``prompt_ids`` (no EOS stop; no prefix reuse from the previous call)."""
        self.llm.reset()  # n_tokens = 0: generate() then finds no cached prefix to reuse
        tokens = []
        for tok in self.llm.generate(list(prompt_ids), temp=0.0, top_k=1, top_p=1.0, min_p=0.0,
                                     repeat_penalty=1.0):
            tokens.append(int(tok))
            if len(tokens) == n:
                break
        return tokens

    def logprobs(self, prompt_ids: list[int], tokens: list[int]) -> np.ndarray:
        """The raw logprob of each of ``tokens`` given the prompt and the tokens before it (teacher-forced)."""
        if self._scorer is None:
            from llama_cpp import Llama

            self._scorer = Llama(**self._kwargs, logits_all=True)
        s = self._scorer
        s.reset()
        s.eval(list(prompt_ids) + list(tokens[:-1]))
        start = len(prompt_ids) - 1
        logits = np.asarray(s.scores[start:start + len(tokens)], np.float64)
        logits -= logits.max(axis=-1, keepdims=True)
        lp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
        return lp[np.arange(len(tokens)), tokens].astype(np.float32)


class LlamaCppRunner:
    """``compare`` runner: llama.cpp on the GGUF (``settings["outtype"]``) of the compared checkpoint."""

    max_batch_size = 1  # llama-cpp-python's Llama decodes one sequence at a time

    @staticmethod
    def unavailable_reason(settings: dict) -> str | None:
        if settings.get("platform", "cpu") != "cpu":
            return f"llama.cpp is the CPU baseline; jaxinfer runs on {settings['platform']}"
        return unavailable_reason()

    def __init__(self, checkpoint: str, settings: dict):
        self.outtype = settings["outtype"]
        self.name = f"llama.cpp-{self.outtype}"
        t = time.perf_counter()
        cache_dir = Path(settings.get("llamacpp_cache_dir") or DEFAULT_CACHE)
        self.path = convert(Path(checkpoint), self.outtype, cache_dir)
        self.convert_s = time.perf_counter() - t
        self.model = GreedyLlama(self.path, n_ctx=settings["max_model_len"], n_threads=settings.get("threads"))
        cfg = json.loads((Path(checkpoint) / "config.json").read_text())
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        kv_heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
        self.kv_bytes_per_token = 2 * cfg["num_hidden_layers"] * kv_heads * head_dim * 2  # K and V in f16

    def generate(self, prompts: np.ndarray, n: int, logprobs: bool) -> dict:
        if prompts.shape[0] != 1:
            raise ValueError(f"llama.cpp via llama-cpp-python runs batch 1 only, got {prompts.shape[0]} prompts")
        ids = prompts[0].tolist()
        t = time.perf_counter()
        tokens = self.model.generate(ids, n)
        seconds = time.perf_counter() - t
        lp = self.model.logprobs(ids, tokens)[None] if logprobs else None
        return {"seconds": seconds, "tokens": np.array([tokens]), "logprobs": lp}

    def info(self) -> dict:
        import llama_cpp

        return {"llama_cpp_python_version": llama_cpp.__version__, "gguf": str(self.path), "outtype": self.outtype,
                "gguf_bytes": self.path.stat().st_size, "threads": self.model.n_threads,
                "kv_cache_dtype": "f16", "convert_or_cache_s": self.convert_s,
                "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
                "decode_bytes": {"weights": gguf_weight_bytes(self.path), "kv_per_token": self.kv_bytes_per_token}}

    def stats(self) -> dict:
        return {}


def _run_converter(conv: Path, argv: list[str]) -> None:
    """Runs llama.cpp's ``convert_hf_to_gguf.py`` from ``conv`` with ``argv`` in this process."""
    import runpy

    sys.path[:0] = [str(conv), str(conv / "gguf-py")]  # its own gguf-py, as the script itself would insert
    from conversion.base import TextModel

    known_pre = TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return known_pre(self, tokenizer)
        except NotImplementedError:  # "BPE pre-tokenizer was not recognized"
            print("bench.llamacpp: pre-tokenizer not in llama.cpp's table; declaring it 'gpt-2' (byte-level BPE)",
                  file=sys.stderr)
            return "gpt-2"

    TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [str(conv / "convert_hf_to_gguf.py"), *argv]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    _run_converter(Path(sys.argv[1]), sys.argv[2:])
