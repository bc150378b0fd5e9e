"""Every fault at every file a run writes (``write_fault_cases.CASES``): a full disk (the kernel's ENOSPC, and
torch's ``RuntimeError`` for it), an I/O error, a read-only directory, a directory in the file's place. A real
2-step run in this process meets the fault at the file's first write after it is armed; it must stop with one
line (exit 2) that names the file, the cause and what to do, leave everything it had written intact, and, once
the fault is gone, resume to the rows of an uninterrupted run; or, for a view (report.html, the plot), warn and
go on. docs/reliability.md's table is rendered from the same list, and checked here to be current."""

from __future__ import annotations

import os
import shutil

import pytest

from atgrpo.cli import main

from fault_helpers import before_step, run_rows
from fault_inject import WriteFault, snapshot
from write_fault_cases import CASES, CAUSE, ITEMS, REMEDY, doc_block, render_table

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REFERENCE: dict = {}


@pytest.fixture
def reference(tmp_path_factory):
    """The rows of an uninterrupted run of these items (one run per item set, shared by the module's cases)."""
    def rows(items: list[str]) -> list[dict]:
        key = tuple(items)
        if key not in _REFERENCE:
            out = str(tmp_path_factory.mktemp("reference") / "run")
            assert main(["train", *items, "--out", out, "--quiet"]) == 0
            _REFERENCE[key] = run_rows(out)
        return _REFERENCE[key]
    return rows


def _in_the_way(path: str) -> None:
    """A directory (holding a file) where the run will write the file or directory ``path``."""
    if os.path.isfile(path):
        os.remove(path)  # a file replaced by a directory
    os.makedirs(path, exist_ok=True)
    open(os.path.join(path, "someone's"), "w").close()


def _lines(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_write_fault_stops_in_one_line_or_warns_and_the_run_resumes_to_the_same_rows(
        case, tmp_path, monkeypatch, capsys, reference):
    site, items = case.site, ITEMS + list(case.site.items)
    want = reference(items)
    out = str(tmp_path / "run")
    target = os.path.join(out, site.shown)
    fault = WriteFault(monkeypatch, out, site.pattern, case.fault, case.op)

    def arm(state=None) -> None:
        if case.fault == "EISDIR":
            _in_the_way(target)
        fault.arm()
    arm() if site.step == 0 else before_step(monkeypatch, site.step, arm)
    capsys.readouterr()
    rc = main(["train", *items, "--out", out, "--quiet"])
    lines = _lines(capsys)

    if case.outcome == "replaced":  # a stale entry in the way of a checkpoint directory
        assert rc == 0 and not lines, lines
        assert not os.path.exists(os.path.join(target, "someone's"))
    elif case.outcome == "warns":
        assert rc == 0 and len(lines) == 1, lines
        assert lines[0].startswith(f"atgrpo: warning: could not write {target} ({CAUSE[case.fault]}")
        assert "the run goes on" in lines[0] and fault.struck
    else:
        assert fault.struck, "the fault never struck: the site is not written where the case says"
        assert rc == 2 and len(lines) == 1, lines
        line = lines[0]
        assert line.startswith("atgrpo: error: could not write ") and "Traceback" not in line, line
        for part in (target, CAUSE[case.fault], REMEDY[case.fault]):
            assert part in line, (part, line)
        kept = site.started
        assert (f"then continue with: atgrpo train --resume {out}" if kept else "then start it again") in line, line
        after = snapshot(out) if os.path.isdir(out) else {}
        for name, data in fault.before.items():  # nothing the run had written is changed or gone
            assert after.get(name) == data, name
        leftovers = [os.path.join(p, n) for p, ds, fs in os.walk(out) for n in ds + fs if n.startswith(".tmp-")]
        assert not leftovers, leftovers
        fault.armed = False  # the fault is gone: the disk has room again, the directory was moved away
        if case.fault == "EISDIR":
            shutil.rmtree(target)
        again = ["train", "--resume", out, "--quiet"] if kept else ["train", *items, "--out", out, "--quiet"]
        assert main(again) == 0, _lines(capsys)
    assert run_rows(out) == want


def test_every_fault_is_injected_and_every_site_gets_a_full_disk_and_an_io_error():
    from write_fault_cases import FAULTS, S

    assert len({c.id for c in CASES}) == len(CASES)
    assert {c.fault for c in CASES} == set(FAULTS)
    for site in S.values():
        assert {"ENOSPC", "EIO"} <= {c.fault for c in CASES if c.site is site}, site.name


def test_the_doc_table_is_rendered_from_the_cases():
    with open(os.path.join(REPO, "docs", "reliability.md")) as f:
        block = doc_block(f.read())
    assert block is not None, "docs/reliability.md has no generated write-faults table"
    assert block == render_table(), "docs/reliability.md is out of date: run python tests/write_fault_cases.py"
