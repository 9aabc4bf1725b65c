"""The seccomp program of `sandbox/confine.py`, run by a small classic-BPF interpreter for both machines.

The kernel runs the x86_64 program in every sandbox test here; this checks what no test on this
machine can: the aarch64 program's decisions, and that every jump of both lands inside the program.
"""

from __future__ import annotations

import struct

import pytest

from tandem.sidecars.sandbox import confine

ME, GROUP = 4242, 4240
ALLOW, EPERM, ENOSYS = confine.RET_ALLOW, confine.RET_ERRNO | confine.EPERM, confine.RET_ERRNO | confine.ENOSYS


def run(prog: list[tuple[int, int, int, int]], arch: int, nr: int, *args: int) -> int:
    """Evaluate the filter on one syscall (seccomp_data: nr, arch, ip, args[6], little-endian)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(list(args) + [0] * 6)[:6])
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        assert pc + 1 + max(jt, jf) < len(prog) or code == confine.RET, f"jump out of the program at {pc}"
        if code == confine.LD_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == confine.RET:
            return k
        elif code == confine.JEQ:
            pc += jt if acc == k else jf
        elif code == confine.JGE:
            pc += jt if acc >= k else jf
        elif code == confine.JSET:
            pc += jt if acc & k else jf
        else:
            raise AssertionError(f"unknown instruction {code:#x}")
        pc += 1


@pytest.mark.parametrize("machine", sorted(confine.TABLES))
def test_filter_decisions(machine: str) -> None:
    arch, nr = confine.TABLES[machine]
    prog = confine.seccomp_program(machine, ME, GROUP)
    assert len(prog) < 4096  # BPF_MAXINSNS

    def decide(name: str, *args: int) -> int:
        return run(prog, arch, nr[name], *args)

    for name in confine.DENIED:
        assert decide(name) == EPERM, name
    assert decide("clone3") == ENOSYS  # the C library falls back to clone
    assert decide("clone", 0x01200011) == ALLOW  # fork (CHILD_SETTID|CHILD_CLEARTID|SIGCHLD)
    assert decide("clone", 0x003D0F00) == ALLOW  # a thread
    assert decide("clone", 0x10000000 | 0x11) == EPERM  # CLONE_NEWUSER
    assert decide("clone", 0x40000000 | 0x11) == EPERM  # CLONE_NEWNET
    for target in (0, ME, GROUP, -GROUP):
        assert decide("kill", target & 0xFFFFFFFFFFFFFFFF) == ALLOW, target
    for target in (1, -1, ME + 1, -(GROUP + 1)):
        assert decide("kill", target & 0xFFFFFFFFFFFFFFFF) == EPERM, target
    assert decide("tgkill", ME, ME) == ALLOW and decide("tgkill", 1, 1) == EPERM
    assert decide("prlimit64", 0) == ALLOW and decide("prlimit64", 1) == EPERM
    assert run(prog, arch, 0) == ALLOW  # read (x86_64) / io_setup (aarch64): not in any rule
    assert run(prog, arch ^ 1, nr["socket"]) == confine.RET_KILL_PROCESS  # another ABI's numbers
    if machine == "x86_64":
        assert run(prog, arch, confine.X32_BIT | 41) == EPERM  # the x32 ABI


def test_unknown_machine_is_refused() -> None:
    with pytest.raises(confine.SeccompUnavailable, match="riscv64"):
        confine.seccomp_program("riscv64", ME, GROUP)
