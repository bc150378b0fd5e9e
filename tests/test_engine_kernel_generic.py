"""The CPU kernels' plain loops, which a CPU without AVX-512 runs: the kernel tests again against a build for
x86-64-v2 (``ATGRPO_KERNEL_MARCH``), in a child process with its own extensions directory, on any machine whose
compiler can build the kernels. About a minute: the build."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from atgrpo.engine import kernels

pytestmark = pytest.mark.skipif(kernels.module() is None, reason=f"kernels not built here: {kernels.available()[1]}")

TESTS = Path(__file__).with_name("test_engine_kernel.py")


def test_the_plain_loops_pass_the_kernel_tests(tmp_path):
    env = dict(os.environ, ATGRPO_KERNEL_MARCH="x86-64-v2", TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    probe = "from atgrpo.engine import kernels; m = kernels.module(); print(m is not None and not m.bf16_pairs())"
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=600)
    assert r.stdout.strip() == "True", r.stdout + r.stderr  # built, without the AVX512-BF16 paths
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(TESTS)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout
