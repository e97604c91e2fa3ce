"""The sandbox's containment, for real: programs run through bwrap by an evaluator
as root (cgroup+seccomp where a cgroup can be made) and by an evaluator under an
unprivileged uid (rlimit+seccomp: no cgroup, its own uid for the programs).

Classes: program text that cannot become a file, zombies under a subreaper, the
sweep of throw-away uids, reach into the sandbox's init, memory held through
descriptors, keyrings."""

from __future__ import annotations

import json
import os
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from eval.sandbox import SandboxLimits, run_many, run_tests
from eval.sandbox.cgroup import CgroupParent
from eval.sandbox.host import UID_RECORDS, Evaluator, UidRecords, sandbox_uid

REPO = Path(__file__).resolve().parent.parent
LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=5, memory_bytes=1 << 30, max_processes=16)
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="throw-away uids exist only for a root evaluator")
USERS = ["root", "unprivileged"]


# An evaluator in a process of its own -------------------------------------------------

def evaluator(code: str, user: str, timeout: float = 240) -> dict:
    """Run `code` in a fresh evaluator process as `user` ("root", or "unprivileged":
    uid/gid 65534); its last line of output is JSON, returned."""
    code = textwrap.dedent(code)
    if user == "root" and os.geteuid() != 0:
        pytest.skip("the root evaluator needs root")
    with tempfile.TemporaryDirectory(prefix="hs-unprivileged-") as keep:
        command = [sys.executable, "-c", code] if user == "root" else unprivileged_command(code, keep)
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def unprivileged_command(code: str, keep: str) -> list[str]:
    """`python -c code` under uid 65534. As root: in a private mount namespace where
    the directories above our interpreter and this checkout that uid may not enter
    (a 0700 /root) are covered by a traversable tmpfs, the needed paths bound back
    (through mount points under `keep`)."""
    if os.geteuid() != 0:
        return [sys.executable, "-c", code]
    for tool in ("unshare", "setpriv", "mount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is needed to run an evaluator under another uid")
    needed = sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, str(REPO))})
    os.chmod(keep, 0o755)
    lines, covers = ["set -e", "mount --make-rprivate /"], []
    for index, path in enumerate(needed):
        blocked = topmost_untraversable(path)
        if blocked is None:
            continue
        os.makedirs(f"{keep}/{index}")
        lines.append(f"mount --bind '{path}' '{keep}/{index}'")
        covers.append((blocked, path, f"{keep}/{index}"))
    for blocked in sorted({b for b, _, _ in covers}):
        lines.append(f"mount -t tmpfs -o mode=755 tmpfs '{blocked}'")
    for _, path, kept in covers:
        lines += [f"mkdir -p '{path}'", f"mount --bind '{kept}' '{path}'"]
    lines.append(f'exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups "$@"')
    return ["unshare", "-m", "sh", "-c", "\n".join(lines), "sh", sys.executable, "-c", code]


def topmost_untraversable(path: str) -> str | None:
    parts = Path(path).parts
    for depth in range(2, len(parts) + 1):
        directory = str(Path(*parts[:depth]))
        if not os.stat(directory).st_mode & 0o001:
            return directory
    return None


# Program text ------------------------------------------------------------------------

def test_what_a_program_text_holds_fails_that_program_only():
    good = "assert 2 + 2 == 4\n"
    programs = [good, "x = '\ud800'\nassert x\n", "#" * ((8 << 20) + 1) + "\n", good, "x = 1\0\n", good]
    results = run_many(programs, LIMITS, workers=2)
    assert [r.passed for r in results] == [True, False, False, True, False, True]
    assert "not valid text" in results[1].stderr and "file-size cap" in results[2].stderr
    assert results[1].containment == results[2].containment == "not run"


def test_a_program_exactly_at_the_file_size_cap_runs():
    limits = SandboxLimits(cpu_seconds=2, wall_seconds=5, max_file_bytes=1 << 20)
    head = "assert 2 + 2 == 4\n"
    program = head + "#" * ((1 << 20) - len(head) - 1) + "\n"
    assert len(program.encode()) == 1 << 20
    assert run_tests(program, limits).passed
    assert not run_tests(program + "\n", limits).passed


# The status channel ------------------------------------------------------------------

# Reopens the bootstrap's status channel (argv[4] of the sandboxed interpreter) through
# /proc/self/fd, reads what it holds ("started"), then exits 0 without completing: the
# evaluator would find no record at all, as when the sandbox never started.
DRAIN_THE_STATUS = """\
import os
channel = open('/proc/self/cmdline', 'rb').read().split(b'\\0')[4].decode()
try:
    reader = os.open(f'/proc/self/fd/{channel}', os.O_RDONLY | os.O_NONBLOCK)
    print('drained', os.read(reader, 4096))
except OSError as error:
    print('refused', error.errno)
raise SystemExit(0)
"""


@pytest.mark.parametrize("user", USERS)
def test_a_program_that_drains_its_status_channel_fails_and_the_next_one_runs(user):
    out = evaluator(f"""
        import json
        from eval.sandbox import SandboxLimits, run_tests
        from eval.sandbox import TrustedTests, run_calls
        limits = SandboxLimits(cpu_seconds=2, wall_seconds=5)
        job = TrustedTests(prelude="", body="assert double(2) == 4\\n", proxies=("double",))
        double = "def double(x):\\n    return 2 * x\\n"
        runs = [lambda: run_tests({DRAIN_THE_STATUS!r}, limits), lambda: run_tests("assert True\\n", limits),
                lambda: run_calls({DRAIN_THE_STATUS!r} + double, job, limits), lambda: run_calls(double, job, limits)]
        results = []
        for run in runs:
            try:
                result = run()
                results.append([result.status, result.stdout])
            except Exception as error:  # what stopped every evaluation at this answer
                results.append([type(error).__name__, str(error)])
        print(json.dumps(results))
        """, user)
    assert [status for status, _ in out] == ["failed", "passed", "failed", "passed"], out
    assert "drained" not in out[0][1] + out[2][1], out  # the channel cannot be reopened at all


# The trusted checker's own limits ----------------------------------------------------

# Answers that cost the program little and the checker much, once its tests use them:
# 150,000 ints of equal hash (a set of them is quadratic to build), and a range of 20
# million items the tests expand (about 800 MiB of ints).
COSTLY_ANSWERS = {
    "cpu": ("def f(x):\n    return [k * (2 ** 61 - 1) for k in range(1, 150_001)]\n", "assert len(set(f(2))) == 1\n"),
    "memory": ("def f(x):\n    return range(2 * 10 ** 7)\n", "assert list(f(2)) == [0]\n"),
}


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("attack", COSTLY_ANSWERS)
def test_answers_that_make_the_checker_work_hard_fail_within_its_own_limits(attack, user):
    program, body = COSTLY_ANSWERS[attack]
    out = evaluator(f"""
        import json, resource
        from eval.sandbox import SandboxLimits
        from eval.sandbox import TrustedTests, run_calls
        limits = SandboxLimits(cpu_seconds=6, wall_seconds=15, memory_bytes=1 << 30)
        result = run_calls({program!r}, TrustedTests(prelude="", body={body!r}, proxies=("f",)), limits)
        used = resource.getrusage(resource.RUSAGE_CHILDREN)  # the checker's, the program's and bwrap's
        print(json.dumps({{"status": result.status, "stderr": result.stderr, "cpu": used.ru_utime + used.ru_stime,
                          "peak_mib": used.ru_maxrss / 1024}}))
        """, user)
    assert out["status"] == "failed", out
    # Under the program's limits (6 s, 1 GiB), the checker used to take as much again.
    assert out["cpu"] < 4 and out["peak_mib"] < 320, out
    assert "CPU limit" in out["stderr"] if attack == "cpu" else "MemoryError" in out["stderr"], out


# Zombies -----------------------------------------------------------------------------

@pytest.mark.parametrize("user", USERS)
def test_an_evaluator_that_is_a_subreaper_is_left_no_zombie(user):
    out = evaluator("""
        import ctypes, json, os
        ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER, as an init-less container's harness
        from eval.sandbox import SandboxLimits, run_many
        from eval.sandbox import TrustedTests, run_calls
        detached = "import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n    time.sleep(60)\\nassert True\\n"
        programs = ["assert True\\n", "import time\\ntime.sleep(60)\\n", detached, "assert False\\n"] * 2
        limits = SandboxLimits(cpu_seconds=2, wall_seconds=3)
        statuses = [r.status for r in run_many(programs, limits, workers=2)]
        job = TrustedTests(prelude="", body="assert f(2) == 4\\n", proxies=("f",))
        statuses.append(run_calls("def f(x):\\n    return x * 2\\n", job, limits).status)
        def zombie_child(pid):
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                return False
            return fields[0] == "Z" and int(fields[1]) == os.getpid()
        zombies = [p for p in os.listdir("/proc") if p.isdigit() and zombie_child(p)]
        print(json.dumps({"statuses": statuses, "zombies": zombies}))
        """, user)
    assert out["statuses"] == ["passed", "timeout", "passed", "failed"] * 2 + ["passed"]
    assert out["zombies"] == []


# The sweep of throw-away uids --------------------------------------------------------

def _dead_evaluator() -> Evaluator:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return Evaluator(gone.pid, 1)  # a pid that no longer runs, as no process ever will again


def _sleeper(uid: int) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "300"], user=uid, group=uid, extra_groups=[])


def _run_one_program_in_a_new_evaluator() -> None:
    assert evaluator("""
        import json
        from eval.sandbox import SandboxLimits, run_tests
        print(json.dumps(run_tests("assert True\\n", SandboxLimits(cpu_seconds=2, wall_seconds=5)).status))
        """, "root") == "passed"


@needs_root
def test_a_process_of_an_unrecorded_uid_in_the_range_survives_a_new_evaluators_sweep():
    # The old rule: every uid of the range whose evaluator pid is gone is a leftover.
    stranger = _sleeper(sandbox_uid(_dead_evaluator().pid, 7))
    try:
        _run_one_program_in_a_new_evaluator()
        time.sleep(0.2)
        assert stranger.poll() is None, "a process the sandbox never started was killed"
    finally:
        stranger.kill()
        stranger.wait()


@needs_root
def test_a_recorded_uid_of_a_dead_evaluator_is_swept_and_forgotten():
    dead = _dead_evaluator()
    uid = sandbox_uid(dead.pid, 9)
    records = UidRecords()
    records.issue(uid, dead)
    leftover = _sleeper(uid)
    try:
        _run_one_program_in_a_new_evaluator()
        time.sleep(0.2)
        assert leftover.poll() == -signal.SIGKILL
        assert uid not in records.owners()
    finally:
        leftover.kill()
        leftover.wait()
        records.release(uid)


@needs_root
def test_a_uid_is_recorded_while_its_program_runs_and_released_after():
    import threading
    me = Evaluator.current()
    ours = lambda: [uid for uid, owner in UidRecords().owners().items() if owner == me]  # noqa: E731
    thread = threading.Thread(target=run_tests, args=("import time\ntime.sleep(2)\n", LIMITS))
    thread.start()
    deadline, seen = time.monotonic() + 10, []
    while not seen and time.monotonic() < deadline:
        seen = ours()
        time.sleep(0.05)
    owner = Path(UID_RECORDS, str(seen[0])).stat().st_uid if seen else None
    thread.join()
    assert len(seen) == 1 and owner == 0
    assert ours() == []


# The sandbox's init is out of reach --------------------------------------------------

REACH_THE_INIT = """\
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
def refused(result):
    return result == -1 and ctypes.get_errno() == errno.EPERM
reached = []
if not refused(libc.ptrace(0x4206, 1, None, None)):  # PTRACE_SEIZE the init
    reached.append('ptrace')
class IoVec(ctypes.Structure):
    _fields_ = [('base', ctypes.c_void_p), ('length', ctypes.c_size_t)]
buffer = ctypes.create_string_buffer(8)
vector = IoVec(ctypes.addressof(buffer), 8)
if not refused(libc.process_vm_readv(1, ctypes.byref(vector), 1, ctypes.byref(vector), 1, 0)):
    reached.append('process_vm_readv')
pidfd = libc.pidfd_open(1, 0)
if pidfd >= 0 and not refused(libc.pidfd_getfd(pidfd, 0, 0)):
    reached.append('pidfd_getfd')
print(json.dumps(reached))
"""


@pytest.mark.parametrize("user", USERS)
def test_a_program_cannot_reach_the_sandboxs_init(user):
    out = evaluator(f"""
        import json
        from eval.sandbox import SandboxLimits, run_program
        result = run_program({REACH_THE_INIT!r}, SandboxLimits(cpu_seconds=2, wall_seconds=5))
        print(result.stdout.strip().splitlines()[-1] if result.stdout.strip() else json.dumps(result.stderr))
        """, user)
    assert out == []


# Seizes the sandbox's init, makes it call prctl(PR_SET_PDEATHSIG, 0) and setsid()
# (so neither bwrap's exit nor its process group takes it along), leaves a child
# behind and exits 0. The evaluator must still end every process of the program.
TRACE_THE_INIT = """\
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
NAMES = "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss fs_base gs_base ds es fs gs"
class Regs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in NAMES.split()]
def ptrace(request, data=None):
    if libc.ptrace(request, 1, None, data) != 0:
        raise OSError(ctypes.get_errno(), f"ptrace {request:#x}")
def inject(saved, number, *args):
    regs = Regs.from_buffer_copy(saved)
    regs.rax, regs.orig_rax, regs.rip = number, (1 << 64) - 1, saved.rip - 2
    for name, value in zip(("rdi", "rsi"), args):
        setattr(regs, name, value)
    ptrace(13, ctypes.byref(regs))  # SETREGS
    ptrace(9)                       # SINGLESTEP over the syscall instruction
    os.waitpid(1, 0x40000000)
ptrace(0x4206)                      # SEIZE
ptrace(0x4207)                      # INTERRUPT
os.waitpid(1, 0x40000000)
saved = Regs()
ptrace(12, ctypes.byref(saved))     # GETREGS
inject(saved, 157, 1, 0)            # prctl(PR_SET_PDEATHSIG, 0)
inject(saved, 112)                  # setsid()
restore = Regs.from_buffer_copy(saved)
if saved.rax >= (1 << 64) - 516:    # -ERESTART*: run the interrupted call again
    restore.rip, restore.rax = saved.rip - 2, saved.orig_rax
ptrace(13, ctypes.byref(restore))
ptrace(17)                          # DETACH
if os.fork() == 0:
    os.setsid()
    libc.prctl(15, b"NAME", 0, 0, 0)
    time.sleep(120)
    os._exit(0)
time.sleep(0.2)
print("init detached")
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the attack injects x86-64 system calls")
@pytest.mark.parametrize("user", USERS)
def test_a_program_that_traces_the_init_does_not_outlive_the_run(user):
    name = f"hs{secrets.token_hex(6)}"
    program = TRACE_THE_INIT.replace("NAME", name)
    try:
        out = evaluator(f"""
            import json
            from eval.sandbox import SandboxLimits, run_program
            result = run_program({program!r}, SandboxLimits(cpu_seconds=5, wall_seconds=10))
            print(json.dumps(result.stdout))
            """, user)
        time.sleep(0.5)
        assert by_comm(name) == [], f"the program outlived its run ({out!r})"
    finally:
        for pid in by_comm(name):
            os.kill(pid, signal.SIGKILL)


def by_comm(name: str) -> list[int]:
    found = []
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read()
        except OSError:
            continue
        if f"({name})" in fields and fields.rsplit(")", 1)[1].split()[0] != "Z":
            found.append(int(pid))
    return found


# Memory held through descriptors, which RLIMIT_AS does not count -----------------------

HOLD = {
    "memfd": """\
import os
fds, block = [], b"x" * (8 << 20)
while len(fds) < 96:
    fd = os.memfd_create("m")
    os.write(fd, block)
    fds.append(fd)
""",
    "SysV shared memory": """\
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for _ in range(6):
    segment = libc.shmget(0, 128 << 20, 0o1000 | 0o600)
    address = libc.shmat(segment, None, 0)
    assert address not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    ctypes.memset(address, 1, 128 << 20)
    libc.shmdt(ctypes.c_void_p(address))
""",
    "socket buffers": """\
import resource, socket
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
pairs, queued, chunk = [], 0, b"x" * 65536
while queued < 768 << 20:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for sock, option in ((a, socket.SO_SNDBUF), (b, socket.SO_RCVBUF)):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, 1 << 30)
        except OSError:
            pass
    a.setblocking(False)
    pairs.append((a, b))
    try:
        while True:
            queued += a.send(chunk)
    except BlockingIOError:
        pass
""",
}


@pytest.mark.parametrize("user", USERS)
def test_memory_held_through_descriptors_stays_within_the_memory_limit(user):
    # 768 MiB held by one process capped at 512 MiB of address space.
    programs = {kind: code + "print('held 768 MiB')\n" for kind, code in HOLD.items()}
    out = evaluator(f"""
        import json
        from eval.sandbox import SandboxLimits, run_many
        limits = SandboxLimits(cpu_seconds=10, wall_seconds=20, memory_bytes=512 << 20)
        programs = {programs!r}
        results = run_many(list(programs.values()), limits, workers=1)
        print(json.dumps({{kind: r.stdout + r.stderr[-300:] for kind, r in zip(programs, results)}}))
        """, user)
    assert {kind: "held" in text for kind, text in out.items()} == {kind: False for kind in HOLD}, out


# Keyrings ----------------------------------------------------------------------------

@pytest.mark.parametrize("user", USERS)
def test_programs_share_no_keys_with_the_evaluator_or_each_other(user):
    secret = f"hs-secret-{secrets.token_hex(4)}"
    keys = """
        import ctypes, json
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        KEYCTL, ADD_KEY, SESSION = {keyctl}, {add_key}, -3
        def search(description):
            return libc.syscall(KEYCTL, 10, SESSION, b"user", description.encode(), 0)  # KEYCTL_SEARCH
        def add(description):
            return libc.syscall(ADD_KEY, b"user", description.encode(), b"payload", 7, SESSION)
        """
    numbers = {"x86_64": (250, 248), "aarch64": (219, 217)}.get(platform.machine())
    if numbers is None:
        pytest.skip("keyctl numbers known for x86_64 and aarch64 only")
    keys = textwrap.dedent(keys).format(keyctl=numbers[0], add_key=numbers[1])
    first = keys + textwrap.dedent(f"""
        try:
            listed = open("/proc/keys").read()
        except OSError:
            listed = ""
        print(json.dumps({{"found": search({secret!r}) >= 0, "added": add("hs-left-behind") >= 0,
                          "listed": {secret!r} in listed}}))
        """)
    second = keys + 'print(json.dumps({"found": search("hs-left-behind") >= 0}))\n'
    out = evaluator(keys + textwrap.dedent(f"""
        libc.syscall(KEYCTL, 1, None)  # KEYCTL_JOIN_SESSION_KEYRING: a keyring of this evaluator's own
        assert add({secret!r}) >= 0
        from eval.sandbox import SandboxLimits, run_program
        limits = SandboxLimits(cpu_seconds=2, wall_seconds=5)
        answers = [run_program(code, limits) for code in ({first!r}, {second!r})]
        print(json.dumps([json.loads(a.stdout.strip().splitlines()[-1]) for a in answers]))
        """), user)
    assert out == [{"found": False, "added": False, "listed": False}, {"found": False}]


# What contained each verdict ---------------------------------------------------------

@pytest.mark.parametrize("user", USERS)
def test_each_result_names_its_containment(user):
    out = evaluator("""
        import json
        from eval.sandbox import SandboxLimits, run_tests
        print(json.dumps(run_tests("assert True\\n", SandboxLimits(cpu_seconds=2, wall_seconds=5)).containment))
        """, user)
    with_cgroup = user == "root" and CgroupParent.find() is not None
    assert out == f"{'cgroup' if with_cgroup else 'rlimit'}+seccomp, tests in the program's process"
