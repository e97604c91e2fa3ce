#!/usr/bin/env bash
# A real two-node Slurm cluster on this one machine, for the tests and CI.
#   bash scripts/slurm_local.sh start   # install (Debian packages) if needed, configure, start
#   bash scripts/slurm_local.sh stop
# Clients need SLURM_CONF=$SLURM_DIR/slurm.conf (printed by `start`).
set -euo pipefail
SLURM_DIR=${SLURM_DIR:-/tmp/headstart-slurm}
CONF=$SLURM_DIR/slurm.conf

install() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null && return
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >/dev/null
}

write_config() {
  mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/spool-n1" "$SLURM_DIR/spool-n2"
  local memory_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 3 ))
  cat > "$CONF" <<CONF
# No systemd, no accounting: what a test cluster on one machine needs.
ClusterName=headstart
SlurmctldHost=$(hostname)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool-%n
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd-%n.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdLogFile=$SLURM_DIR/slurmd-%n.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=n[1-2] NodeAddr=127.0.0.1 Port=[17001-17002] CPUs=2 RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
CONF
  grep -qE '(^|\s)n1(\s|$)' /etc/hosts || echo "127.0.0.1 n1 n2" >> /etc/hosts
}

start_munge() {
  pgrep -x munged >/dev/null && return
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  runuser -u munge -- /usr/sbin/munged
}

start() {
  install
  write_config
  start_munge
  export SLURM_CONF=$CONF
  pgrep -x slurmctld >/dev/null || slurmctld -f "$CONF"
  for node in n1 n2; do
    pgrep -f "slurmd -N $node" >/dev/null || slurmd -f "$CONF" -N "$node"
  done
  for _ in $(seq 60); do
    [ "$(sinfo -h -o '%T' 2>/dev/null | grep -c idle)" -ge 1 ] && [ "$(sinfo -h -N -o '%T' | grep -c idle)" -eq 2 ] && break
    sleep 1
  done
  sinfo -N
  echo "export SLURM_CONF=$CONF"
}

stop() {
  pkill -x slurmd || true
  pkill -x slurmctld || true
}

"${1:-start}"
