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
# cgroup mounts and its other interfaces are never touched.
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

# Network names and addresses of slot $1.
slot_bridge() { echo "ssw$1br"; }
slot_netns() { echo "ssw$1-$2"; }      # slot, node name
slot_veth() { echo "ssw$1n$2"; }       # slot, node index: the root-namespace end
slot_net() { echo "10.213.$((7 + $1))"; }

# "PID STARTTIME" of a process, empty when it does not exist: a PID alone may be reused.
proc_id() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  # After "comm)" field 3 is first; starttime is field 22 overall, the 20th here.
  echo "$1 $(echo "$stat" | cut -d' ' -f20)"
}

holder_alive() { # holder file
  local want
  want=$(cat "$1" 2>/dev/null) || return 1
  [[ -n "$want" && "$(proc_id "${want%% *}")" == "$want" ]]
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

netns_pids() { ip netns pids "$1" 2>/dev/null || true; }

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
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^ssw$slot-" || true); do
    for f in $(netns_pids "$ns"); do
      if [[ "$(cat "/proc/$f/comm" 2>/dev/null)" == slurmd ]]; then pids+=("$f"); fi
    done
  done
  pids+=($(daemon_pids "$owner" munged))
  terminate $(printf '%s\n' "${pids[@]}" | sort -u)
  # Then whatever else still runs on the nodes (slurmstepd, job steps).
  pids=()
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^ssw$slot-" || true); do
    pids+=($(netns_pids "$ns"))
  done
  terminate "${pids[@]}"
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^ssw$slot-" || true); do
    ip netns delete "$ns" 2>/dev/null || true
  done
  for f in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^ssw${slot}n[0-9]*$" || true); do
    ip link delete "$f" 2>/dev/null || true
  done
  ip link delete "$(slot_bridge "$slot")" 2>/dev/null || true
  rm -f "$registry/slot$slot"
  if [[ -d "$owner/pids" ]]; then rm -f "$owner"/pids/*; fi
}

slot_in_use() { # slot: has a namespace, link or claim
  [[ -e "$registry/slot$1" ]] && return 0
  ip link show "$(slot_bridge "$1")" >/dev/null 2>&1 && return 0
  ip netns list 2>/dev/null | grep -q "^ssw$1-" && return 0
  return 1
}

# Start node $1's slurmd in its namespace; its PID goes to DIR/pids/node-$1.
start_slurmd() {
  local node=$1 slot ns
  slot=$(cat "$dir/slot")
  mkdir -p "$dir/nodes/$node"
  ns=$(slot_netns "$slot" "$node")
  # exec chain (setsid, nsenter, unshare, sh) keeps one PID: sh records it, then execs
  # slurmd. Descriptors are closed so no caller waits on our pipes or lock.
  setsid nsenter --net="/run/netns/$ns" unshare --uts --mount \
    sh -c 'echo $$ >"$1" && hostname "$2" && mount --bind "$3" /etc/hosts && exec slurmd -D -N "$2" -f "$4"' \
    sh "$dir/pids/node-$node" "$node" "$dir/hosts" "$dir/slurm.conf" \
    </dev/null >>"$dir/logs/slurmd-$node.out" 2>&1 9>&- &
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
  local nodes=${1:-2} gpus=${2:-2} slot="" s net i node ns veth
  [[ "$nodes" =~ ^[1-9][0-9]?$ && "$gpus" =~ ^[0-9]$ ]] || usage
  install_packages
  do_stop # an earlier cluster in this DIR
  mkdir -p "$registry"
  exec 9>"$registry/lock"
  flock 9
  # Clean every leftover slot of a crashed run, then take the first free one.
  for s in 0 1 2 3 4 5 6 7; do
    if [[ -e "$registry/slot$s" ]]; then
      local owner
      owner=$(cat "$registry/slot$s")
      holder_alive "$owner/holder" && continue
      clean_slot "$s" "$owner"
    elif slot_in_use "$s"; then
      clean_slot "$s" /nonexistent
    fi
    [[ -z "$slot" ]] && slot=$s
  done
  if [[ -z "$slot" ]]; then
    echo "slurm.sh: all 8 cluster slots are held by running processes" >&2
    exit 1
  fi
  proc_id "${SLOTSWEEP_SLURM_HOLDER:-$PPID}" >"$dir/holder"
  echo "$slot" >"$dir/slot"
  echo "$dir" >"$registry/slot$slot"
  trap start_failed EXIT
  net=$(slot_net "$slot")

  # Network: a bridge with the controller's address; each node a namespace with eth0.
  ip link add "$(slot_bridge "$slot")" type bridge
  ip addr add "$net.1/24" dev "$(slot_bridge "$slot")"
  ip link set "$(slot_bridge "$slot")" up
  for i in $(seq 1 "$nodes"); do
    node="ssnode$i"
    ns=$(slot_netns "$slot" "$node")
    veth=$(slot_veth "$slot" "$i")
    ip netns add "$ns"
    ip link add "$veth" type veth peer name "${veth}p"
    ip link set "${veth}p" netns "$ns"
    ip link set "$veth" master "$(slot_bridge "$slot")" up
    nsenter --net="/run/netns/$ns" sh -c "
      ip link set lo up &&
      ip link set ${veth}p name eth0 &&
      ip addr add $net.$((10 + i))/24 dev eth0 &&
      ip link set eth0 up"
  done

  # Files. A fresh state every start: no jobs or node states of an earlier cluster.
  rm -rf "$dir/ctld" "$dir/nodes" "$dir/logs" "$dir/munge" "$dir/dev" "$dir/pids"
  mkdir -p "$dir/ctld" "$dir/logs" "$dir/munge" "$dir/dev" "$dir/pids"
  chmod 0755 "$dir"
  {
    echo "127.0.0.1 localhost"
    echo "::1 localhost ip6-localhost ip6-loopback"
    # This machine's own name too: seen from a node, this machine (the test, its
    # servers) is the controller address.
    echo "$net.1 sscontrol $(uname -n)"
    for i in $(seq 1 "$nodes"); do echo "$net.$((10 + i)) ssnode$i"; done
  } >"$dir/hosts"
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
