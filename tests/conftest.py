"""Shared fixtures: HF-written random checkpoints (session scope) and small engines."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "JAXINFER_CACHE_DIR" not in os.environ:  # the suite's compiled executables: never the user's cache
    _cache_dir = tempfile.mkdtemp(prefix="jaxinfer-test-cache-")
    os.environ["JAXINFER_CACHE_DIR"] = _cache_dir
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)

import pytest

from tests import hf_oracle


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory):
    """name -> directory of a random tiny checkpoint saved by transformers (in process, or in the oracle
    process of $JAXINFER_TEST_ORACLE_PYTHON where torch is not importable: tests/hf_oracle.py)."""
    hf_oracle.skip_unless_available()
    root = tmp_path_factory.mktemp("hf_ckpts")
    return {name: hf_oracle.build_checkpoint(name, root) for name in hf_oracle.ARCHS}


@pytest.fixture(scope="session")
def hf_models(hf_checkpoints):
    return {name: hf_oracle.load_hf(path) for name, path in hf_checkpoints.items()}


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_executables():
    """After each test module: drop jax's in-process caches, which keep every executable compiled in this process
    alive after its engine is gone. A compiled XLA:CPU executable holds ~380 memory mappings (the embedded model's
    plan, measured with /proc/self/maps); a session that builds a hundred engines of different shapes approached
    the kernel's 65530 (vm.max_map_count) and crashed inside XLA (segfaults in compile and deserialize, ~94% into
    a full run). Engines that a module or package fixture still holds keep their executables."""
    yield
    import gc

    import jax

    jax.clear_caches()
    gc.collect()
