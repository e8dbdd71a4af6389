#!/usr/bin/env bash
# A real single-host Slurm cluster for tests and trials: munged, slurmctld and slurmd on this machine,
# one node (this host) in one partition ("debug"), no GPUs, no accounting.
#
#   bash tools/slurm/local_cluster.sh up       # install (apt) if needed, write the config, start, wait for "idle"
#   bash tools/slurm/local_cluster.sh status   # one line; exit 0 when the node accepts jobs
#   bash tools/slurm/local_cluster.sh down     # cancel the jobs, stop the three daemons (packages stay)
#
# The daemons are started directly (no systemd needed), as root: Slurm's daemons need root, and so does apt.
# `up` is idempotent: what already runs is kept, what is missing is started. It writes /etc/slurm/slurm.conf
# only when there is none or when it wrote the one there (marked below); a slurm.conf of a real cluster is
# never overwritten.
#
# Exit codes (each failure prints one line "local_cluster: cannot ...: REASON" on stderr):
#   0 done    2 usage    3 not root    4 no apt-get (and Slurm not installed)    5 apt-get failed
#   6 a slurm.conf this script did not write    7 a daemon did not start or the node is not idle in time
#   8 (status only) the cluster is not up
set -uo pipefail

MARK="# written by tfgpu tools/slurm/local_cluster.sh"
CONF=/etc/slurm/slurm.conf
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
MUNGE_PID=/run/munge/munged.pid
LOGS=/var/log/slurm
WAIT_S=${TFGPU_SLURM_WAIT_S:-60}

fail() {  # CODE REASON
  echo "local_cluster: cannot $ACTION: $2" >&2
  exit "$1"
}

running() {  # PIDFILE: true when the process it names is alive
  [ -s "$1" ] && kill -0 "$(cat "$1")" 2> /dev/null
}

node_name() { hostname -s; }

node_state() {  # the node's state as sinfo prints it ("idle", "down*", ...), empty when slurmctld does not answer
  timeout 10 sinfo -h -n "$(node_name)" -o %T 2> /dev/null | head -n 1
}

install_packages() {
  if command -v slurmctld > /dev/null && command -v slurmd > /dev/null && command -v sinfo > /dev/null \
     && command -v munged > /dev/null; then
    return
  fi
  command -v apt-get > /dev/null || fail 4 "Slurm is not installed and there is no apt-get to install it"
  echo "local_cluster: installing slurmctld slurmd slurm-client munge with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if ! { timeout 300 apt-get update -q > "$LOGS/apt.log" 2>&1 \
         && timeout 600 apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge \
              >> "$LOGS/apt.log" 2>&1; }; then
    fail 5 "apt-get install slurmctld slurmd slurm-client munge failed: $(tail -n 1 "$LOGS/apt.log")"
  fi
}

start_munge() {
  mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
  chmod 400 /etc/munge/munge.key
  if ! munge -n 2> /dev/null | unmunge > /dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged --pid-file="$MUNGE_PID" > "$LOGS/munged.out" 2>&1 \
      || fail 7 "munged did not start: $(tail -n 1 "$LOGS/munged.out")"
  fi
  munge -n 2> /dev/null | unmunge > /dev/null 2>&1 || fail 7 "munged runs but munge -n | unmunge fails"
}

write_conf() {
  local host cpus
  host=$(node_name)
  getent hosts "$host" > /dev/null || fail 7 "this host's name $host does not resolve (add it to /etc/hosts)"
  # cred_expire: a requeued job waits this long before it may start again (Slurm's default: 120 s).
  # MessageTimeout: 30 s, not 10, for a host busy starting TensorFlow workers (slurmd stopped answering in time).
  # At least 2 CPUs, so that 2-task jobs run on a 1-core host too (config_overrides: slurmd takes this count).
  cpus=$(nproc)
  [ "$cpus" -ge 2 ] || cpus=2
  local text
  text="$MARK
ClusterName=local
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
AuthInfo=cred_expire=15
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=30
MessageTimeout=30
NodeName=$host CPUs=$cpus RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP"
  if [ -f "$CONF" ] && ! grep -qxF "$MARK" "$CONF"; then
    fail 6 "$CONF exists and was not written by this script (a real cluster's?): not overwriting it"
  fi
  if [ -f "$CONF" ] && [ "$(cat "$CONF")" = "$text" ]; then
    return
  fi
  printf '%s\n' "$text" > "$CONF"
  CONF_CHANGED=1
}

start_slurm() {
  mkdir -p /var/spool/slurmctld /var/spool/slurmd
  if [ "${CONF_CHANGED:-0}" = 1 ]; then  # a daemon left from an older config would keep it
    stop_daemon slurmd "$SLURMD_PID"
    stop_daemon slurmctld "$CTLD_PID"
  fi
  if ! running "$CTLD_PID"; then
    /usr/sbin/slurmctld > "$LOGS/slurmctld.out" 2>&1 || fail 7 "slurmctld did not start: see $LOGS/slurmctld.log"
  fi
  if ! running "$SLURMD_PID"; then
    /usr/sbin/slurmd > "$LOGS/slurmd.out" 2>&1 || fail 7 "slurmd did not start: see $LOGS/slurmd.log"
  fi
  local state="" waited=0
  while [ "$waited" -lt "$WAIT_S" ]; do
    state=$(node_state)
    case $state in
      idle|mixed|allocated|completing) return ;;
      down*|drain*|drained*) timeout 10 scontrol update nodename="$(node_name)" state=resume > /dev/null 2>&1 ;;
    esac
    sleep 1
    waited=$((waited + 1))
  done
  fail 7 "node $(node_name) is '${state:-no answer from slurmctld}' after ${WAIT_S}s, not idle: see $LOGS/"
}

stop_daemon() {  # NAME PIDFILE: SIGTERM the process the pidfile names, wait up to 20 s for it to exit
  local pid i
  running "$2" || return 0
  pid=$(cat "$2")
  kill -TERM "$pid" 2> /dev/null
  for i in $(seq 40); do
    kill -0 "$pid" 2> /dev/null || return 0
    sleep 0.5
  done
  kill -KILL "$pid" 2> /dev/null
  echo "local_cluster: $1 (pid $pid) ignored SIGTERM for 20 s: killed" >&2
}

ACTION=${1:-}
case $ACTION in
  up)
    [ "$(id -u)" = 0 ] || fail 3 "not root (the Slurm daemons and apt-get need root)"
    mkdir -p "$LOGS" /etc/slurm
    install_packages
    start_munge
    write_conf
    start_slurm
    echo "local_cluster: up: node $(node_name) $(node_state) in partition debug ($(grep -o 'CPUs=[0-9]*' "$CONF"))"
    ;;
  down)
    [ "$(id -u)" = 0 ] || fail 3 "not root"
    if [ -f "$CONF" ] && ! grep -qxF "$MARK" "$CONF"; then
      fail 6 "$CONF was not written by this script: leaving that cluster alone"
    fi
    if running "$CTLD_PID"; then  # jobs first: their step daemons would outlive slurmd
      timeout 10 scancel --full --signal=KILL > /dev/null 2>&1
      timeout 10 scancel > /dev/null 2>&1
      for _ in $(seq 30); do
        [ -z "$(timeout 10 squeue -h -o %i 2> /dev/null)" ] && break
        sleep 1
      done
    fi
    stop_daemon slurmd "$SLURMD_PID"
    stop_daemon slurmctld "$CTLD_PID"
    stop_daemon munged "$MUNGE_PID"
    echo "local_cluster: down"
    ;;
  status)
    if ! command -v sinfo > /dev/null; then
      echo "local_cluster: not up (Slurm is not installed)"; exit 8
    fi
    if [ -f "$CONF" ] && grep -qxF "$MARK" "$CONF" && ! running "$CTLD_PID"; then
      echo "local_cluster: not up (slurmctld is not running)"; exit 8
    fi
    state=$(node_state)
    case $state in
      idle|mixed|allocated|completing) echo "local_cluster: up: node $(node_name) $state"; exit 0 ;;
      *) echo "local_cluster: not up (node $(node_name): ${state:-no answer from slurmctld})"; exit 8 ;;
    esac
    ;;
  *)
    echo "usage: $0 up|down|status" >&2
    exit 2
    ;;
esac
