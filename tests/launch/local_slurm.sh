#!/bin/bash
# A throwaway one-node SLURM cluster on this machine: munged + slurmctld + slurmd, all state in one folder.
#   tests/launch/local_slurm.sh up   [DIR]   start it (DIR default: /tmp/diffllm-slurm); prints `export SLURM_CONF=...`
#   tests/launch/local_slurm.sh down [DIR]   stop the daemons started from DIR (by their pid files) and cancel its jobs
# Needs root and Debian's slurmctld, slurmd, slurm-client and munge (`apt-get install slurmctld slurmd slurm-client
# munge`). Containers have no systemd and often no usable cgroups, so the generated slurm.conf uses
# proctrack/linuxproc, task/none, no accounting and no cgroup plugins. The tests (tests/launch/slurm_cluster.py)
# start and stop a cluster with this script.
set -euo pipefail

cmd=${1:-}
DIR=$(realpath -m "${2:-/tmp/diffllm-slurm}")
CONF=$DIR/slurm.conf

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

stop_pidfile() {  # stop_pidfile FILE NAME: TERM, then KILL after 10 s, the one daemon whose pid FILE holds
  local pid
  [ -f "$1" ] || return 0
  pid=$(cat "$1")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

down() {
  if [ -f "$CONF" ] && [ -f "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
    SLURM_CONF=$CONF timeout 10 scancel --full --quiet --user=root 2>/dev/null || true
    for _ in $(seq 50); do  # let the steps end before slurmd goes (slurmstepd would otherwise outlive it)
      [ -z "$(SLURM_CONF=$CONF timeout 5 squeue -h -t R,CG 2>/dev/null)" ] && break; sleep 0.2
    done
  fi
  stop_pidfile "$DIR/slurmd.pid"
  stop_pidfile "$DIR/slurmctld.pid"
  stop_pidfile "$DIR/munged.pid"
  # a job step whose slurmd is gone: its slurmstepd names our spool folder on its command line
  for pid in $(pgrep -f "slurmstepd.*" 2>/dev/null || true); do
    if grep -qs "$DIR" "/proc/$pid/environ" "/proc/$pid/cmdline"; then kill -9 "$pid" 2>/dev/null || true; fi
  done
}

up() {
  for tool in munged mungekey slurmctld slurmd sinfo; do
    command -v "$tool" >/dev/null || { echo "local_slurm.sh: $tool not found (apt-get install slurmctld slurmd slurm-client munge)" >&2; exit 2; }
  done
  [ "$(id -u)" = 0 ] || { echo "local_slurm.sh: needs root (slurmd starts jobs as their users)" >&2; exit 2; }
  down
  mkdir -p "$DIR/munge" "$DIR/ctld" "$DIR/spool"
  chmod 700 "$DIR/munge"
  [ -f "$DIR/munge/munge.key" ] || mungekey --create --keyfile="$DIR/munge/munge.key" 2>/dev/null \
    || dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1 count=1024 2>/dev/null
  chmod 400 "$DIR/munge/munge.key"
  munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" --pid-file="$DIR/munged.pid" \
    --log-file="$DIR/munged.log" --seed-file="$DIR/munge/munged.seed"
  local host cpus mem
  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
  cat > "$CONF" <<EOF
# Written by tests/launch/local_slurm.sh: one node ($host, $cpus CPUs), partition "local", state under $DIR
ClusterName=diffllm-local
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# containers: no systemd, no cgroup v1/v2 delegation
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=300
SchedulerParameters=defer_batch=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  export SLURM_CONF=$CONF
  slurmctld -f "$CONF" -i
  slurmd -f "$CONF"
  for _ in $(seq 150); do
    if [ "$(sinfo -h -N -o %t 2>/dev/null)" = idle ]; then
      echo "export SLURM_CONF=$CONF"
      return 0
    fi
    sleep 0.2
  done
  echo "local_slurm.sh: node $host did not become idle in 30 s; see $DIR/slurmctld.log and $DIR/slurmd.log" >&2
  sinfo -N >&2 || true
  down
  exit 1
}

case "$cmd" in
  up) up ;;
  down) down ;;
  *) echo "usage: tests/launch/local_slurm.sh up|down [DIR]" >&2; exit 2 ;;
esac
