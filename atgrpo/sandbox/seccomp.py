"""The sandbox's system-call filter: a classic BPF program installed with prctl, no libseccomp.

A program never needs to debug other processes, mount or create namespaces, load kernel modules, use
keyrings, BPF or perf, reboot, set the clock or the host name: those calls fail with ``EPERM``
(``PermissionError: [Errno 1] Operation not permitted`` in the program's stderr). ``clone`` with a
namespace flag fails the same way; ``clone3``, whose flags a classic filter cannot read, fails with
``ENOSYS`` so that libc falls back to ``clone``. A call made through another ABI (i386 ``int 0x80`` from
an x86_64 process, x32 numbers, arm32 compat) kills the process: the numbers below would not mean what
they say there. The filter is built once (:func:`filter_program`) and installed in the forked child
just before exec (:func:`install`: one ``prctl``, after ``PR_SET_NO_NEW_PRIVS``); it is inherited by
everything the program starts. Only x86_64 and aarch64 are known; elsewhere :func:`filter_program`
returns None and the sandbox refuses to run untrusted code (see ``atgrpo.sandbox``).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import platform
import struct

# name: (x86_64, aarch64); None where the architecture has no such call. Checked against
# /usr/include/x86_64-linux-gnu/asm/unistd_64.h and /usr/include/asm-generic/unistd.h.
DENIED = {
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "kcmp": (312, 272),
    "pidfd_getfd": (438, 438), "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
    "chroot": (161, 51), "unshare": (272, 97), "setns": (308, 268), "open_tree": (428, 428),
    "move_mount": (429, 429), "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432),
    "fspick": (433, 433), "mount_setattr": (442, 442), "keyctl": (250, 219), "add_key": (248, 217),
    "request_key": (249, 218), "bpf": (321, 280), "perf_event_open": (298, 241), "userfaultfd": (323, 282),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "reboot": (169, 142), "swapon": (167, 224),
    "swapoff": (168, 225), "syslog": (103, 116), "acct": (163, 89), "settimeofday": (164, 170),
    "clock_settime": (227, 112), "clock_adjtime": (305, 266), "adjtimex": (159, 171),
    "sethostname": (170, 161), "setdomainname": (171, 162), "iopl": (172, None), "ioperm": (173, None),
    "quotactl": (179, 60), "quotactl_fd": (443, 443), "lookup_dcookie": (212, 18),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264), "fanotify_init": (300, 262),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "vhangup": (153, 58), "uselib": (134, None),
}
_CLONE, _CLONE3 = (56, 220), (435, 435)
_ARCHES = {"x86_64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7)}  # column in DENIED, AUDIT_ARCH_*
_X32_BIT = 0x40000000
# CLONE_NEWTIME | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWNS
_CLONE_NS_FLAGS = 0x80 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x20000

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_KILL_PROCESS, _RET_ERRNO, _RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data; args[0]'s low word (little-endian)
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


@functools.cache
def filter_program(machine: str | None = None) -> bytes | None:
    """The filter for this machine's architecture as raw ``sock_filter`` bytes (None: unknown arch)."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        return None
    col, audit_arch = _ARCHES[machine]
    eperm = _RET_ERRNO | errno.EPERM
    prog = [_insn(_LD_W_ABS, _OFF_ARCH), _insn(_JEQ, audit_arch, 1, 0), _insn(_RET, _RET_KILL_PROCESS),
            _insn(_LD_W_ABS, _OFF_NR)]
    if machine == "x86_64":  # the x32 ABI: same kernel entry, numbers with bit 30 set
        prog += [_insn(_JGE, _X32_BIT, 0, 1), _insn(_RET, _RET_KILL_PROCESS)]
    for nr in sorted({nums[col] for nums in DENIED.values() if nums[col] is not None}):
        prog += [_insn(_JEQ, nr, 0, 1), _insn(_RET, eperm)]
    prog += [_insn(_JEQ, _CLONE3[col], 0, 1), _insn(_RET, _RET_ERRNO | errno.ENOSYS),
             _insn(_JEQ, _CLONE[col], 0, 3), _insn(_LD_W_ABS, _OFF_ARG0),
             _insn(_JSET, _CLONE_NS_FLAGS, 0, 1), _insn(_RET, eperm),
             _insn(_RET, _RET_ALLOW)]
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class Prepared:
    """A filter ready to install: the buffers live as long as this object (built before the fork)."""

    def __init__(self, program: bytes) -> None:
        self._buf = ctypes.create_string_buffer(program, len(program))
        self.fprog = _SockFprog(len(program) // 8, ctypes.addressof(self._buf))


def install(libc: ctypes.CDLL, prepared: Prepared) -> None:
    """Install the filter in this process (needs ``no_new_privs`` or CAP_SYS_ADMIN); a plain prctl."""
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prepared.fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp: {errno.errorcode.get(err, err)}")
