"""The seccomp filter every sandboxed program runs under (bwrap `--seccomp FD`,
installed before the interpreter starts, so nothing of the program predates it).

It closes what namespaces and rlimits leave open, in every containment (with a
cgroup or without one, so that a verdict never depends on which):
- reaching another process of the sandbox, its init above all, whose exit is what
  ends the program: ptrace, process_vm_readv/writev, process_madvise, pidfd_getfd,
  kcmp;
- memory held through file descriptors, which RLIMIT_AS does not count: memfds
  (memfd_create, memfd_secret), SysV shared memory (shmat; shmget alone holds no
  page), socket buffers past the default size (setsockopt SO_SNDBUF/SO_RCVBUF and
  their FORCE forms), and sockets other than AF_UNIX, whose buffers (TCP's
  autotuning) grow without asking. What stays is bounded: regular files live in two
  tmpfs of `max_disk_bytes`, pipes and AF_UNIX sockets are counted by RLIMIT_NOFILE;
- the kernel's keyrings, shared with the evaluator (its session keyring) and
  between programs: add_key, request_key, keyctl;
- kernel interfaces a test never needs and that widen its attack surface: bpf,
  perf_event_open, userfaultfd, io_uring (whose operations bypass seccomp).
Denied calls fail with an errno (EPERM, or ENOSYS/EAFNOSUPPORT where libraries
probe and fall back); a system call of a foreign ABI (32-bit, x32) ends the process.
"""

from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
_NR, _ARCH, _ARGS = 0, 4, 16
_LD_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_X32_BIT = 0x40000000
AF_UNIX, SOL_SOCKET = 1, 1
_BUFFER_OPTIONS = (7, 8, 32, 33)  # SO_SNDBUF, SO_RCVBUF, SO_SNDBUFFORCE, SO_RCVBUFFORCE

# Denied calls and their errno; numbers per ABI below.
DENIED = {
    "ptrace": errno.EPERM, "process_vm_readv": errno.EPERM, "process_vm_writev": errno.EPERM,
    "process_madvise": errno.EPERM, "pidfd_getfd": errno.EPERM, "kcmp": errno.EPERM,
    "memfd_create": errno.ENOSYS, "memfd_secret": errno.ENOSYS, "shmat": errno.EPERM,
    "add_key": errno.ENOSYS, "request_key": errno.ENOSYS, "keyctl": errno.ENOSYS,
    "bpf": errno.EPERM, "perf_event_open": errno.EPERM, "userfaultfd": errno.EPERM,
    "io_uring_setup": errno.ENOSYS, "io_uring_enter": errno.ENOSYS, "io_uring_register": errno.ENOSYS,
}
# (AUDIT_ARCH, syscall numbers) of each machine we build a filter for.
ABIS = {
    "x86_64": (0xC000003E, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "process_madvise": 440,
        "pidfd_getfd": 438, "kcmp": 312, "memfd_create": 319, "memfd_secret": 447, "shmat": 30,
        "add_key": 248, "request_key": 249, "keyctl": 250, "bpf": 321, "perf_event_open": 298,
        "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "socket": 41, "socketpair": 53, "setsockopt": 54}),
    "aarch64": (0xC00000B7, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "process_madvise": 440,
        "pidfd_getfd": 438, "kcmp": 272, "memfd_create": 279, "memfd_secret": 447, "shmat": 196,
        "add_key": 217, "request_key": 218, "keyctl": 219, "bpf": 280, "perf_event_open": 241,
        "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "socket": 198, "socketpair": 199, "setsockopt": 208}),
}
MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


class UnsupportedMachine(RuntimeError):
    """No filter is known for this machine's system-call ABI."""


def seccomp_program(machine: str | None = None) -> bytes:
    """The filter as bwrap reads it: an array of struct sock_filter.

    Args:
        machine (str | None): the machine as `platform.machine()` names it (`x86_64`, `aarch64`,
            or their aliases `amd64`, `arm64`); None: this machine.
    """
    machine = machine or platform.machine()
    machine = MACHINE_ALIASES.get(machine, machine)
    if machine not in ABIS:
        raise UnsupportedMachine(f"no seccomp filter for machine {machine!r} (known: {', '.join(ABIS)})")
    arch, numbers = ABIS[machine]
    program = _Program()
    program.load(_ARCH)
    program.unless_equal(arch, _KILL_PROCESS)
    program.load(_NR)
    if machine == "x86_64":
        program.if_at_least(_X32_BIT, _ERRNO | errno.ENOSYS)
    for name, error in DENIED.items():
        program.if_equal(numbers[name], _ERRNO | error)
    for name in ("socket", "socketpair"):
        program.if_equal_then(numbers[name], _unix_sockets_only())
    program.if_equal_then(numbers["setsockopt"], _default_socket_buffers())
    program.ret(_ALLOW)
    return program.bytes()


def _unix_sockets_only() -> _Program:
    """socket(domain, ...), socketpair(domain, ...): AF_UNIX only."""
    block = _Program()
    block.load(_ARGS)
    block.unless_equal(AF_UNIX, _ERRNO | errno.EAFNOSUPPORT)
    block.ret(_ALLOW)
    return block


def _default_socket_buffers() -> _Program:
    """setsockopt(fd, SOL_SOCKET, a buffer size, ...): refused; any other option passes."""
    block = _Program()
    block.load(_ARGS + 8)
    block.unless_equal(SOL_SOCKET, _ALLOW)
    block.load(_ARGS + 16)
    for option in _BUFFER_OPTIONS:
        block.if_equal(option, _ERRNO | errno.EPERM)
    block.ret(_ALLOW)
    return block


class _Program:
    """A classic BPF program, built forward; jumps are relative and short."""

    def __init__(self) -> None:
        self.code: list[tuple[int, int, int, int]] = []

    def load(self, offset: int) -> None:
        self.code.append((_LD_ABS, 0, 0, offset))

    def ret(self, action: int) -> None:
        self.code.append((_RET, 0, 0, action))

    def if_equal(self, value: int, action: int) -> None:
        """Return `action` when the loaded word equals `value`."""
        self.code += [(_JEQ, 0, 1, value), (_RET, 0, 0, action)]

    def unless_equal(self, value: int, action: int) -> None:
        """Return `action` when the loaded word differs from `value`."""
        self.code += [(_JEQ, 1, 0, value), (_RET, 0, 0, action)]

    def if_at_least(self, value: int, action: int) -> None:
        self.code += [(_JGE, 0, 1, value), (_RET, 0, 0, action)]

    def if_equal_then(self, value: int, block: _Program) -> None:
        """Run `block` (which ends in a return) when the loaded word equals
        `value`, else skip it; the syscall number is loaded again after it."""
        if len(block.code) > 255:
            raise ValueError("seccomp block too long for a short jump")
        self.code.append((_JEQ, 0, len(block.code), value))
        self.code += block.code
        self.load(_NR)

    def bytes(self) -> bytes:
        return b"".join(struct.pack("=HBBI", *instruction) for instruction in self.code)
