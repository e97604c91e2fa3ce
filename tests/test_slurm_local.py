"""scripts/slurm_local.sh starts and stops only its own Slurm, and never one beside another.

Root only, with the Debian packages installed (`bash scripts/slurm_local.sh start`
installs them). The cluster the suite runs on (scripts/test.sh starts it) makes way
for these tests and is started again after them; where some other Slurm runs on
this machine they are skipped, so that nothing here ever touches it.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import exclusive_slurm_cluster

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "slurm_local.sh"
SUITE_DIR = os.environ.get("SLURM_DIR", "/tmp/headstart-slurm")

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="starts Slurm daemons (root only)"),
    pytest.mark.skipif(any(shutil.which(tool) is None for tool in ("slurmctld", "slurmd", "munged", "sinfo")),
                       reason="no Slurm packages: `bash scripts/slurm_local.sh start` installs them"),
]


def script(command: str, slurm_dir: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SLURM_DIR=slurm_dir)
    env.pop("SLURM_CONF", None)
    return subprocess.run(["bash", str(SCRIPT), command], env=env, capture_output=True, text=True, timeout=300)


def running(name: str) -> list[int]:
    """Live (non-zombie) processes called `name`."""
    pids = []
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if comm == name and state != "Z":
            pids.append(int(pid))
    return pids


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture(scope="module", autouse=True)
def no_other_slurm():
    with exclusive_slurm_cluster():  # no other Slurm test runs on the suite's cluster meanwhile (conftest.py)
        suite_cluster_up = script("status", SUITE_DIR).returncode == 0
        if suite_cluster_up:
            assert script("stop", SUITE_DIR).returncode == 0
        others = running("slurmctld") + running("slurmd")
        if others:
            pytest.skip(f"a Slurm runs on this machine (pids {others}); these tests never touch it")
        yield
        if suite_cluster_up:
            restarted = script("start", SUITE_DIR)
            assert restarted.returncode == 0, restarted.stderr


@pytest.fixture
def slurm_dir():
    path = f"/tmp/headstart-slurm-test-{secrets.token_hex(4)}"
    yield path
    script("stop", path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def impostors(tmp_path):
    """Starts stand-ins for a site's daemons: `sleep` under the names slurmd,
    slurmctld and munged; returns their pids."""
    started = []

    def start() -> dict[str, int]:
        for name in ("slurmd", "slurmctld", "munged"):
            binary = tmp_path / name
            shutil.copy("/bin/sleep", binary)
            started.append(subprocess.Popen([str(binary), "600"]))
        return {Path(p.args[0]).name: p.pid for p in started}

    yield start
    for process in started:
        process.kill()
        process.wait()


def recorded(slurm_dir: str) -> dict[str, list[int]]:
    daemons: dict[str, list[int]] = {}
    for line in Path(slurm_dir, "pids").read_text().splitlines():
        name, pid = line.split()
        daemons.setdefault(name, []).append(int(pid))
    return daemons


def highest_logged_job_id() -> int:
    """The highest job id among the sbatch scripts' logs (logs/%x-%j.out)."""
    ids = [int(m.group(1)) for log in (REPO / "logs").glob("*.out") if (m := re.fullmatch(r".*-(\d+)\.out", log.name))]
    return max(ids, default=0)


def test_start_records_its_daemons_and_stop_ends_them_and_cleans_up(slurm_dir):
    hosts = Path("/etc/hosts").read_bytes()
    # Job ids go on above the logged ones: sbatch appends to logs/%x-%j.out, and a cluster that
    # numbered from 1 again appended a new job's output to an earlier run's job of the same id.
    (REPO / "logs").mkdir(exist_ok=True)
    earlier = REPO / "logs" / f"headstart-earlier-{highest_logged_job_id() + 7}.out"
    earlier.write_text("an earlier cluster's job\n")
    try:
        started = script("start", slurm_dir)
    finally:
        earlier.unlink()
    assert started.returncode == 0, started.stderr
    shown = subprocess.run(["scontrol", "show", "config"], env=dict(os.environ, SLURM_CONF=f"{slurm_dir}/slurm.conf"),
                           capture_output=True, text=True).stdout
    first = re.search(r"^FirstJobId\s*=\s*(\d+)", shown, re.M)
    assert first and int(first.group(1)) == int(earlier.stem.rsplit("-", 1)[1]) + 1, shown[:2000]
    daemons = recorded(slurm_dir)
    assert sorted(daemons) == ["munged", "slurmctld", "slurmd"] and len(daemons["slurmd"]) == 4
    pids = [pid for group in daemons.values() for pid in group]
    assert all(alive(pid) and slurm_dir in Path(f"/proc/{pid}/cmdline").read_text() for pid in pids)
    env = dict(os.environ, SLURM_CONF=f"{slurm_dir}/slurm.conf")
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=env, capture_output=True, text=True)
    assert nodes.stdout.split() == ["idle"] * 4, nodes.stderr
    again = script("start", slurm_dir)  # a second start keeps the running cluster
    assert again.returncode == 0 and "already runs" in again.stdout and recorded(slurm_dir) == daemons
    stopped = script("stop", slurm_dir)
    assert stopped.returncode == 0, stopped.stderr
    assert [pid for pid in pids if alive(pid)] == []
    assert not os.path.exists(slurm_dir)
    assert Path("/etc/hosts").read_bytes() == hosts


def test_stop_leaves_daemons_it_did_not_start_alone(slurm_dir, impostors):
    assert script("start", slurm_dir).returncode == 0
    ours = [pid for group in recorded(slurm_dir).values() for pid in group]
    others = impostors()  # a site's daemons, beside ours
    stopped = script("stop", slurm_dir)
    assert stopped.returncode == 0, stopped.stderr
    assert [name for name, pid in others.items() if not alive(pid)] == []
    assert [pid for pid in ours if alive(pid)] == []


def test_start_refuses_beside_a_running_slurm(slurm_dir, impostors):
    others = impostors()
    refused = script("start", slurm_dir)
    assert refused.returncode != 0
    assert "already runs" in refused.stderr and str(others["slurmd"]) in refused.stderr
    assert not os.path.exists(slurm_dir) and running("munged") == [others["munged"]]
    assert all(alive(pid) for pid in others.values())
