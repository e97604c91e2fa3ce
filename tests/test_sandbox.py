"""Hostile programs end as failures within their limits and touch nothing outside."""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import eval.sandbox as sandbox
from eval.benchmarks.mbpp import MBPP
from eval.sandbox import SandboxLimits, TrustedTests, run_calls, run_many, run_tests
from eval.sandbox.cgroup import PREFIX, CgroupParent
from eval.sandbox.cgroup import join as join_cgroup
from eval.sandbox.host import Evaluator, UidRecords, sandbox_uid

REPO = Path(__file__).resolve().parent.parent
LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=5, memory_bytes=1 << 30, max_processes=16)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="looks for processes of the throw-away uids (root only)")
needs_cgroup = pytest.mark.skipif(CgroupParent.find() is None, reason="no cgroup we may write: memory is capped per process")
LIBC = ctypes.CDLL(None, use_errno=True)
# Host places a program must never be able to write to.
SHARED_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/run/lock", "/dev/shm")
KILL_THE_PARENT = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)\n"


def assert_contained(program: str, limits: SandboxLimits = LIMITS) -> None:
    start = time.monotonic()
    result = run_tests(program, limits)
    assert not result.passed
    assert time.monotonic() - start < limits.wall_seconds + 5


def test_a_correct_program_passes_and_a_wrong_one_fails():
    assert run_tests("def f():\n    return 1\n\nassert f() == 1\n", LIMITS).passed
    assert not run_tests("assert 1 == 2\n", LIMITS).passed


def test_infinite_loop_stops_at_the_cpu_limit():
    result = run_tests("while True:\n    pass\n", LIMITS)
    assert not result.passed and result.status == "timeout"


def test_sleeping_past_the_wall_limit_is_a_timeout():
    result = run_tests("import time\ntime.sleep(60)\n", LIMITS)
    assert not result.passed and result.status == "timeout"
    assert result.seconds < LIMITS.wall_seconds + 2


def test_ten_gigabyte_allocation_fails():
    assert_contained("x = bytearray(10 * 1024 ** 3)\n")


def test_exit_zero_before_the_asserts_is_a_failure():
    result = run_tests("import sys\nsys.exit(0)\nassert False\n", LIMITS)
    assert result.returncode == 0 and not result.passed


def test_infinite_output_is_capped():
    result = run_tests("while True:\n    print('x' * 1000)\n", LIMITS)
    assert not result.passed and len(result.stdout) <= LIMITS.max_output_bytes


def raw_controls(text: str) -> list[str]:
    """The control characters in `text` but newline and tab (C0, DEL, C1)."""
    return sorted({c for c in text if (ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0) and c not in "\n\t"})


def test_control_characters_of_the_program_reach_the_result_escaped():
    clear_screen = "\0\x1b[2J\r\x9b"
    result = run_tests(f"import sys\nprint({clear_screen!r})\nsys.stderr.write({clear_screen!r})\nassert False\n", LIMITS)
    assert raw_controls(result.stdout) == raw_controls(result.stderr) == []
    assert "\\x00\\x1b[2J\\x0d\\x9b" in result.stdout and "\\x00\\x1b[2J\\x0d\\x9b" in result.stderr
    assert "AssertionError" in result.stderr and "\tx\n" in run_tests("print('\\tx')\n", LIMITS).stdout
    # Quoted in the trusted tests' verdict: the message of an exception the program raised.
    job = TrustedTests(prelude="", body="assert double(2) == 4\n", proxies=("double",))
    called = run_calls(f"def double(x):\n    raise ValueError({clear_screen!r})\n", job, LIMITS)
    assert not called.passed and raw_controls(called.stderr) == []
    assert "ValueError: \\x00\\x1b[2J\\x0d\\x9b" in called.stderr


def test_a_long_non_ascii_message_reaches_the_verdict():
    # Each of these characters is 6 or 12 bytes once JSON escapes it: 2,000 of them are far
    # over the 4,096 bytes of a verdict.
    job = TrustedTests(prelude="", body="assert double(2) == 4, 'ü' * 3000\n", proxies=("double",))
    asserted = run_calls("def double(x):\n    return 5\n", job, LIMITS)
    assert not asserted.passed and "AssertionError: üüü" in asserted.stderr, asserted.stderr
    job = TrustedTests(prelude="", body="assert double(2) == 4\n", proxies=("double",))
    raised = run_calls("def double(x):\n    raise ValueError('😀' * 5000)\n", job, LIMITS)
    assert not raised.passed and "ValueError: 😀😀😀" in raised.stderr, raised.stderr
    assert "no verdict" not in asserted.stderr + raised.stderr


@needs_root
def test_fork_bomb_is_contained_and_cleaned_up():
    program = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    assert_contained(program)
    time.sleep(0.2)
    assert _survivors() == []


def test_deleting_files_outside_the_temp_dir_changes_nothing(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    program = f"import os, shutil\nos.system('rm -rf {victim}')\nshutil.rmtree({str(victim)!r})\n"
    assert_contained(program)
    assert (victim / "keep.txt").read_text() == "precious"


def test_killing_the_parent_and_opening_sockets_fail():
    # Its parent is the sandbox's init, which ignores it: the evaluator is out of its sight.
    result = run_tests(KILL_THE_PARENT + "print('alive')\n", LIMITS)
    assert result.stdout == "alive\n"
    assert_contained("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)\n")


def test_the_evaluator_keeps_going_after_hostile_programs():
    programs = ["while True:\n    pass\n", "import sys\nsys.exit(0)\n", "assert 2 + 2 == 4\n"]
    results = run_many(programs, LIMITS, workers=2)
    assert [r.passed for r in results] == [False, False, True]


def hostile_suite(victim: Path, marker: str, secret: Path, ipc_key: int, mq_name: str) -> dict[str, str]:
    """Every hostile behaviour of the issue, aimed at `victim`, the root-only
    `secret`, the shared writable directories (where `marker` files would betray
    an escape) and the host's IPC (`ipc_key`, `mq_name`)."""
    escapes = "".join(f"    open({f'{d}/{marker}'!r}, 'w').write('x')\n" for d in SHARED_WRITABLE_DIRS)
    suite = {
        "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "memory bomb": "chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 26))\n",
        "infinite output": "while True:\n    print('x' * 4096)\n",
        "delete outside": f"import os, shutil\nos.system('rm -rf {victim}')\nshutil.rmtree({str(victim)!r})\n",
        "overwrite outside": f"open({str(victim / 'keep.txt')!r}, 'w').write('gone')\n",
        "write shared dirs": f"for _ in [0]:\n{escapes}assert False\n",
        "kill the parent": KILL_THE_PARENT + "assert False\n",
        "open sockets": "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)\n",
        "sleep past the limit": "import time\ntime.sleep(600)\n",
        "exit 0 before the asserts": "import sys\nsys.exit(0)\nassert False\n",
        "detached child": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\nassert False\n",
        "forge the pass token": FORGE_THE_TOKEN,
        "output swapped for a FIFO": swap_the_output("os.mkfifo(name)"),
        "output swapped for a symlink": swap_the_output(f"os.symlink({str(secret)!r}, name)"),
        "read root-only files": read_files([str(secret), "/etc/shadow"]),
        "IPC objects that outlive it": make_ipc_objects(ipc_key, mq_name),
        "private tmpfs in a new user namespace": MOUNT_A_TMPFS_IN_A_USER_NAMESPACE,
        "fill the disk": FILL_THE_WORKING_DIRECTORY,
    }
    if CgroupParent.find() is not None:
        suite["children over the memory cap"] = CHILDREN_OVER_THE_MEMORY_CAP
    return suite


# Reads every place a pass token could hide from a program, prints what looks
# like one, and stops before the asserts.
FORGE_THE_TOKEN = """\
import os, re, sys
seen = set()
def scan(text):
    seen.update(re.findall(r"[0-9a-f]{32}", text))
for path in {__file__, sys.argv[0], *os.listdir('.')}:
    try:
        scan(open(path, errors='replace').read())
    except OSError:
        pass
for name in ('cmdline', 'environ'):
    scan(open(f'/proc/self/{name}', 'rb').read().decode(errors='replace'))
scan(repr(sys._getframe().f_code.co_consts))
for token in seen:
    print(token, flush=True)
sys.exit(0)
assert False
"""

# 23 files of 7 MiB (each under max_file_bytes): 161 MiB, past max_disk_bytes.
FILL_THE_WORKING_DIRECTORY = """\
for i in range(23):
    with open(f'fill-{i}', 'wb') as handle:
        handle.write(b'x' * (7 << 20))
print('filled 161 MiB')
"""

# A new user namespace, in it a mount namespace and a tmpfs of 1 GiB, filled
# past max_disk_bytes.
MOUNT_A_TMPFS_IN_A_USER_NAMESPACE = """\
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()
assert libc.unshare(0x10000000 | 0x00020000) == 0, 'unshare: %d' % ctypes.get_errno()
open('/proc/self/setgroups', 'w').write('deny')
open('/proc/self/uid_map', 'w').write(f'0 {uid} 1')
open('/proc/self/gid_map', 'w').write(f'0 {gid} 1')
os.mkdir('big')
assert libc.mount(b'tmpfs', b'big', b'tmpfs', 0, b'size=1g') == 0, 'mount: %d' % ctypes.get_errno()
for i in range(23):
    with open(f'big/{i}', 'wb') as handle:
        handle.write(b'x' * (7 << 20))
print('escaped with 161 MiB')
"""

# Four children of 300 MiB each: each under LIMITS' 1 GiB, together over it.
CHILDREN_OVER_THE_MEMORY_CAP = """\
import os, time
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        block = b'x' * (300 << 20)
        time.sleep(2)
        os._exit(0)
    children.append(pid)
statuses = [os.waitpid(pid, 0)[1] for pid in children]
print('statuses', statuses)
assert statuses == [0, 0, 0, 0]
"""


def swap_the_output(make: str) -> str:
    """Replaces the files the evaluator used to read its output from."""
    return ("import os\nfor name in ('.stdout', '.stderr'):\n    try:\n        os.unlink(name)\n"
            f"    except OSError:\n        pass\n    {make}\nassert False\n")


def read_files(paths: list[str]) -> str:
    return (f"for path in {paths!r}:\n    try:\n        print(open(path).read(), flush=True)\n"
            "    except OSError:\n        pass\nassert False\n")


def make_ipc_objects(key: int, mq_name: str) -> str:
    """SysV shared memory, message queue and semaphore, and a POSIX message queue."""
    return f"""\
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
assert libc.shmget({key}, 4096, 0o1000 | 0o600) >= 0
assert libc.msgget({key + 1}, 0o1000 | 0o600) >= 0
assert libc.semget({key + 2}, 1, 0o1000 | 0o600) >= 0
assert libc.mq_open({mq_name.encode()!r}, os.O_CREAT | os.O_RDWR, 0o600, None) >= 0
print('created', flush=True)
assert False
"""


def snapshot(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(directory.rglob("*"))}


@needs_root
def test_the_hostile_suite_fails_within_its_limits_and_changes_nothing_outside(tmp_path):
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "keep.txt").write_text("precious")
    (victim / "sub" / "data.bin").write_bytes(os.urandom(256))
    before = snapshot(victim)
    marker = f"headstart-escape-{secrets.token_hex(6)}"
    secret = root_only_secret(tmp_path)
    ipc_key, mq_name = ipc_names()
    programs = hostile_suite(victim, marker, secret, ipc_key, mq_name)
    start = time.monotonic()
    results = run_many(list(programs.values()) + ["assert 2 + 2 == 4\n"], LIMITS, workers=2)
    # Two workers: the batch cannot take longer than its programs' wall limits, halved, plus slack.
    assert time.monotonic() - start < (len(programs) + 1) * LIMITS.wall_seconds / 2 + 20
    for name, result in zip(programs, results):
        assert not result.passed, name
        assert result.seconds < LIMITS.wall_seconds + 2, name
    assert results[-1].passed  # the run goes on after every hostile program
    assert snapshot(victim) == before
    assert [d for d in SHARED_WRITABLE_DIRS if os.path.exists(f"{d}/{marker}")] == []
    assert not any(secret.read_text() in r.stdout + r.stderr for r in results)  # nothing root-only reached it
    assert _host_ipc_leftovers(ipc_key, mq_name) == []
    time.sleep(0.2)
    assert _survivors() == []


def test_the_pass_verdict_is_nowhere_the_program_can_read_it():
    result = run_tests(FORGE_THE_TOKEN, LIMITS)
    assert result.returncode == 0 and not result.passed


def test_the_output_cannot_be_swapped_for_a_fifo_to_hang_the_evaluator():
    evaluator = start_evaluator("cpu_seconds=2, wall_seconds=5")
    try:
        out, _ = evaluator.communicate(swap_the_output("os.mkfifo(name)"), timeout=60)
    except subprocess.TimeoutExpired:
        evaluator.kill()
        evaluator.communicate()
        pytest.fail("the evaluator hung reading the program's FIFO")
    assert out.split() == ["failed"]


def test_the_output_cannot_be_swapped_for_a_symlink_to_a_root_only_file(tmp_path):
    secret = root_only_secret(tmp_path)
    result = run_tests(swap_the_output(f"os.symlink({str(secret)!r}, name)"), LIMITS)
    assert secret.read_text() not in result.stdout + result.stderr


def test_the_program_has_no_capabilities_and_reads_no_root_only_file(tmp_path):
    secret = root_only_secret(tmp_path)
    program = f"""\
caps = {{line.split(':')[0]: int(line.split()[1], 16) for line in open('/proc/self/status') if line.startswith('Cap')}}
print(caps)
assert set(caps.values()) == {{0}}
for path in {[str(secret), "/etc/shadow", "/root/.bashrc"]!r}:
    try:
        open(path).read()
    except OSError:
        continue
    raise AssertionError('read ' + path)
"""
    result = run_tests(program, LIMITS)
    assert result.passed, result.stdout + result.stderr


def test_ipc_objects_die_with_the_program():
    ipc_key, mq_name = ipc_names()
    result = run_tests(make_ipc_objects(ipc_key, mq_name), LIMITS)
    assert "created" in result.stdout, result.stderr
    assert _host_ipc_leftovers(ipc_key, mq_name) == []


@needs_cgroup
def test_forked_children_share_one_memory_cap():
    result = run_tests(CHILDREN_OVER_THE_MEMORY_CAP, LIMITS)
    assert not result.passed, result.stdout


def test_no_user_namespace_so_no_tmpfs_past_the_caps():
    result = run_tests(MOUNT_A_TMPFS_IN_A_USER_NAMESPACE, LIMITS)
    assert "escaped" not in result.stdout and not result.passed


def test_the_working_directory_cannot_fill_the_disk():
    result = run_tests(FILL_THE_WORKING_DIRECTORY, LIMITS)
    assert "filled" not in result.stdout and not result.passed
    assert "No space left on device" in result.stderr


def test_killing_the_evaluator_kills_the_program_and_leaves_nothing_behind():
    name = f"hs{secrets.token_hex(6)}"  # the program's process name (comm, 15 characters at most)
    program = (f"import ctypes, time\nctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)\n"
               f"open({name!r}, 'w').write('x')\ntime.sleep(120)\n")
    evaluator = start_evaluator("cpu_seconds=60, wall_seconds=60")
    evaluator.stdin.write(program)
    evaluator.stdin.close()
    deadline = time.monotonic() + 60
    while not _by_comm(name):
        assert time.monotonic() < deadline and evaluator.poll() is None, "the program never started"
        time.sleep(0.1)
    evaluator.kill()
    evaluator.wait()
    deadline = time.monotonic() + 5
    while _by_comm(name) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = _by_comm(name)
    leftovers = glob.glob(f"/tmp/{name}") + glob.glob(f"/tmp/*/{name}")
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    assert survivors == [] and leftovers == []


@needs_root
def test_a_new_evaluator_sweeps_what_a_killed_one_left():
    gone = subprocess.Popen(["true"])
    gone.wait()  # an evaluator pid that no longer runs
    uid = sandbox_uid(gone.pid, 7)
    UidRecords().issue(uid, Evaluator(gone.pid, 1))  # as that evaluator did before it used the uid
    stray = subprocess.Popen(["sleep", "300"], user=uid, group=uid, extra_groups=[])
    strays, cgroup = [stray], None
    parent = CgroupParent.find()
    if parent is not None:
        cgroup = parent.create(7, 64 << 20, 8, owner=gone.pid)
        procs = cgroup.procs_files()
        strays.append(subprocess.Popen(["sleep", "300"], preexec_fn=lambda: join_cgroup(procs)))
    try:
        evaluator = start_evaluator("cpu_seconds=2, wall_seconds=5")
        out, _ = evaluator.communicate("assert True\n", timeout=60)
        assert out.split() == ["passed"]
        time.sleep(0.2)
        assert [p.poll() for p in strays] == [-signal.SIGKILL] * len(strays)
        assert cgroup is None or not any(leaf.exists() for leaf in cgroup.leaves)
    finally:
        for p in strays:
            p.kill()
            p.wait()
        if cgroup is not None:
            cgroup.destroy()
            parent.sweep()
        UidRecords().release(uid)


def test_a_sweep_passes_over_a_directory_another_sweep_removed_first(tmp_path, monkeypatch):
    """Two evaluators starting together both sweep a dead one's directories: the one that lists a
    directory the other has just removed goes on (it once failed the evaluator's first program)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    raced, left = (tmp_path / f"{PREFIX}{gone.pid}", tmp_path / f"{PREFIX}{gone.pid + 1_000_000}")
    for base in (raced, left):  # no program cgroups left in them (a plain directory is no cgroupfs)
        base.mkdir()
    listed = Path.iterdir

    def removed_meanwhile(path: Path):
        if path == raced:
            raced.rmdir()
        return listed(path)

    monkeypatch.setattr(Path, "iterdir", removed_meanwhile)
    CgroupParent(2, (tmp_path,)).sweep()
    assert not raced.exists() and not left.exists()


def test_without_bubblewrap_no_program_runs(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(sandbox.SandboxUnavailable, match="bubblewrap"):
        run_tests("assert True\n", LIMITS)


def test_without_bubblewrap_an_evaluation_stops_naming_the_request(data_dir, monkeypatch):
    from eval.evaluation.runner import _scores
    benchmark = MBPP(str(data_dir / "mbpp" / "mbpp.jsonl"), limits=LIMITS)
    request = benchmark.load(limit=1)[0]
    answer = "```python\ndef remove_Occ(s, ch):\n    return s\n```"
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(sandbox.SandboxUnavailable, match=f"^{request.request_id}: .* a rerun resumes there.*bubblewrap"):
        _scores(benchmark, request, {"base_answer": answer, "stream_answer": answer})


def test_the_evaluator_scores_hostile_answers_as_failures_and_carries_on(data_dir):
    benchmark = MBPP(str(data_dir / "mbpp" / "mbpp.jsonl"), limits=LIMITS)
    request = benchmark.load(limit=1)[0]
    answers = ["```python\nimport sys\ndef remove_Occ(s, ch):\n    sys.exit(0)\nremove_Occ('', '')\n```",
               "```python\ndef remove_Occ(s, ch):\n    while True:\n        pass\n```",
               "```python\ndef remove_Occ(s, ch):\n    return 'x' * (1 << 40)\n```"]
    assert [benchmark.score(request, a).passed for a in answers] == [False, False, False]
    solved = ("```python\ndef remove_Occ(s, ch):\n    s = s.replace(ch, '', 1)\n    i = s.rfind(ch)\n"
              "    return s if i < 0 else s[:i] + s[i + 1:]\n```")
    assert benchmark.score(request, solved).passed


def root_only_secret(directory: Path) -> Path:
    secret = directory / "secret"
    secret.write_text(f"secret-{secrets.token_hex(16)}")
    secret.chmod(0o600)
    return secret


def ipc_names() -> tuple[int, str]:
    return secrets.randbelow(1 << 29) + (1 << 20), f"/headstart-{secrets.token_hex(6)}"


def _host_ipc_leftovers(key: int, mq_name: str) -> list[str]:
    """The program's IPC objects still on the host, removed as they are found."""
    found = []
    for kind, key_of, remove in (("shm", key, lambda i: LIBC.shmctl(i, 0, None)),
                                 ("msg", key + 1, lambda i: LIBC.msgctl(i, 0, None)),
                                 ("sem", key + 2, lambda i: LIBC.semctl(i, 0, 0))):
        with open(f"/proc/sysvipc/{kind}") as handle:
            rows = [line.split() for line in handle.readlines()[1:]]
        for row in rows:
            if int(row[0]) == key_of:
                found.append(f"{kind} {key_of}")
                remove(int(row[1]))
    queue = LIBC.mq_open(mq_name.encode(), os.O_RDONLY)
    if queue >= 0:
        found.append(f"mqueue {mq_name}")
        LIBC.mq_close(queue)
        LIBC.mq_unlink(mq_name.encode())
    return found


def start_evaluator(limits: str) -> subprocess.Popen:
    """A separate evaluator process: runs the program read from stdin, prints its status."""
    code = ("import sys\nfrom eval.sandbox import SandboxLimits, run_tests\n"
            f"print(run_tests(sys.stdin.read(), SandboxLimits({limits})).status, flush=True)\n")
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def _by_comm(name: str) -> list[int]:
    pids = []
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            with open(f"/proc/{pid}/comm") as handle:
                if handle.read().strip() == name and not _zombie(pid):
                    pids.append(int(pid))
        except OSError:
            continue
    return pids


def _survivors() -> list[str]:
    """Live processes under a throw-away uid of this evaluator."""
    own = range(sandbox_uid(os.getpid(), 0), sandbox_uid(os.getpid() + 1, 0))
    return [p for p in os.listdir("/proc") if p.isdigit() and _uid(p) in own and not _zombie(p)]


def _uid(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except FileNotFoundError:
        return -1


def _zombie(pid: str) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True
