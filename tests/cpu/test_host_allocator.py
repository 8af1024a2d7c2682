"""The CPU allocator tuning: applied on glibc, skipped when opted out."""

from __future__ import annotations

import platform

import pytest

from jaxinfer.cpu import host_allocator


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the tuning is glibc's mallopt")
def test_applied_on_glibc():
    assert host_allocator.keep_freed_memory_in_heap() is True


def test_opt_out(monkeypatch):
    monkeypatch.setenv(host_allocator.ENV_VAR, "0")
    assert host_allocator.keep_freed_memory_in_heap() is False
