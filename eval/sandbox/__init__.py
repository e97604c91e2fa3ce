"""Run model-written programs in a contained subprocess, never in our own process.

Every program runs under bubblewrap (`bwrap`, Debian package `bubblewrap`), which
gives it new user, IPC, PID, network, UTS and cgroup namespaces, no capabilities,
no new user namespaces (`--disable-userns`), a session of its own, and a
read-only root file system that holds only the system directories (/usr, /etc,
/lib...) and our interpreter's prefixes. Its working directory, home and /tmp
are one size-capped tmpfs (`max_disk_bytes`, /dev/shm likewise), which is
where `program.py` is written; it vanishes with the program, so nothing of it is
ever on the host's disk. SysV IPC objects and POSIX message queues live in the
program's own IPC namespace and die with it; so does every process it forks
(PID namespace: when the program's init goes, the kernel kills the rest).
When the evaluator dies, so does the program: the parent-death signal kills
bwrap, whose `--die-with-parent` kills the program's init. When the run ends
(the program exited, or the wall limit passed) the evaluator kills that init
itself, through a pidfd, and returns only once it is gone (reaped, where the
evaluator is PID 1 or a subreaper), and with it every process of the program.

On top of bwrap, by hand: rlimits on CPU time, address space, file size (which
also caps its output), open files and process count; closed stdin; stdout and
stderr in memory files that only the evaluator holds (a program cannot swap them
for a FIFO or a symlink); a seccomp filter (eval/sandbox/seccomp.py: no ptrace or
other reach into the sandbox's init; no memfds, no SysV shared memory attach, no
sockets but AF_UNIX and no larger socket buffers, so that what a process holds
through descriptors stays small; no keyrings, and /proc/keys is masked); a cgroup
per program where the machine lets us make one, capping the memory and process
count of the program as a whole (eval/sandbox/cgroup.py; without one, memory is
capped per process only). `ExecutionResult.containment` names which:
"cgroup+seccomp" or "rlimit+seccomp". When the evaluator runs as root, the
program runs under a throw-away user id of its own, recorded before use
(eval/sandbox/host.py; the first run of each evaluator process sweeps what a
killed predecessor left under the uids it recorded, and its cgroups).

Without bwrap, or where it cannot build the sandbox, running a program raises
`SandboxUnavailable`: a program never runs unsandboxed. Nothing a program does
raises it: the sandbox counts as started once the bootstrap's "started" record,
written before the program's first line, is on the status channel, a socket the
program can write to but neither read nor reopen through /proc/self/fd (a pipe
reopened so becomes a read end, from which a program could drain the record).
What a program's text holds (a lone surrogate, a size over the file cap) and
whatever it does fail that program only. What it writes reaches
`ExecutionResult` (and any message quoting it) as text: control characters but
tab and newline (a NUL, a terminal escape) escaped as a backslash, x and two hex digits.

`run_tests` (the tests inside the program, as DS-1000 and CanItEdit need): a
program passes only when it exits 0 AND the trusted bootstrap that runs it reports,
over a channel only the evaluator reads, that it started once and that the program's
code returned. The bootstrap compiles the program with asserts on whatever the
interpreter's flags, refuses to run optimized, and uses no runpy; an audit hook
ends the process at a trace or profile hook, a change of a function's `__code__`
(but the flag types.coroutine sets), an exec of the process image or a gc walk. What stays possible inside the
program's own process: writing the record once it finds the channel, answers whose
`__eq__` always says True, patching what the tests call (builtins, libraries),
ctypes. `run_calls` runs the tests in a trusted process instead
(HumanEval, MBPP): the program only answers calls (eval/sandbox/codec.py says what crosses).
"""

from eval.sandbox.calls import TrustedTests, run_calls
from eval.sandbox.limits import ExecutionResult, SandboxLimits, SandboxUnavailable
from eval.sandbox.program import run_many, run_program, run_tests

__all__ = ["ExecutionResult", "SandboxLimits", "SandboxUnavailable", "TrustedTests", "run_calls", "run_many",
           "run_program", "run_tests"]
