"""Peak resident memory per phase (``trainer/memory.py``): each phase's own peak, the process-wide peak kept
across the phases' resets, and freed memory handed back to the system after a phase."""

import pytest
import torch

from atgrpo.trainer import memory
from atgrpo.trainer.metrics import rss_mb

pytestmark = pytest.mark.skipif(memory.peak_rss_gb() is None, reason="no /proc/self/status here")


def test_each_phase_records_its_own_peak_and_the_run_keeps_the_highest():
    memory.reset_peak_rss()
    peaks: dict[str, float] = {}
    with memory.phase("big", peaks):
        block = torch.ones(300 * 2**20 // 4)  # 300 MiB, touched
        del block
    with memory.phase("small", peaks):
        torch.ones(2**20).sum()
    assert peaks["big"] - peaks["small"] > 200  # the second phase's count started afresh
    assert memory.peak_rss_mib() >= peaks["big"]  # the process-wide peak survived the reset
    with memory.phase("small", peaks):
        pass
    assert peaks["small"] <= peaks["big"]


def test_each_cell_counts_its_own_peak_memory():
    """The peak-RSS count restarts with each cell (``bench real-table``'s ``reset_peak_rss``): a peak reached before
    the reset is not the next cell's."""
    # the block may come from heap space earlier tests freed: handed back before and after, it is resident only
    # while it lives
    memory.release_free_memory()
    memory.reset_peak_rss()
    block = b"\x01" * (400 * 2 ** 20)
    high = memory.peak_rss_gb()
    del block
    memory.release_free_memory()
    memory.reset_peak_rss()
    assert high - memory.peak_rss_gb() > 0.3


@pytest.mark.parametrize("release", [True, False])
def test_a_phase_hands_freed_heap_memory_back(monkeypatch, release):
    """Many small blocks (served from glibc's heap, not mmap) freed inside a phase below one still alive: they stay
    resident unless the phase hands them back (``release_free_memory``; switched off: they stay)."""
    if memory._LIBC is None:
        pytest.skip("not glibc")
    if not release:
        monkeypatch.setattr(memory, "release_free_memory", lambda: None)
    before = rss_mb()
    with memory.phase("heap", {}):
        blocks = [torch.ones(4096) for _ in range(40000)]  # 16 KiB each, 625 MiB in all
        pin = torch.ones(4096)  # above them in the heap: the heap cannot shrink from its top
        del blocks
    grown = rss_mb() - before
    del pin
    assert (grown < 200) if release else (grown > 400)


@pytest.mark.parametrize("setting, aligned", [(None, True), ("0", False)])
def test_importing_atgrpo_first_turns_on_torchs_huge_page_allocation(setting, aligned):
    """``import atgrpo`` before torch turns on torch's transparent-huge-page allocation (``THP_MEM_ALLOC_ENABLE``,
    unless the user set it): blocks of 2 MiB and more are then page-aligned (and advised as huge pages), where
    glibc's own alignment is 16 bytes past a page. Checked in a fresh interpreter, where torch has not allocated
    yet."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if setting is not None:
        env["THP_MEM_ALLOC_ENABLE"] = setting
    code = ("import atgrpo, torch\n"
            "ptrs = [torch.empty(3 * 2**20 + 4096 * i, dtype=torch.uint8).data_ptr() for i in range(1, 9)]\n"
            "print(sum(p % 4096 == 0 for p in ptrs))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    n = int(out.stdout.split()[-1])
    assert n == 8 if aligned else n == 0, out.stdout
