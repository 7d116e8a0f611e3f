#!/usr/bin/env bash
# A real SLURM on this one machine, for the SLURM lesson and its tests: a controller (slurmctld) and
# two compute nodes (two slurmd, named n1 and n2), authenticated by munge. Debian's slurm-wlm 22.05.
#
#   tools/local_slurm.sh start [--owner PID]  install slurm-wlm and munge (apt-get, once), write the config,
#                                             start the daemons; with --owner, stop them when PID exits
#   eval "$(tools/local_slurm.sh env)"        point sbatch, squeue, scontrol... at it (sets SLURM_CONF)
#   tools/local_slurm.sh status               exit 0 when it runs, 1 when not
#   tools/local_slurm.sh stop                 cancel its jobs, stop the daemons it started (by their pid files)
#
# Its state (config, munge key, spool, logs, pid files) lives in $TRAINUP_SLURM_DIR, by default .slurm/ in
# the course folder. Exit status 3: this machine cannot run it (not root, or apt-get could not install).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${TRAINUP_SLURM_DIR:-$ROOT/.slurm}
# made by start only: a stop or status of a SLURM gone (a notebook's, removed) leaves no folder
if [ "${1:-}" = start ]; then mkdir -p "$DIR"; fi
if [ -d "$DIR" ]; then DIR=$(cd "$DIR" && pwd); fi
CONF=$DIR/slurm.conf
SOCKET=$DIR/munge/munge.socket
NODES=(n1 n2)
export SLURM_CONF=$CONF
export PATH=$PATH:/usr/sbin:/sbin  # where Debian puts munged, slurmctld and slurmd

say() { echo "local_slurm: $*"; }
cannot() { echo "local_slurm: $*" >&2; exit 3; }
fail() { echo "local_slurm: $*" >&2; exit 1; }

# A pid from a pid file, only if that process is alive and is the program named (pids get reused).
alive_pid() {
  local file=$1 name=$2 pid
  [ -f "$file" ] || return 1
  pid=$(cat "$file" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] && [ -r "/proc/$pid/comm" ] || return 1
  [[ $(cat "/proc/$pid/comm") == "$name"* ]] || return 1
  echo "$pid"
}

# Each daemon: its pid file and its program name.
daemons() {
  echo "$DIR/run/munged.pid munged"
  echo "$DIR/run/slurmctld.pid slurmctld"
  for n in "${NODES[@]}"; do echo "$DIR/run/slurmd.$n.pid slurmd"; done
}

running() {
  local file name
  while read -r file name; do alive_pid "$file" "$name" >/dev/null || return 1; done < <(daemons)
}

install() {
  local missing=() c
  for c in munged slurmctld slurmd sbatch; do command -v "$c" >/dev/null || missing+=("$c"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || cannot "SLURM is not installed (no ${missing[*]}) and installing it needs root (apt-get install slurm-wlm munge)"
  command -v apt-get >/dev/null || cannot "SLURM is not installed and this is not a Debian-like system with apt-get"
  say "installing slurm-wlm and munge with apt-get (once, about a minute)"
  export DEBIAN_FRONTEND=noninteractive
  local apt=(apt-get -qq -o DPkg::Lock::Timeout=300)
  { "${apt[@]}" install -y slurm-wlm munge >"$DIR/apt.log" 2>&1 ||
    { "${apt[@]}" update >>"$DIR/apt.log" 2>&1 && "${apt[@]}" install -y slurm-wlm munge >>"$DIR/apt.log" 2>&1; }; } ||
    cannot "apt-get could not install slurm-wlm and munge (is Debian's package registry reachable?); see $DIR/apt.log"
}

# A TCP port nobody listens on, from a start value upward (bash's /dev/tcp: a refused connection = free).
free_port() {
  local p=$1
  while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
  echo "$p"
}

write_conf() {
  local host cpus mem ctld p
  host=$(hostname -s)
  cpus=$(nproc)
  mem=$(awk '/MemTotal/ {print int($2 / 1024 / 2)}' /proc/meminfo)  # MB; two nodes share this machine
  ctld=$(free_port 16817)
  cat >"$CONF" <<EOF
# Written by tools/local_slurm.sh: one controller and two nodes (n1, n2) on this one machine.
ClusterName=trainup
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld
# Another local SLURM on this machine (a second course folder, a test beside a notebook) numbers
# its jobs from elsewhere: the templates derive the rendezvous port and file names from the job id.
FirstJobId=$(( (ctld - 16817) * 1000 + 1 ))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.%n.log
# No cgroups, no systemd: processes are tracked through /proc and tasks are not pinned.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
# No accounting database: finished jobs stay visible to squeue/scontrol for an hour, and each one is
# also written to a text file (what sacct would show).
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobs.txt
# Up to two jobs may share a core (OverSubscribe=FORCE:2 below): a 1-node and a 2-node job run side by side.
MinJobAge=3600
KillWait=5
EOF
  for n in "${NODES[@]}"; do
    p=$(free_port $((ctld + 1)))
    ctld=$p  # the next node looks above this one
    echo "NodeName=$n NodeHostname=$host NodeAddr=127.0.0.1 Port=$p CPUs=$cpus RealMemory=$mem State=UNKNOWN" >>"$CONF"
  done
  echo "PartitionName=local Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:2" >>"$CONF"
}

start() {
  local owner=
  while [ $# -gt 0 ]; do
    case $1 in
      --owner) owner=${2:?--owner needs a pid}; shift 2 ;;
      *) fail "unknown option $1 (see the top of $0)" ;;
    esac
  done
  if running; then say "already running (SLURM_CONF=$CONF)"; return 0; fi
  [ "$(id -u)" -eq 0 ] || cannot "starting slurmd needs root (it starts each job as the user who submitted it)"
  install
  [ ${#SOCKET} -lt 100 ] || cannot "the munge socket path is too long for a Unix socket; set TRAINUP_SLURM_DIR to a shorter folder"
  stop_daemons quiet  # leftovers of a half-started earlier try
  rm -rf "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/log" "$DIR/munge"
  mkdir -p "$DIR/state" "$DIR/run" "$DIR/log" "$DIR/munge"
  for n in "${NODES[@]}"; do mkdir -p "$DIR/spool/$n"; done
  chmod 700 "$DIR/munge"
  head -c 1024 /dev/urandom >"$DIR/munge/munge.key" && chmod 400 "$DIR/munge/munge.key"
  # One start at a time on this machine: two that pick free ports together would pick the same.
  exec 9>"${TMPDIR:-/tmp}/trainup-local-slurm.lock"
  flock -w 120 9 || fail "another local SLURM took more than 120 s to start"
  write_conf
  # slurmd's job steps make their sockets in the spool folder (<node>_<job>.<step>): past 107
  # characters every job fails to start and waits, requeued, for minutes. Its job ids: FirstJobId
  # and the next 999 (write_conf)
  local step
  step=$DIR/spool/n1/n1_$(( $(sed -n 's/^FirstJobId=//p' "$CONF") + 999 )).4294967291
  if [ ${#step} -gt 107 ]; then
    rm -rf "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/log" "$DIR/munge" "$CONF"  # none half-made
    cannot "the SLURM folder $DIR is too long a path (${#DIR} characters) for slurmd's job" \
      "sockets; set TRAINUP_SLURM_DIR to a shorter folder (at most $((${#DIR} - ${#step} + 107)))"
  fi
  munged --force --key-file="$DIR/munge/munge.key" --socket="$SOCKET" --pid-file="$DIR/run/munged.pid" \
    --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed" 9>&- ||
    fail "munged did not start; see $DIR/log/munged.log"
  slurmctld -f "$CONF" -i 9>&- || fail "slurmctld did not start; see $DIR/log/slurmctld.log"
  for n in "${NODES[@]}"; do
    slurmd -f "$CONF" -N "$n" 9>&- || fail "slurmd $n did not start; see $DIR/log/slurmd.$n.log"
  done
  # Ready when both nodes have registered and are idle (bounded: 30 s).
  local i idle
  for i in $(seq 60); do
    idle=$(sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$' || true)
    [ "$idle" -eq ${#NODES[@]} ] && break
    sleep 0.5
  done
  if [ "$idle" -ne ${#NODES[@]} ]; then
    stop_daemons quiet
    fail "the nodes did not register within 30 s; see $DIR/log/"
  fi
  exec 9>&-  # its ports are taken now: the next start may look
  if [ -n "$owner" ]; then  # a watchdog: stop everything once the owner (a notebook kernel, a test run) is gone
    TRAINUP_SLURM_DIR=$DIR setsid nohup bash -c \
      'while kill -0 "$1" 2>/dev/null && [ -f "$2" ]; do sleep 2; done; exec "$3" stop' \
      watchdog "$owner" "$DIR/run/slurmctld.pid" "$ROOT/tools/local_slurm.sh" >"$DIR/log/watchdog.log" 2>&1 </dev/null &
    echo $! >"$DIR/run/watchdog.pid"
  fi
  say "running: controller and nodes ${NODES[*]} (SLURM_CONF=$CONF)"
}

# TERM the daemons by their pid files (the SLURM ones together, munge last, since they authenticate through it);
# each group gets up to 10 s, then KILL.
stop_daemons() {
  local quiet=${1:-} group file name pid i pids
  for group in slurm munge; do
    pids=()
    while read -r file name; do
      [[ $name == "$group"* ]] || continue
      if pid=$(alive_pid "$file" "$name"); then
        kill -TERM "$pid" 2>/dev/null || true
        pids+=("$pid")
        [ "$quiet" = quiet ] || say "stopping $name (pid $pid)"
      fi
      rm -f "$file"
    done < <(daemons)
    for pid in "${pids[@]}"; do
      for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    done
  done
}

stop() {
  local pid i
  if alive_pid "$DIR/run/slurmctld.pid" slurmctld >/dev/null; then
    # Cancel this cluster's jobs and give their processes a few seconds to end, before the nodes go.
    scancel --full --partition=local 2>/dev/null || true
    for i in $(seq 30); do
      [ -z "$(squeue -h -t running,completing,pending -o %i 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  stop_daemons
  if pid=$(cat "$DIR/run/watchdog.pid" 2>/dev/null) && [ "$pid" != "$PPID" ] && [ "$pid" != "$$" ]; then
    kill "$pid" 2>/dev/null || true
    # gone before stop returns (its caller checks): on a loaded machine it takes a moment to die
    for i in $(seq 25); do
      grep -qs '^State:.*[RSD]' "/proc/$pid/status" || break  # gone, or a zombie
      sleep 0.2
    done
  fi
  rm -f "$DIR/run/watchdog.pid"
}

status() {
  local file name pid up=0
  while read -r file name; do
    if pid=$(alive_pid "$file" "$name"); then echo "$name: running (pid $pid)"; up=$((up + 1))
    else echo "$name: not running"; fi
  done < <(daemons)
  if running; then
    sinfo -N -o '%N %P %c %T'
    return 0
  fi
  return 1
}

case ${1:-} in
  start) shift; start "$@" ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 start [--owner PID] | stop | status | env" >&2; exit 2 ;;
esac
