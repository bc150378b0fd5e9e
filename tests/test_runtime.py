"""Process settings (atgrpo/runtime.py)."""

from __future__ import annotations

import platform

import pytest

from atgrpo import runtime


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_keep_freed_memory_sets_glibc_thresholds():
    assert runtime.keep_freed_memory(mmap_threshold=16 << 20, trim_threshold=512 << 20)
    assert runtime.malloc_settings() == {"mmap_threshold": 16 << 20, "trim_threshold": 512 << 20}
    assert runtime.keep_freed_memory()  # the defaults, set again
    assert runtime.malloc_settings() == {"mmap_threshold": 32 << 20, "trim_threshold": 1 << 30}


def test_a_value_outside_a_c_int_is_an_error_and_changes_nothing():
    before = runtime.malloc_settings()
    with pytest.raises(ValueError, match="mmap_threshold"):
        runtime.keep_freed_memory(mmap_threshold=1 << 40)
    assert runtime.malloc_settings() == before
