"""Kernel confinement of one sandboxed program, installable without privileges: no_new_privs, Landlock, seccomp.

Role: applied by `harness.py` to itself (and to each I/O case child) after its uid drop and
rlimits, in every isolation mode. The harness runs as `python -I -S` and may use another interpreter
than the trainer's, so this module is stdlib only and reaches the harness as source text in its job
(`sandbox.confine_source()`), not by import.

What each layer holds, none needing a capability (a pod under Pod Security "restricted" has none):
- `PR_SET_NO_NEW_PRIVS` (required by the two below) and `PR_SET_DUMPABLE` 0: the program's
  /proc/<pid> files become root's, so a concurrent program of the same uid cannot read them;
  `PR_SET_PDEATHSIG`: the harness dies with the process that started it.
- Landlock (Linux >= 5.13, when the kernel and the runtime's seccomp profile allow it): writes only
  beneath the work dir (and /dev/null); reads only of the system and interpreter trees and the work
  dir, so not /proc/<pid>/environ, a home directory, the job's volumes or the socket directory; with
  ABI >= 4 no TCP bind/connect, with ABI >= 6 no signal to a process outside the program's own
  domain and no abstract Unix socket outside it. Absent: the uid, the rlimits and seccomp still hold.
- seccomp (a BPF program built here; every x86_64 and aarch64 kernel has it): socket() fails (no TCP,
  UDP/DNS, netlink or packet socket; socketpair stays for in-process pipes), and so do execve, ptrace,
  process_vm_*, io_uring (which would bypass the socket rule), bpf, perf_event_open, userfaultfd,
  keyctl, mount and the new-mount API, unshare/setns and clone with a namespace flag, setsid and
  setpgid (the program cannot leave the process group killed at its deadline), pidfd signalling and
  fd theft, priority and scheduling changes, and prlimit on another process. kill/tgkill/sigqueue may
  target only the program's own group, its harness or itself. clone3 answers ENOSYS so that the C
  library falls back to clone, whose flags the filter can read. Other architectures: the filter is
  not built (`SeccompUnavailable`) and the caller decides.

What programs lose: subprocesses (no exec), the network, and multiprocessing (its semaphores live in
/dev/shm, outside Landlock's writable tree); threads, os.fork and files in the work dir stay.

Why a hand-built filter rather than libseccomp: the harness runs without site-packages (`-I -S`)
under whichever interpreter the sandbox uid can read, so a binding would need its own loading path in
every mode, and none is well kept: PyPI's pyseccomp (ctypes over libseccomp2) was last released in
2021, and Debian's python3-seccomp (libseccomp 2.5.4) serves only Debian's own interpreter, not the
images' python:3.11. The program here is ~80 instructions over two syscall tables: the kernel runs
the x86_64 one in every sandbox test, and tests/sandbox/test_sandbox_confine.py interprets both.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 4, 22, 38
SIGKILL = 9
SECCOMP_MODE_FILTER = 2
RET_ALLOW, RET_KILL_PROCESS, RET_ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
EPERM, ENOSYS = 1, 38
LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
X32_BIT = 0x40000000
CLONE_NEW_FLAGS = 0x7E020080  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME

# (audit arch, {name: number}) per machine; numbers from the kernel's syscall tables
_COMMON = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
           "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
           "pidfd_send_signal": 424, "pidfd_open": 434, "pidfd_getfd": 438, "process_madvise": 440,
           "process_mrelease": 448, "clone3": 435}
TABLES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "socket": 41, "execve": 59, "execveat": 322, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "setsid": 112, "setpgid": 109, "unshare": 272, "setns": 308, "mount": 165,
        "umount2": 166, "pivot_root": 155, "chroot": 161, "keyctl": 250, "add_key": 248, "request_key": 249,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "setpriority": 141, "sched_setscheduler": 144,
        "sched_setattr": 314, "ioprio_set": 251, "migrate_pages": 256, "move_pages": 279,
        "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
        "clone": 56, "prlimit64": 302, "sched_setaffinity": 203, **_COMMON}),
    "aarch64": (0xC00000B7, {
        "socket": 198, "execve": 221, "execveat": 281, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "setsid": 157, "setpgid": 154, "unshare": 97, "setns": 268, "mount": 40,
        "umount2": 39, "pivot_root": 41, "chroot": 51, "keyctl": 219, "add_key": 217, "request_key": 218,
        "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "setpriority": 140, "sched_setscheduler": 119,
        "sched_setattr": 274, "ioprio_set": 30, "migrate_pages": 238, "move_pages": 239,
        "kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240,
        "clone": 220, "prlimit64": 261, "sched_setaffinity": 122, **_COMMON}),
}
DENIED = ("socket", "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev", "setsid", "setpgid",
          "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "keyctl", "add_key", "request_key", "bpf",
          "perf_event_open", "userfaultfd", "setpriority", "sched_setscheduler", "sched_setattr", "ioprio_set",
          "migrate_pages", "move_pages", "tkill", "io_uring_setup", "io_uring_enter", "io_uring_register",
          "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "pidfd_send_signal",
          "pidfd_open", "pidfd_getfd", "process_madvise", "process_mrelease")
SELF_ONLY = ("prlimit64", "sched_setaffinity")  # allowed on pid 0 (the caller) only

# Landlock (uapi/linux/landlock.h)
LL_CREATE, LL_ADD_RULE, LL_RESTRICT = 444, 445, 446
LL_VERSION, LL_PATH_BENEATH = 1, 1
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
WRITE_DIR_BITS = sum(1 << b for b in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
REFER, TRUNCATE = 1 << 13, 1 << 14
READ_ROOTS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc")


class SeccompUnavailable(OSError):
    """No syscall table for this machine (only x86_64 and aarch64 are built)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return rc


def seccomp_program(machine: str, me: int, group: int) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions, for a process `me` in process group `group`."""
    if machine not in TABLES:
        raise SeccompUnavailable(f"no seccomp syscall table for {machine}")
    arch, nr = TABLES[machine]
    deny = RET_ERRNO | EPERM
    prog = [(LD_ABS, 0, 0, 4), (JEQ, 1, 0, arch), (RET, 0, 0, RET_KILL_PROCESS), (LD_ABS, 0, 0, 0)]
    if machine == "x86_64":  # the x32 ABI's numbers would miss every rule below
        prog += [(JGE, 0, 1, X32_BIT), (RET, 0, 0, deny)]
    for name in DENIED:
        prog += [(JEQ, 0, 1, nr[name]), (RET, 0, 0, deny)]
    prog += [(JEQ, 0, 1, nr["clone3"]), (RET, 0, 0, RET_ERRNO | ENOSYS)]
    prog += [(JEQ, 0, 4, nr["clone"]), (LD_ABS, 0, 0, 16), (JSET, 0, 1, CLONE_NEW_FLAGS), (RET, 0, 0, deny),
             (RET, 0, 0, RET_ALLOW)]

    def first_arg_in(name: str, allowed: list[int]) -> None:
        n = len(allowed)
        prog.append((JEQ, 0, n + 3, nr[name]))
        prog.append((LD_ABS, 0, 0, 16))  # low 32 bits of args[0] (pid_t is 32 bits)
        prog.extend((JEQ, n - i, 0, v & 0xFFFFFFFF) for i, v in enumerate(allowed))
        prog.extend([(RET, 0, 0, deny), (RET, 0, 0, RET_ALLOW)])

    first_arg_in("kill", [0, me, group, -group])
    for name in ("tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        first_arg_in(name, [me, group])
    for name in SELF_ONLY:
        first_arg_in(name, [0])
    return [*prog, (RET, 0, 0, RET_ALLOW)]


def install_seccomp() -> None:
    """Load the filter into this (single-threaded) process; its children inherit it."""
    prog = seccomp_program(platform.machine(), os.getpid(), os.getpgid(0))
    raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))
    fprog = struct.pack("=HxxxxxxQ", len(prog), ctypes.addressof(buf))
    fbuf = ctypes.create_string_buffer(fprog, len(fprog))
    libc = _libc()
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, fbuf, 0, 0), "seccomp filter")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is off or the syscall is blocked."""
    rc = _libc().syscall(LL_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(LL_VERSION))
    return max(int(rc), 0)


def _fs_rights(abi: int) -> int:
    rights = EXECUTE | WRITE_FILE | READ_FILE | READ_DIR | WRITE_DIR_BITS
    return rights | (REFER if abi >= 2 else 0) | (TRUNCATE if abi >= 3 else 0)


def install_landlock(work: str, read_roots: list[str]) -> int:
    """Restrict this process (and its children) to reads of `read_roots` and the work dir, writes in the
    work dir only; returns the ABI used, 0 when Landlock is unavailable (nothing restricted)."""
    abi = landlock_abi()
    if abi <= 0:
        return 0
    libc = _libc()
    handled = _fs_rights(abi)
    attr = struct.pack("=QQQ", handled, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)  # net bind+connect; scopes
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    abuf = ctypes.create_string_buffer(attr[:size], size)
    ruleset = _check(libc.syscall(LL_CREATE, abuf, ctypes.c_size_t(size), ctypes.c_uint32(0)), "landlock ruleset")
    try:
        file_rights = handled & (EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE)
        rules = [(p, handled & (EXECUTE | READ_FILE | READ_DIR)) for p in read_roots]
        rules += [(work, handled), ("/dev/null", file_rights), ("/dev/urandom", READ_FILE), ("/dev/zero", READ_FILE)]
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # not on this machine
            try:
                if not os.path.isdir(path):
                    rights &= file_rights
                rule = ctypes.create_string_buffer(struct.pack("=Qi", rights, fd), 12)
                _check(libc.syscall(LL_ADD_RULE, ruleset, LL_PATH_BENEATH, rule, ctypes.c_uint32(0)),
                       f"landlock rule {path}")
            finally:
                os.close(fd)
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
        _check(libc.syscall(LL_RESTRICT, ruleset, ctypes.c_uint32(0)), "landlock restrict")
    finally:
        os.close(ruleset)
    return abi


def interpreter_roots() -> list[str]:
    """Where this interpreter's stdlib and extension modules live (readable under Landlock)."""
    roots = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix)}
    roots.add(os.path.dirname(os.path.realpath(sys.executable)))
    return sorted(roots | set(READ_ROOTS))


def confine_process(work: str) -> int:
    """no_new_privs, non-dumpable, killed with its parent, Landlock when available; returns the Landlock
    ABI (0: none)."""
    libc = _libc()
    _check(libc.prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")  # after the uid drop, which clears it
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    _check(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "PR_SET_DUMPABLE")
    return install_landlock(work, interpreter_roots())
