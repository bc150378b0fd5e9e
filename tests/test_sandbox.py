"""Tests for atgrpo.sandbox: ordinary programs and hostile ones."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from atgrpo import sandbox
from atgrpo.sandbox import ExecResult, Limits, SandboxPool, run_many, run_python

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux-only sandbox")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Without an unprivileged uid, root ignores RLIMIT_NPROC and may signal anything.
needs_privilege_drop = pytest.mark.skipif(
    os.geteuid() == 0 and not sandbox.isolation().drop_privileges,
    reason="sandbox cannot drop root privileges here (see atgrpo.sandbox docstring)")


def run(code: str, **kw) -> ExecResult:
    return run_python(textwrap.dedent(code), **kw)


def assert_clean() -> None:
    """No sandbox process left and the test process can still start processes."""
    assert sandbox.leftover_processes() == []
    assert subprocess.run([sys.executable, "-c", "print(7)"], capture_output=True, text=True).stdout == "7\n"


# --- ordinary programs -------------------------------------------------------------

def test_hello_world():
    r = run("print('hello')")
    assert r.ok and r.stdout == "hello\n" and r.stderr == ""
    assert r.exit_code == 0 and r.killed_by_signal is None and not r.timed_out
    assert 0 < r.wall_seconds < 5


def test_stdin_passed_through():
    r = run("import sys; data = sys.stdin.read(); print(len(data), data.splitlines()[-1])",
            stdin="x\n" * 100_000 + "last\n")
    assert r.ok and r.stdout == "200005 last\n"


def test_sys_exit_code_reported():
    r = run("import sys; print('bye'); sys.exit(3)")
    assert r.exit_code == 3 and not r.ok and r.stdout == "bye\n"


def test_syntax_error_reported():
    r = run("def f(:\n  pass")
    assert r.exit_code != 0 and not r.ok and "SyntaxError" in r.stderr


def test_exception_reported():
    r = run("raise ValueError('boom')")
    assert r.exit_code == 1 and "ValueError: boom" in r.stderr


def test_killed_by_signal_reported():
    r = run("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert r.killed_by_signal == 11 and r.exit_code is None and not r.ok


def test_temp_dir_is_cwd_home_and_removed():
    r = run("""
        import os
        open('scratch.txt', 'w').write('x')
        print(os.getcwd()); print(os.environ['HOME'])
    """)
    assert r.ok, r.stderr
    cwd, home = r.stdout.split()
    assert cwd == home and os.path.basename(cwd).startswith("atgrpo-sbx-")
    assert not os.path.exists(cwd)


# --- hostile programs ----------------------------------------------------------------

def test_infinite_loop_times_out():
    t0 = time.monotonic()
    r = run("while True: pass", timeout=1.0)
    assert r.timed_out and not r.ok and r.killed_by_signal is not None
    assert time.monotonic() - t0 < 4
    assert_clean()


def test_sleeping_grandchild_does_not_outlive_run():
    r = run("""
        import os, subprocess, sys
        subprocess.Popen([sys.executable, '-c', 'import os, time; os.setsid(); time.sleep(60)'],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        print('parent done')
    """)
    assert r.ok and r.stdout == "parent done\n" and r.wall_seconds < 4
    assert_clean()


@needs_privilege_drop
def test_fork_bomb_is_contained():
    r = run("""
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """, timeout=2.0, limits=Limits(max_processes=32))
    assert not r.ok
    assert_clean()
    assert run("print(1)").ok  # the next sandbox works too


def test_memory_bomb():
    r = run("""
        chunks = []
        while True:
            chunks.append(bytearray(16 * 1024 * 1024))
    """, limits=Limits(memory_mb=256))
    assert not r.ok and r.memory_exceeded and not r.timed_out
    assert "MemoryError" in r.stderr


def test_huge_output_is_capped_and_killed():
    cap = 4096
    t0 = time.monotonic()
    r = run("""
        import sys
        line = 'x' * 1000 + '\\n'
        while True:
            sys.stdout.write(line)
    """, timeout=20.0, limits=Limits(max_output_bytes=cap))
    assert r.output_truncated and len(r.stdout) == cap and not r.timed_out
    assert time.monotonic() - t0 < 10  # killed for flooding, well before the timeout
    r = run("print('y' * 10_000); import sys; print('e' * 10_000, file=sys.stderr)",
            limits=Limits(max_output_bytes=100))
    assert r.ok and r.output_truncated and r.stdout == "y" * 100 and r.stderr == "e" * 100


@needs_privilege_drop
def test_cannot_write_outside_its_directory():
    """The repository is not in the sandbox's root (or, unconfined, not writable by the sandbox uid); /tmp
    is the sandbox's private tmpfs, so nothing reaches the host."""
    tmp_target = f"/tmp/atgrpo_outside_{uuid.uuid4().hex}"
    repo_target = os.path.join(REPO, f"atgrpo_outside_{uuid.uuid4().hex}")
    try:
        r = run(f"""
            for path in [{tmp_target!r}, {repo_target!r}]:
                try:
                    open(path, 'w').write('pwned')
                    print('wrote', path)
                except OSError as e:
                    print('denied', path, type(e).__name__)
        """)
        assert r.exit_code == 0, r.stderr
        assert (f"denied {repo_target} FileNotFoundError" in r.stdout or
                f"denied {repo_target} PermissionError" in r.stdout), r.stdout
        assert not os.path.exists(repo_target)
        if sandbox.isolation().namespaces:
            assert f"wrote {tmp_target}" in r.stdout  # ...into its private /tmp
            assert not os.path.exists(tmp_target)
    finally:
        for path in (tmp_target, repo_target):
            if os.path.exists(path):
                os.remove(path)


def test_parent_environment_not_visible(monkeypatch):
    monkeypatch.setenv("ATGRPO_TEST_SECRET", "hunter2-secret")
    r = run("""
        import os, glob
        print(sorted(os.environ))
        for path in glob.glob('/proc/*/environ'):
            try:
                print(open(path, 'rb').read())
            except OSError:
                pass
    """)
    assert r.ok, r.stderr
    assert "hunter2-secret" not in r.stdout and "ATGRPO_TEST_SECRET" not in r.stdout
    assert r.stdout.splitlines()[0] == "['HOME', 'LANG', 'MALLOC_ARENA_MAX', 'PATH']"


def test_threads_fit_under_memory_limit():
    r = run("""
        import threading, time
        threads = [threading.Thread(target=time.sleep, args=(0.2,)) for _ in range(30)]
        for t in threads: t.start()
        for t in threads: t.join()
        print('ok')
    """)
    assert r.ok and r.stdout == "ok\n", r.stderr


def _connect_program(port: int) -> str:
    return f"""
        import socket
        try:
            socket.create_connection(('127.0.0.1', {port}), timeout=2).close()
            print('connected')
        except OSError as e:
            print('blocked', e)
    """


@pytest.fixture
def listener():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        yield server


def test_network_blocked(listener):
    if not sandbox.NETWORK_ISOLATION:
        pytest.skip("network namespaces unavailable here (see atgrpo.sandbox docstring)")
    r = run(_connect_program(listener.getsockname()[1]))
    assert r.ok and r.stdout.startswith("blocked"), r.stdout + r.stderr
    with pytest.raises(BlockingIOError):
        listener.accept()


def test_network_allowed_when_requested(listener):
    r = run(_connect_program(listener.getsockname()[1]), limits=Limits(network=True))
    assert r.ok and r.stdout == "connected\n", r.stdout + r.stderr


@needs_privilege_drop
def test_cannot_kill_parent():
    me = os.getpid()
    r = run(f"""
        import os, signal
        for pid in (os.getppid(), {me}):
            try:
                os.kill(pid, signal.SIGKILL)
                print('killed', pid)
            except OSError as e:
                print('failed', pid, type(e).__name__)
    """)
    assert os.getpid() == me  # still alive to check
    assert r.ok and f"killed {me}" not in r.stdout, r.stdout
    if sandbox.isolation().namespaces:  # the trainer is not in the program's PID namespace; its init
        assert f"failed {me} ProcessLookupError" in r.stdout  # (pid 1) ignores the SIGKILL and reports


# --- pool ------------------------------------------------------------------------------

def test_pool_results_in_order():
    jobs = [(f"import time; time.sleep({0.2 if i % 2 == 0 else 0}); print({i})", "", 5.0) for i in range(8)]
    jobs.append(("import sys; print(sys.stdin.read().upper())", "abc", 5.0))
    jobs.append(("while True: pass", "", 0.5))
    with SandboxPool(max_workers=4) as pool:
        results = pool.map(jobs)
    assert [r.stdout for r in results[:8]] == [f"{i}\n" for i in range(8)]
    assert results[8].stdout == "ABC\n"
    assert results[9].timed_out
    assert_clean()


def test_run_many():
    results = run_many([("print(1)",), ("print(2)", ""), ("import sys; sys.exit(5)", "", 2.0)], max_workers=2)
    assert [r.stdout for r in results] == ["1\n", "2\n", ""]
    assert results[2].exit_code == 5


def test_interpreter_runs_without_its_virtual_environment():
    """The sandbox runs the real interpreter behind sys.executable: the standard library is there, the
    virtual environment's and the interpreter's site-packages are not (no package is declared)."""
    r = run_python("import sys, json, sqlite3, ssl, ctypes, decimal; print(sys.version_info[0]); print(sys.path)")
    assert r.ok and r.stdout.startswith("3\n"), r.stderr
    if sandbox.isolation().namespaces:
        assert sys.prefix not in r.stdout.splitlines()[1] or sys.prefix == sys.base_prefix
        r = run_python("import pytest")
        assert r.exit_code == 1 and "ModuleNotFoundError: No module named 'pytest'" in r.stderr


# --- where nothing can isolate -----------------------------------------------------------------------------

_NO_NAMESPACES = """
import os, sys
from atgrpo.sandbox import confine, seccomp
confine._prctl(38, 1)  # no_new_privs, then the sandbox's own filter: this process can no longer unshare
seccomp.install(confine._libc, seccomp.Prepared(seccomp.filter_program()))
from atgrpo import sandbox
print('MODE', sandbox.isolation().mode)
try:
    print('RAN', sandbox.run_python('print(6 * 7)').stdout.strip())
except sandbox.SandboxUnavailable as e:
    print('REFUSED', e)
"""


@pytest.mark.skipif(not sandbox.isolation().seccomp, reason="needs the system-call filter (x86_64, aarch64)")
@pytest.mark.parametrize("allowed", [False, True])
def test_refuses_unconfined_runs_unless_allowed(allowed):
    """In a process that cannot create namespaces (the sandbox's filter denies unshare), run_python refuses
    with one line naming the setting; with ATGRPO_SANDBOX_UNCONFINED=1 (what sandbox.unconfined: true sets)
    it runs the program unconfined."""
    env = {k: v for k, v in os.environ.items() if k != "ATGRPO_SANDBOX_UNCONFINED"}
    env["PYTHONPATH"] = REPO
    if allowed:
        env["ATGRPO_SANDBOX_UNCONFINED"] = "1"
    out = subprocess.run([sys.executable, "-c", _NO_NAMESPACES], capture_output=True, text=True, env=env,
                         timeout=120).stdout
    assert "MODE none" in out, out
    if allowed:
        assert "RAN 42" in out, out
    else:
        refusal = [line for line in out.splitlines() if line.startswith("REFUSED")]
        assert len(refusal) == 1 and "`sandbox.unconfined: true`" in refusal[0], out


@pytest.mark.skipif(not sandbox.isolation().namespaces, reason="the minimal root needs namespaces")
def test_declared_packages_are_importable_and_nothing_else():
    """Limits.packages binds just those installed packages (read-only) into the root's site-packages."""
    pytest.importorskip("yaml")
    code = """
        import yaml, os
        print(yaml.safe_dump({'a': 1}).strip())
        try:
            import pytest
        except ImportError as e:
            print('NO', type(e).__name__)
        try:
            open(os.path.join(os.path.dirname(yaml.__file__), 'evil.py'), 'w')
        except OSError as e:
            print('RO', e.errno)
    """
    r = run(code, limits=Limits(packages=("yaml",)))
    assert r.ok and r.stdout.splitlines() == ["a: 1", "NO ModuleNotFoundError", "RO 30"], r.stdout + r.stderr
    r = run("import yaml")
    assert r.exit_code == 1 and "ModuleNotFoundError: No module named 'yaml'" in r.stderr


def test_root_resolves_relative_links_with_dot_dot(tmp_path):
    """Ubuntu 24.04 links ``/lib64 -> usr/lib64`` and ``/usr/lib64/ld-linux-x86-64.so.2 ->
    ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2``: the resolved path and every recorded link hold no ``..``
    (a root plan once held ``/usr/lib64/..`` and its mkdir failed with EEXIST)."""
    from atgrpo.sandbox.root import _resolve
    real = tmp_path / "usr" / "lib" / "x86_64-linux-gnu"
    real.mkdir(parents=True)
    (real / "ld.so.2").write_text("")
    (tmp_path / "usr" / "lib64").mkdir()
    (tmp_path / "usr" / "lib64" / "ld.so.2").symlink_to("../lib/./x86_64-linux-gnu/ld.so.2")
    (tmp_path / "lib64").symlink_to("usr/lib64")
    links: dict[str, str] = {}
    resolved = _resolve(f"{tmp_path}/lib64/ld.so.2", links)
    assert resolved == os.path.realpath(real / "ld.so.2")
    assert links == {f"{tmp_path}/lib64": "usr/lib64",
                     f"{tmp_path}/usr/lib64/ld.so.2": "../lib/./x86_64-linux-gnu/ld.so.2"}
    assert _resolve(f"{tmp_path}/usr/lib64/../lib64/./ld.so.2", {}) == resolved


def test_root_skips_missing_site_dirs_inside_bound_directories(tmp_path):
    """A site directory that sysconfig names but that does not exist inside a bound (read-only) directory is
    left out of the root; existing ones, and missing ones the root can create, stay."""
    from atgrpo.sandbox.root import _site_covers
    stdlib = tmp_path / "usr" / "lib" / "python3.12"
    (stdlib / "dist-packages").mkdir(parents=True)
    candidates = {str(stdlib / "site-packages"), str(stdlib / "dist-packages"),
                  str(tmp_path / "usr" / "local" / "lib" / "python3.12" / "dist-packages")}
    assert _site_covers(candidates, [str(stdlib)]) == candidates - {str(stdlib / "site-packages")}
