#!/usr/bin/env bash
# A real four-node Slurm cluster on this one machine, for the tests and CI (root).
#   bash scripts/slurm_local.sh start    # install (Debian packages) if needed, configure, start
#   bash scripts/slurm_local.sh stop     # stop what `start` started, remove its state
#   bash scripts/slurm_local.sh status   # exit 0 when ours runs, 3 when not
# Clients need SLURM_CONF=$SLURM_DIR/slurm.conf (printed by `start`).
#
# Everything it starts is its own: a munged with its own key and socket, one
# slurmctld and four slurmd, their configuration, state, logs and pid files, all
# under $SLURM_DIR (default /tmp/headstart-slurm). It records their pids and
# `stop` ends those processes only (each checked to still be the one it started),
# then removes $SLURM_DIR and the /etc/hosts line it added, if it added one.
# It refuses to start beside a Slurm that already runs here (a site's slurmd
# or slurmctld, or another copy of this cluster; exit 4): the ports would clash
# and `make test` must never touch the site's Slurm.
set -euo pipefail
SLURM_DIR=${SLURM_DIR:-/tmp/headstart-slurm}
case "$SLURM_DIR" in
  /?*/?*) ;;
  *) echo "slurm_local.sh: SLURM_DIR must be an absolute path below a top-level directory, not '$SLURM_DIR'" >&2; exit 2 ;;
esac
SLURM_DIR=${SLURM_DIR%/}
CONF=$SLURM_DIR/slurm.conf
PIDS=$SLURM_DIR/pids            # "name pid" per line: the daemons this script started
MARK=$SLURM_DIR/.headstart-slurm  # what `stop` checks before it removes $SLURM_DIR
MUNGE=$SLURM_DIR/munge
# Four nodes: the suite runs its Slurm tests in two streams (tests/conftest.py), each with two-node
# jobs, and a stream's --exclusive jobs still find two whole nodes free.
NODES=(n1 n2 n3 n4)
HOSTS_LINE="127.0.0.1 ${NODES[*]}  # headstart-slurm $SLURM_DIR"
LOGS=$(cd "$(dirname "$0")/.." && pwd)/logs  # where slurm/*.sbatch write logs/%x-%j.out

# The first job id: one above the highest in logs/. The sbatch scripts append to their log
# (--open-mode=append keeps a requeued job's restarts in one file); a new cluster numbering from 1
# again would append its jobs to the logs of an earlier cluster's jobs of the same ids. Ids at or
# above Slurm's default MaxJobId (a site's, say) are not ours and do not count.
first_job_id() {
  local highest
  highest=$(find "$LOGS" -maxdepth 1 -name '*-[0-9]*.out' -printf '%f\n' 2>/dev/null \
    | sed -n 's/.*-\([0-9][0-9]*\)\.out$/\1/p' | awk '$1 < 67043327' | sort -n | tail -n 1 || true)
  echo $(( ${highest:-0} + 1 ))
}

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
    && command -v sinfo >/dev/null && return
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >/dev/null
}

# alive PID: it runs (a zombie has ended, it only awaits its parent).
alive() {
  local state
  state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [ -n "$state" ] && [ "$state" != Z ]
}

# ours NAME PID: PID still runs NAME started with our $SLURM_DIR on its command line.
ours() {
  alive "$2" && [ "$(cat "/proc/$2/comm" 2>/dev/null)" = "$1" ] || return 1
  tr '\0' ' ' < "/proc/$2/cmdline" 2>/dev/null | grep -qF -- "$SLURM_DIR/"
}

running_ours() {  # the recorded daemons that still run, "name pid" per line
  [ -f "$PIDS" ] || return 0
  while read -r name pid; do
    if ours "$name" "$pid"; then echo "$name $pid"; fi
  done < "$PIDS"
}

foreign_slurm() {  # slurmctld and slurmd processes not started by us
  local name pid
  for name in slurmctld slurmd; do
    for pid in $(pgrep -x "$name" || true); do
      alive "$pid" || continue
      grep -qx "$name $pid" < <(running_ours) || echo "$name $pid"
    done
  done
}

write_config() {
  mkdir -p "$SLURM_DIR/state" "${NODES[@]/#/$SLURM_DIR/spool-}"
  touch "$MARK"
  cat > "$CONF" <<CONF
# No systemd, no accounting: what a test cluster on one machine needs.
ClusterName=headstart
SlurmctldHost=$(hostname)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits cred_expire seconds before it may start again (120 by default); the
# preemption tests requeue twice. 30 s still outlasts a step's launch on a busy machine.
AuthInfo=socket=$MUNGE/munge.socket,cred_expire=30
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
StateSaveLocation=$SLURM_DIR/state
FirstJobId=$(first_job_id)
SlurmdSpoolDir=$SLURM_DIR/spool-%n
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd-%n.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdLogFile=$SLURM_DIR/slurmd-%n.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
# As many sites do: once a step's first task ends, the others get WaitTime seconds. A step whose
# main node still works alone (train.sbatch's merge) must say srun --wait=0.
WaitTime=2
# The nodes advertise a GPU node's share (what slurm/*.sbatch ask: 8 CPUs, 64 GB for an evaluation),
# not this machine's, so the scripts run here as submitted. It is bookkeeping only: config_overrides
# keeps slurmd from draining nodes smaller than that, nothing binds CPUs (TaskPlugin=task/none) or
# counts memory (CR_Core, no accounting).
SlurmdParameters=config_overrides
NodeName=n[1-${#NODES[@]}] NodeAddr=127.0.0.1 Port=[17001-1700${#NODES[@]}] CPUs=8 RealMemory=131072 State=UNKNOWN
PartitionName=debug Nodes=n[1-${#NODES[@]}] Default=YES MaxTime=INFINITE State=UP
CONF
  # The node names must resolve; a line of ours, removed again by `stop`.
  local node resolved=1
  for node in "${NODES[@]}"; do getent hosts "$node" >/dev/null || resolved=0; done
  if [ "$resolved" = 0 ]; then
    if [ -n "$(tail -c1 /etc/hosts)" ]; then echo >> /etc/hosts; touch "$SLURM_DIR/hosts-newline"; fi
    echo "$HOSTS_LINE" >> /etc/hosts
  fi
}

# A munged of our own: its own key, socket, pid, log and seed files under $MUNGE.
start_munge() {
  mkdir -p "$MUNGE"
  dd if=/dev/urandom of="$MUNGE/munge.key" bs=1024 count=1 status=none
  chmod 755 "$MUNGE"  # clients reach the socket through it
  chmod 400 "$MUNGE/munge.key"
  chown -R munge:munge "$MUNGE"
  runuser -u munge -- /usr/sbin/munged --socket="$MUNGE/munge.socket" --key-file="$MUNGE/munge.key" \
    --pid-file="$MUNGE/munged.pid" --log-file="$MUNGE/munged.log" --seed-file="$MUNGE/munged.seed"
  record munged "$MUNGE/munged.pid"
}

# record NAME PIDFILE: wait for the daemon's pid file, check it, and note the pid.
record() {
  local pid=""
  for _ in $(seq 100); do
    pid=$(cat "$2" 2>/dev/null || true)
    [ -n "$pid" ] && ours "$1" "$pid" && break
    sleep 0.1
  done
  ours "$1" "$pid" || { echo "slurm_local.sh: $1 did not start" >&2; return 1; }
  echo "$1 $pid" >> "$PIDS"
}

start() {
  install
  if [ -f "$PIDS" ] && [ "$(running_ours | wc -l)" -eq $((${#NODES[@]} + 2)) ]; then
    echo "the local Slurm of $SLURM_DIR already runs"
  else
    stop >/dev/null  # what a crashed or partial start of ours left
    local foreign
    foreign=$(foreign_slurm)
    if [ -n "$foreign" ]; then
      echo "slurm_local.sh: a Slurm already runs on this machine; not starting a second one beside it:" >&2
      echo "$foreign" | sed 's/^/  /' >&2
      echo "Use that cluster (export SLURM_CONF for it), or stop it first." >&2
      exit 4
    fi
    # A start that fails leaves nothing behind but what it printed.
    trap 'status=$?; tail -n 5 "$SLURM_DIR"/*.log "$MUNGE"/*.log 2>/dev/null >&2 || true; stop >/dev/null 2>&1; exit $status' ERR
    write_config
    : > "$PIDS"
    start_munge
    slurmctld -f "$CONF"
    record slurmctld "$SLURM_DIR/slurmctld.pid"
    for node in "${NODES[@]}"; do
      slurmd -f "$CONF" -N "$node"
      record slurmd "$SLURM_DIR/slurmd-$node.pid"
    done
    trap - ERR
  fi
  export SLURM_CONF=$CONF
  for _ in $(seq 60); do
    [ "$(sinfo -h -N -o '%T' 2>/dev/null | grep -c idle)" -eq ${#NODES[@]} ] && break
    sleep 1
  done
  sinfo -N
  echo "export SLURM_CONF=$CONF"
}

stop() {
  if [ -n "$(running_ours | grep slurmctld || true)" ]; then
    # Our cluster's jobs, cancelled through our own controller while it runs.
    export SLURM_CONF=$CONF
    timeout 20 squeue -h -o %A 2>/dev/null | xargs -r timeout 20 scancel 2>/dev/null || true
    for _ in $(seq 150); do [ -z "$(our_stepds)" ] && break; sleep 0.1; done
  fi
  local name pid
  for name in slurmd slurmctld munged; do
    for pid in $(running_ours | awk -v n="$name" '$1 == n {print $2}'); do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 100); do
      running_ours | grep -q "^$name " || break
      sleep 0.1
    done
    for pid in $(running_ours | awk -v n="$name" '$1 == n {print $2}'); do kill -KILL "$pid" 2>/dev/null || true; done
  done
  for pid in $(our_stepds); do kill -KILL "$pid" 2>/dev/null || true; done
  if grep -qxF "$HOSTS_LINE" /etc/hosts; then
    grep -vxF "$HOSTS_LINE" /etc/hosts > "/etc/hosts.headstart-slurm" || true
    # The newline we put after an unterminated last line goes too.
    if [ -f "$SLURM_DIR/hosts-newline" ]; then truncate -s -1 /etc/hosts.headstart-slurm; fi
    cat /etc/hosts.headstart-slurm > /etc/hosts  # in place: /etc/hosts may be a bind mount
    rm -f /etc/hosts.headstart-slurm
  fi
  if [ -f "$MARK" ]; then
    rm -rf "$SLURM_DIR"
  elif [ -d "$SLURM_DIR" ]; then
    echo "slurm_local.sh: $SLURM_DIR was not made by this script; left as it is" >&2
  fi
  echo "the local Slurm of $SLURM_DIR is stopped"
}

our_stepds() {  # job step daemons of our slurmd: they carry its SLURM_CONF
  local pid
  for pid in $(pgrep -x slurmstepd || true); do
    alive "$pid" && tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qxF "SLURM_CONF=$CONF" && echo "$pid"
  done
  return 0
}

status() {  # exit 0 when ours runs, 3 when it does not
  local own
  own=$(running_ours)
  if [ -n "$(foreign_slurm)" ]; then echo "other Slurm daemons here:"; foreign_slurm | sed 's/^/  /'; fi
  if [ -z "$own" ]; then echo "none of ours runs (under $SLURM_DIR)"; return 3; fi
  echo "ours (under $SLURM_DIR):"
  echo "$own" | sed 's/^/  /'
}

case "${1:-start}" in
  start|stop|status) "${1:-start}" ;;
  *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac
