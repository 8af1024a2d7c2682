"""A non-editable install works outside the checkout: the wheel carries the embedded models and C++ sources.

Builds the repository's wheel (from a copy of the working tree, so a stale ``build/`` in the checkout cannot
leak into it, and without build isolation, so no network is needed), checks what it holds, installs it with
``--no-deps`` into a fresh venv and runs that venv's python from a directory outside the checkout. The
child gets this venv's site-packages on ``PYTHONPATH`` for jax and the other dependencies: ``PYTHONPATH``
entries do not run ``.pth`` files, so the editable install of jaxinfer here is not seen, which the child
asserts (``jaxinfer.__file__`` lies in the fresh venv). There ``LLM()`` loads the installed default model,
builds the installed C++ kernels and decodes greedily; the draft model, the chat template and
``jaxinfer.server`` are checked too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = ROOT / "jaxinfer" / "embedded_models"
FFI = ROOT / "jaxinfer" / "cpu" / "ffi"
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json", "training_summary.json")
TOP_LEVEL = {"jaxinfer", "pallas_kernels", "sharding", "bench", "jaxinfer-0.1.0.dist-info"}
# Not copied for the build: VCS data, environments (also any other folder holding a pyvenv.cfg, as CI's .venv312),
# build outputs and caches.
COPY_IGNORED = {".git", ".venv", ".venv312", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis"}


def _pip_wheel_available() -> bool:
    probe = subprocess.run([sys.executable, "-m", "pip", "wheel", "--help"], capture_output=True)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _pip_wheel_available(), reason="`pip wheel` is not available")

CHILD = r'''
import hashlib, json, sys
from pathlib import Path

venv, checkout = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
assert all(Path(p or ".").resolve() != checkout for p in sys.path), sys.path

import jaxinfer
from jaxinfer import LLM, SamplingParams
from jaxinfer.loading import model_source
import jaxinfer.server
from jaxinfer.server.chat_template import load_chat_template

llm = LLM(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=128)
out = llm.generate(["def fibonacci(n):"], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
                   use_tqdm=False)[0].outputs[0]
draft = model_source.DRAFT_MODEL_DIR
print("RESULT " + json.dumps({
    "jaxinfer": str(Path(jaxinfer.__file__).resolve()),
    "server": str(Path(jaxinfer.server.__file__).resolve()),
    "venv": str(venv),
    "default_dir": str(model_source.default_model_dir().resolve()),
    "model_source": str(llm.llm_engine.model_source),
    "draft_dir": str(draft.resolve()),
    "draft_files": sorted(p.name for p in draft.iterdir()),
    "default_sha256": hashlib.sha256((model_source.DEFAULT_MODEL_DIR / "model.safetensors").read_bytes()).hexdigest(),
    "chat_template": load_chat_template(model_source.DEFAULT_MODEL_DIR),
    "token_ids": list(out.token_ids),
    "text": out.text,
}))
'''


def _copy_tree(dst: Path) -> None:
    def ignore(directory, names):
        return {n for n in names if n in COPY_IGNORED or n.endswith(".egg-info")
                or (Path(directory) / n / "pyvenv.cfg").is_file()}
    shutil.copytree(ROOT, dst, ignore=ignore)


def _run(cmd, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, \
        f"{cmd} failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return result


def _site_packages() -> str:
    paths = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    return os.pathsep.join(dict.fromkeys(paths))


def test_wheel_installs_and_runs_outside_the_checkout(tmp_path):
    src = tmp_path / "src"
    _copy_tree(src)
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", str(wheels), str(src)], cwd=tmp_path)
    (wheel,) = wheels.glob("jaxinfer-*.whl")

    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} <= TOP_LEVEL, sorted({n.split("/")[0] for n in names})
    assert not [n for n in names if n.startswith(("bench/results/", "tests/")) or ".venv" in n]
    for model in ("default", "draft"):
        for name in MODEL_FILES:
            assert f"jaxinfer/embedded_models/{model}/{name}" in names
    assert "jaxinfer/embedded_models/default/chat_template.jinja" in names
    kernels = sorted(p.name for p in FFI.iterdir() if p.suffix in (".cc", ".h"))
    assert kernels and all(f"jaxinfer/cpu/ffi/{k}" in names for k in kernels)

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)], cwd=tmp_path)

    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "child.py").write_text(CHILD)
    cache = tmp_path / "cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAXINFER_", "PYTHON"))}
    env.update(PYTHONPATH=_site_packages(), JAX_PLATFORMS="cpu", JAXINFER_CACHE_DIR=str(cache))
    child = _run([str(python), "child.py", str(venv), str(ROOT)], cwd=work, env=env, timeout=600)
    (line,) = [ln for ln in child.stdout.splitlines() if ln.startswith("RESULT ")]
    got = json.loads(line[len("RESULT "):])

    installed = (venv.resolve() / "lib").glob("python*/site-packages/jaxinfer")
    (package,) = list(installed)
    assert Path(got["jaxinfer"]) == package / "__init__.py"
    assert Path(got["server"]).is_relative_to(package)
    assert Path(got["default_dir"]) == package / "embedded_models" / "default"
    assert Path(got["model_source"]).resolve() == Path(got["default_dir"])
    assert Path(got["draft_dir"]) == package / "embedded_models" / "draft"
    assert set(MODEL_FILES) <= set(got["draft_files"])
    weights = EMBEDDED / "default" / "model.safetensors"
    assert got["default_sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert got["chat_template"] == (EMBEDDED / "default" / "chat_template.jinja").read_text()
    assert len(got["token_ids"]) == 8 and got["text"].strip()
    if shutil.which("c++") or shutil.which("g++") or shutil.which("clang++"):
        # the installed C++ sources compiled into the child's cache
        assert list((cache / "cpu_ffi").glob("*/libjaxinfer_cpu.so"))
