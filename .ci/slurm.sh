#!/usr/bin/env bash
# A throw-away multi-node Slurm cluster on this one machine, for the tests.
#
#   bash .ci/slurm.sh start DIR [NODES] [GPUS] -> a cluster of NODES (2) nodes, its files in DIR
#   bash .ci/slurm.sh stop DIR                 -> stop its daemons by PID, remove its network
#   bash .ci/slurm.sh node-stop DIR NODE       -> "power off" one node (SIGKILL all its processes)
#   bash .ci/slurm.sh node-start DIR NODE      -> start that node's slurmd again
#
# Why it looks like this: Slurm needs one host name and address per node, and torchrun
# resolves those names, so each node is a network namespace (address 10.213.N.11, .12,
# ...) joined by a veth pair to a bridge in the root namespace (10.213.N.1, where
# slurmctld, munged and the test process live). Each slurmd runs under
# `nsenter --net` (not `ip netns exec`, which remounts /sys and hides the cgroup mounts
# slurmd needs) and `unshare --uts --mount`, with its own host name and a private
# /etc/hosts bind-mounted inside its mount namespace; the machine's /etc/hosts, its
# cgroup mounts and its other interfaces are never touched. The namespaces, slots and
# node start-up are .ci/netns.sh's, shared with .ci/ray.sh.
#
# Each node has 2 CPUs (2 trial slots) and GPUS (2) fake GPUs (character devices under
# DIR that Slurm only stats; they are copies of /dev/null). Partitions: "debug"
# (default), "grace" and "urgent" over the same nodes; urgent jobs preempt the others
# by requeueing them (or cancelling them, if submitted --no-requeue), at once in debug,
# after SIGTERM and a GraceTime of 30 s in grace (time a trial spends writing a
# checkpoint). No slurmdbd: a finished job's state comes from `scontrol show job` (kept 600 s)
# or DIR/jobcomp.txt.
#
# `start` prints the client environment (SLURM_CONF=...) and writes it to DIR/env; the
# addresses go to DIR/cluster. PIDs are in DIR/pids/. Several clusters may run at once
# (up to 8): each takes a free slot N (names ssw<N>..., subnet 10.213.<7+N>.0/24) and
# records in /run/slotsweep-slurm which process holds it. A slot whose holder (the
# process that ran `start`, or $SLOTSWEEP_SLURM_HOLDER) is gone is a leftover of a
# crashed run and is cleaned up by the next `start`, as is an earlier cluster in DIR.
# Installs Debian's slurm-wlm and munge when missing. Needs root.
set -euo pipefail
trap 'echo "slurm.sh: command failed (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR

usage() {
  echo "usage: slurm.sh start DIR [NODES] [GPUS] | stop DIR | node-stop DIR NODE | node-start DIR NODE" >&2
  exit 2
}
[[ $# -ge 2 ]] || usage
action=$1
if [[ "$action" == start ]]; then mkdir -p "$2"; elif [[ ! -d "$2" ]]; then
  [[ "$action" == stop ]] && exit 0
  echo "slurm.sh: no cluster in $2" >&2
  exit 1
fi
dir=$(cd "$2" && pwd)

registry=/run/slotsweep-slurm
ns_prefix=ssw
ns_net_base=10.213
# shellcheck source=.ci/netns.sh
source "$(dirname "$0")/netns.sh"
ctld_port=16817
slurmd_port=16818

# ---------------------------------------------------------------- helpers

install_packages() {
  local program missing=0 log
  for program in slurmctld slurmd munged sinfo ip pgrep; do
    command -v "$program" >/dev/null || missing=1
  done
  [[ $missing -eq 1 ]] || return 0
  export DEBIAN_FRONTEND=noninteractive
  log=$(mktemp)
  # Quiet unless it fails; wait for a concurrent apt (another set-up step) to finish.
  if ! { apt-get update -qq && apt-get install -y -qq -o DPkg::Lock::Timeout=300 \
    slurm-wlm munge iproute2 procps; } >"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "slurm.sh: apt-get install slurm-wlm munge failed" >&2
    return 1
  fi
  rm -f "$log"
}

# SIGTERM the processes (PIDs in "$@"), wait up to 10 s, then SIGKILL what is left.
terminate() {
  [[ $# -gt 0 ]] || return 0
  kill -TERM "$@" 2>/dev/null || true
  local pid left
  for _ in $(seq 1 100); do
    left=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && left=1; done
    [[ $left -eq 1 ]] || return 0
    sleep 0.1
  done
  kill -KILL "$@" 2>/dev/null || true
  for _ in $(seq 1 50); do
    left=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && left=1; done
    [[ $left -eq 1 ]] || return 0
    sleep 0.1
  done
}

# The PID in pid file $1 if that process still runs program $2 (else nothing).
pid_of() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 0
  [[ -n "$pid" && "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$2" ]] && echo "$pid"
  return 0
}

# PIDs of cluster $1's running $2 (slurmctld or munged): the one in its pid file, and any
# whose command line names the cluster's files (a pid file lost with a deleted DIR).
daemon_pids() {
  local owner=$1 program=$2 arg f pid
  case "$program" in
    slurmctld) arg="$owner/slurm.conf" ;;
    munged) arg="--socket=$owner/munge/munge.socket" ;;
  esac
  {
    pid_of "$owner/pids/$program" "$program"
    for f in $(grep -lzxF -- "$arg" /proc/[0-9]*/cmdline 2>/dev/null || true); do
      pid=${f#/proc/}
      pid=${pid%/cmdline}
      if [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$program" ]]; then echo "$pid"; fi
    done
  } | sort -u
}

# Stop everything of slot $1 whose files are in directory $2 (may be gone), then remove
# its namespaces, veths and bridge.
clean_slot() {
  local slot=$1 owner=$2 ns pids=() f ctld jobs
  ctld=$(daemon_pids "$owner" slurmctld)
  # Cancel the jobs first (up to 3 s): a job step whose slurmctld is gone retries
  # its completion message instead of exiting.
  if [[ -n "$ctld" && -f "$owner/slurm.conf" ]]; then
    jobs=$(SLURM_CONF="$owner/slurm.conf" timeout 5 squeue -h -o %A 2>/dev/null || true)
    if [[ -n "$jobs" ]]; then
      SLURM_CONF="$owner/slurm.conf" timeout 5 scancel $jobs 2>/dev/null || true
      for _ in $(seq 1 30); do
        [[ -z "$(SLURM_CONF="$owner/slurm.conf" timeout 5 squeue -h -o %A 2>/dev/null)" ]] && break
        sleep 0.1
      done
    fi
  fi
  # Then slurmctld (with its slurmscriptd), the slurmds and munged together: each takes
  # a second or two to exit, and none needs another to do so.
  for f in $ctld; do pids+=("$f" $(pgrep -P "$f" || true)); done
  for f in "$owner"/pids/node-*; do
    [[ -e "$f" ]] && pids+=($(pid_of "$f" slurmd))
  done
  for ns in $(slot_namespaces "$slot"); do
    for f in $(netns_pids "$ns"); do
      if [[ "$(cat "/proc/$f/comm" 2>/dev/null)" == slurmd ]]; then pids+=("$f"); fi
    done
  done
  pids+=($(daemon_pids "$owner" munged))
  terminate $(printf '%s\n' "${pids[@]}" | sort -u)
  # Then whatever else still runs on the nodes (slurmstepd, job steps).
  pids=()
  for ns in $(slot_namespaces "$slot"); do
    pids+=($(netns_pids "$ns"))
  done
  terminate "${pids[@]}"
  remove_slot_network "$slot" "$owner"
}

# Start node $1's slurmd in its namespace; its PID goes to DIR/pids/node-$1.
start_slurmd() {
  local node=$1
  mkdir -p "$dir/nodes/$node"
  run_on_node "$(cat "$dir/slot")" "$node" "$dir/pids/node-$node" "$dir/logs/slurmd-$node.out" \
    slurmd -D -N "$node" -f "$dir/slurm.conf"
}

clients() { SLURM_CONF="$dir/slurm.conf" "$@"; }

# Wait up to $2 s until node $1's state (sinfo %t) matches regex $3.
wait_node_state() {
  local node=$1 timeout=$2 pattern=$3 state=""
  local deadline=$((SECONDS + timeout))
  while [[ $SECONDS -lt $deadline ]]; do
    if [[ -z "$(pid_of "$dir/pids/slurmctld" slurmctld)" || -z "$(pid_of "$dir/pids/node-$node" slurmd)" ]]; then
      sleep 0.5 # let a daemon that just started exec; then it must be there
      if [[ -z "$(pid_of "$dir/pids/slurmctld" slurmctld)" || -z "$(pid_of "$dir/pids/node-$node" slurmd)" ]]; then
        echo "slurm.sh: slurmctld or node $node's slurmd is not running; logs in $dir/logs" >&2
        return 1
      fi
    fi
    state=$(clients timeout 10 sinfo -h -n "$node" -N -o '%t' 2>/dev/null | head -n 1 || true)
    [[ "$state" =~ $pattern ]] && return 0
    sleep 0.2
  done
  echo "slurm.sh: node $node is '$state' after ${timeout}s (wanted $pattern); logs in $dir/logs" >&2
  return 1
}

node_names() { awk '/^NodeName=/{sub("NodeName=", "", $1); print $1}' "$dir/slurm.conf"; }

# ---------------------------------------------------------------- actions

do_stop() {
  [[ -f "$dir/slot" ]] || return 0
  clean_slot "$(cat "$dir/slot")" "$dir"
  rm -f "$dir/slot" "$dir/holder"
}

# On a failed start: show the logs' last lines and stop what did start.
start_failed() {
  echo "slurm.sh: start failed; last log lines:" >&2
  tail -n 5 "$dir"/logs/* >&2 2>/dev/null || true
  do_stop
}

do_start() {
  local nodes=${1:-2} gpus=${2:-2} slot="" net i names=()
  [[ "$nodes" =~ ^[1-9][0-9]?$ && "$gpus" =~ ^[0-9]$ ]] || usage
  install_packages
  do_stop # an earlier cluster in this DIR
  claim_slot clean_slot "${SLOTSWEEP_SLURM_HOLDER:-$PPID}"
  trap start_failed EXIT
  net=$(slot_net "$slot")
  for i in $(seq 1 "$nodes"); do names+=("ssnode$i"); done

  # Network: a bridge with the controller's address; each node a namespace with eth0.
  make_slot_network "$slot" "${names[@]}"

  # Files. A fresh state every start: no jobs or node states of an earlier cluster.
  rm -rf "$dir/ctld" "$dir/nodes" "$dir/logs" "$dir/munge" "$dir/dev" "$dir/pids"
  mkdir -p "$dir/ctld" "$dir/logs" "$dir/munge" "$dir/dev" "$dir/pids"
  chmod 0755 "$dir"
  write_hosts "$dir/hosts" "$slot" sscontrol "${names[@]}"
  for i in $(seq 0 $((gpus - 1))); do mknod -m 0666 "$dir/dev/gpu$i" c 1 3; done
  : >"$dir/plugstack.conf"
  cat >"$dir/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
EOF
  {
    cat <<EOF
# Written by .ci/slurm.sh: a test cluster on this machine's network namespaces.
ClusterName=slotsweep
SlurmctldHost=sscontrol($net.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
CommunicationParameters=NoCtldInAddrAny
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/nodes/%n
SlurmctldPidFile=$dir/ctld/slurmctld.pid
SlurmdPidFile=$dir/nodes/%n/slurmd.pid
SlurmctldLogFile=$dir/logs/slurmctld.log
SlurmdLogFile=$dir/logs/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$dir/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# A pass over pending jobs every 5 s, not Slurm's 60 (backfill's 30): tests wait on them.
SchedulerParameters=sched_interval=5,bf_interval=5
GresTypes=gpu
MpiDefault=none
SwitchType=switch/none
SlurmdParameters=config_overrides
MinJobAge=600
KillOnBadExit=0
KillWait=10
InactiveLimit=0
ReturnToService=2
SlurmdTimeout=10
JobRequeue=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
EOF
    for i in $(seq 1 "$nodes"); do
      local gres=""
      [[ "$gpus" -gt 0 ]] && gres=" Gres=gpu:$gpus"
      echo "NodeName=ssnode$i NodeHostname=ssnode$i NodeAddr=$net.$((10 + i)) CPUs=2$gres State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1"
    echo "PartitionName=grace Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=30"
    echo "PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2"
  } >"$dir/slurm.conf"
  if [[ "$gpus" -gt 0 ]]; then
    echo "Name=gpu File=$dir/dev/gpu[0-$((gpus - 1))]" >"$dir/gres.conf"
  else
    : >"$dir/gres.conf"
  fi

  # munged as the munge user, with a key and socket of this cluster's own.
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chown -R munge:munge "$dir/munge"
  chmod 0711 "$dir/munge"
  chmod 0400 "$dir/munge/munge.key"
  setsid sh -c 'echo $$ >"$1" && exec setpriv --reuid=munge --regid=munge --init-groups munged --foreground --socket="$2/munge.socket" --key-file="$2/munge.key" --pid-file="$2/munged.pid" --log-file="$2/munged.log" --seed-file="$2/munged.seed"' \
    sh "$dir/pids/munged" "$dir/munge" </dev/null >"$dir/logs/munged.out" 2>&1 9>&- &
  for _ in $(seq 1 100); do
    munge -n -S "$dir/munge/munge.socket" 2>/dev/null | unmunge -S "$dir/munge/munge.socket" >/dev/null 2>&1 && break
    sleep 0.1
  done
  munge -n -S "$dir/munge/munge.socket" | unmunge -S "$dir/munge/munge.socket" >/dev/null

  # slurmctld with the controller's host name (it refuses to run on another host) and
  # the cluster's /etc/hosts (it binds to the address of that name).
  setsid unshare --uts --mount \
    sh -c 'echo $$ >"$1" && hostname sscontrol && mount --bind "$2" /etc/hosts && exec slurmctld -D -f "$3"' \
    sh "$dir/pids/slurmctld" "$dir/hosts" "$dir/slurm.conf" \
    </dev/null >"$dir/logs/slurmctld.out" 2>&1 9>&- &
  for i in $(seq 1 "$nodes"); do start_slurmd "ssnode$i"; done
  for i in $(seq 1 "$nodes"); do wait_node_state "ssnode$i" 60 '^idle$'; done
  trap - EXIT

  echo "SLURM_CONF=$dir/slurm.conf" >"$dir/env"
  {
    echo "SLOTSWEEP_SLURM_CONTROLLER=$net.1"
    echo "SLOTSWEEP_SLURM_SUBNET=$net.0/24"
    echo -n "SLOTSWEEP_SLURM_NODES="
    for i in $(seq 1 "$nodes"); do
      [[ $i -gt 1 ]] && echo -n ","
      echo -n "ssnode$i:$net.$((10 + i))"
    done
    echo
  } >"$dir/cluster"
  cat "$dir/env"
}

do_node_stop() {
  local node=$1 ns pids
  [[ -f "$dir/slot" ]] || { echo "slurm.sh: no cluster in $dir" >&2; exit 1; }
  ns=$(slot_netns "$(cat "$dir/slot")" "$node")
  [[ -e "/run/netns/$ns" ]] || { echo "slurm.sh: no node $node" >&2; exit 1; }
  # A power loss: slurmd, slurmstepd and the node's job processes die at once.
  pids=$(netns_pids "$ns")
  if [[ -n "$pids" ]]; then
    kill -KILL $pids 2>/dev/null || true
    for _ in $(seq 1 50); do
      [[ -z "$(netns_pids "$ns")" ]] && break
      sleep 0.1
    done
  fi
  rm -f "$dir/pids/node-$node"
}

do_node_start() {
  local node=$1
  [[ -f "$dir/slot" ]] || { echo "slurm.sh: no cluster in $dir" >&2; exit 1; }
  node_names | grep -qx "$node" || { echo "slurm.sh: no node $node" >&2; exit 1; }
  if [[ -n "$(pid_of "$dir/pids/node-$node" slurmd)" ]]; then return 0; fi
  start_slurmd "$node"
  # ReturnToService=2: a node that was down is back once its slurmd registers.
  wait_node_state "$node" 60 '^(idle|mix|alloc|comp)$'
}

case "$action" in
  start) do_start "${3:-}" "${4:-}" ;;
  stop) do_stop ;;
  node-stop) [[ $# -eq 3 ]] || usage; do_node_stop "$3" ;;
  node-start) [[ $# -eq 3 ]] || usage; do_node_start "$3" ;;
  *) usage ;;
esac
