#!/usr/bin/env bash
# A throw-away multi-node Ray cluster on this one machine, for the tests.
#
#   bash .ci/ray.sh start DIR            -> a head and two worker nodes, their files in DIR
#   bash .ci/ray.sh stop DIR             -> stop every node by session id, remove the network
#   bash .ci/ray.sh node-stop DIR NODE   -> "power off" one node (SIGKILL all its processes)
#   bash .ci/ray.sh node-start DIR NODE  -> start that node again (a new Ray node id)
#
# Why it looks like this (../shared/DESIGN.md, the Ray recipe): Ray and torchrun need one
# host name and address per node, so each node is a network namespace (rayhead at
# 10.214.N.11, raynode1 .12, raynode2 .13) joined by a veth pair to a bridge in the root
# namespace (10.214.N.1, where the test process and its PostgreSQL live), entered with
# `nsenter --net` and `unshare --uts --mount` with its own host name and a private
# /etc/hosts (.ci/netns.sh, shared with .ci/slurm.sh). A driver in the root namespace
# reaches the cluster through Ray Client at
# ray://10.214.N.11:10001 (a plain connection cannot be called back by the nodes).
#
# Each worker node declares 2 CPUs (2 trial slots) and a resource of its own
# (host_<name>); the head declares no CPUs, so trials run on the workers only. Nodes are
# stopped by session id, never with `ray stop` (which kills every Ray process on the
# machine, other clusters included): each node runs `ray start --block` as the leader of
# its own session, and stopping it SIGTERMs the raylet, then the rest but gcs_server, then
# gcs_server (all at once the GCS hangs for ~20 s). The head notices a lost node within
# ~5 s (fast health checks). A Ray Client connection whose server died as Ray's proxier
# forked it (ray-project/ray#63202, about one in 15 spawns) fails after 10 s instead of
# the proxier's 30 (RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S), and slotsweep connects
# again; a server that starts waits at most that long for its channel, which one ready
# takes under a second. Token authentication is off (RAY_AUTH_MODE=disabled): a
# head would turn it on whenever ~/.ray/auth_token exists (any local `ray.init()` on the
# machine writes one), and its workers would then be refused.
#
# `start` prints RAY_ADDRESS=ray://... and writes it to DIR/env; DIR/cluster has the nodes
# and addresses. Several clusters may run at once (up to 8): each takes a free slot N and
# records in /run/slotsweep-ray which process holds it; a slot whose holder (the process
# that ran `start`, or $SLOTSWEEP_RAY_HOLDER) is gone is cleaned up by the next `start`.
# `ray` is $SLOTSWEEP_RAY, else ${SLOTSWEEP_VENV:-.venv}/bin/ray. Needs root.
set -euo pipefail
trap 'echo "ray.sh: command failed (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR

usage() {
  echo "usage: ray.sh start DIR | stop DIR | node-stop DIR NODE | node-start DIR NODE" >&2
  exit 2
}
[[ $# -ge 2 ]] || usage
action=$1
if [[ "$action" == start ]]; then mkdir -p "$2"; elif [[ ! -d "$2" ]]; then
  [[ "$action" == stop ]] && exit 0
  echo "ray.sh: no cluster in $2" >&2
  exit 1
fi
dir=$(cd "$2" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
ray_bin=${SLOTSWEEP_RAY:-$repo/${SLOTSWEEP_VENV:-.venv}/bin/ray}

registry=/run/slotsweep-ray
ns_prefix=rsw
ns_net_base=10.214
# shellcheck source=.ci/netns.sh
source "$(dirname "$0")/netns.sh"
nodes=(rayhead raynode1 raynode2)
node_index() { # node name -> 1, 2, 3
  local i
  for i in "${!nodes[@]}"; do [[ "${nodes[$i]}" == "$1" ]] && { echo $((i + 1)); return 0; }; done
  return 1
}

# Live (not zombie) processes of session $1, with their command names: "PID COMM".
session_procs() {
  ps -e -o pid=,sid=,stat=,comm= 2>/dev/null |
    awk -v sid="$1" '$2 == sid && $3 !~ /^Z/ {print $1, $4}'
}

# Wait up to $2 tenths of a second until no process in "PIDS" ($1) is alive (zombies
# count as gone: PID 1 may reap them late).
wait_gone() {
  local pids=$1 n=$2 pid state left
  for _ in $(seq 1 "$n"); do
    left=0
    for pid in $pids; do
      state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)
      [[ -n "$state" && "$state" != Z ]] && left=1
    done
    [[ $left -eq 1 ]] || return 0
    sleep 0.1
  done
  return 1
}

# Stop the Ray node whose session id is $1: raylet, then the rest but gcs_server, then
# gcs_server; SIGKILL whatever is left after a few seconds.
stop_session() {
  local sid=$1 raylet rest gcs
  [[ -n "$sid" ]] || return 0
  raylet=$(session_procs "$sid" | awk '$2 == "raylet" {print $1}')
  if [[ -n "$raylet" ]]; then
    kill -TERM $raylet 2>/dev/null || true
    wait_gone "$raylet" 50 || true
  fi
  rest=$(session_procs "$sid" | awk '$2 != "gcs_server" {print $1}')
  if [[ -n "$rest" ]]; then
    kill -TERM $rest 2>/dev/null || true
    wait_gone "$rest" 30 || true
  fi
  gcs=$(session_procs "$sid" | awk '{print $1}')
  if [[ -n "$gcs" ]]; then
    kill -TERM $gcs 2>/dev/null || true
    wait_gone "$gcs" 30 || true
  fi
  rest=$(session_procs "$sid" | awk '{print $1}')
  if [[ -n "$rest" ]]; then
    kill -KILL $rest 2>/dev/null || true
    wait_gone "$rest" 50 || true
  fi
}

# The session id recorded for node $2 in directory $1, if that process still leads it.
node_sid() {
  local f=$1/pids/$2 want
  want=$(cat "$f" 2>/dev/null) || return 0
  [[ -n "$want" && "$(proc_id "${want%% *}")" == "$want" ]] && echo "${want%% *}"
  return 0
}

# Stop everything of slot $1 whose files are in directory $2 (may be gone), then remove
# its namespaces, veths and bridge.
clean_slot() {
  local slot=$1 owner=$2 node ns pids
  # Workers first, the head last (a worker whose GCS went first waits to reconnect).
  for node in raynode2 raynode1 rayhead; do
    [[ -d "$owner/pids" ]] && stop_session "$(node_sid "$owner" "$node")"
  done
  for ns in $(slot_namespaces "$slot"); do
    pids=$(netns_pids "$ns")
    if [[ -n "$pids" ]]; then
      kill -KILL $pids 2>/dev/null || true
      wait_gone "$pids" 50 || true
    fi
  done
  remove_slot_network "$slot" "$owner"
  rm -rf "/tmp/rsw$slot"
}

# Start node $1 in its namespace under a session of its own; "PID STARTTIME" of the
# session leader goes to DIR/pids/NODE.
start_node() {
  local node=$1 slot net i addr args
  slot=$(cat "$dir/slot")
  net=$(slot_net "$slot")
  i=$(node_index "$node")
  addr="$net.$((10 + i))"
  # Ray's socket paths must stay short (108 bytes): a temp dir under /tmp, not DIR.
  args=(--block --node-ip-address="$addr" --disable-usage-stats
    --temp-dir="/tmp/rsw$slot/$node" --object-store-memory=200000000
    --resources="{\"host_$node\": 1}")
  if [[ "$node" == rayhead ]]; then
    args+=(--head --port=6379 --num-cpus=0 --num-gpus=0 --include-dashboard=false
      --ray-client-server-port=10001)
  else
    args+=(--address="$net.11:6379" --num-cpus=2 --num-gpus=0)
  fi
  mkdir -p "/tmp/rsw$slot/$node"
  # The session's leader is recorded before it execs `ray start`.
  run_on_node "$slot" "$node" "$dir/pids/$node.new" "$dir/logs/$node.out" \
    env RAY_health_check_period_ms=1000 RAY_health_check_timeout_ms=1000 \
    RAY_health_check_failure_threshold=3 RAY_AUTH_MODE=disabled \
    RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S=10 \
    "$ray_bin" start "${args[@]}"
  for _ in $(seq 1 50); do [[ -s "$dir/pids/$node.new" ]] && break; sleep 0.1; done
  proc_id "$(cat "$dir/pids/$node.new")" >"$dir/pids/$node"
  rm -f "$dir/pids/$node.new"
}

# Wait up to $1 s until the cluster lists the alive nodes named in the rest.
wait_alive() {
  local timeout=$1
  shift
  local deadline=$((SECONDS + timeout)) alive=""
  while [[ $SECONDS -lt $deadline ]]; do
    alive=$(RAY_ADDRESS="ray://$(slot_net "$(cat "$dir/slot")").11:10001" timeout 60 \
      "$(dirname "$ray_bin")/python" - "$@" 2>/dev/null <<'EOF' || true
import sys, ray
ray.init(logging_level="ERROR")
hosts = {n["NodeManagerHostname"] for n in ray.nodes() if n["Alive"]}
print("ok" if set(sys.argv[1:]) <= hosts else " ".join(sorted(hosts)))
EOF
    )
    [[ "$alive" == ok ]] && return 0
    sleep 1
  done
  echo "ray.sh: alive nodes after ${timeout}s: '$alive' (wanted $*); logs in $dir/logs" >&2
  return 1
}

# ---------------------------------------------------------------- actions

do_stop() {
  [[ -f "$dir/slot" ]] || return 0
  clean_slot "$(cat "$dir/slot")" "$dir"
  rm -f "$dir/slot" "$dir/holder"
}

start_failed() {
  echo "ray.sh: start failed; last log lines:" >&2
  tail -n 5 "$dir"/logs/* >&2 2>/dev/null || true
  do_stop
}

do_start() {
  local slot="" net
  [[ -x "$ray_bin" ]] || { echo "ray.sh: $ray_bin not found; pip install 'slotsweep[ray]'" >&2; exit 1; }
  do_stop
  claim_slot clean_slot "${SLOTSWEEP_RAY_HOLDER:-$PPID}"
  trap start_failed EXIT
  net=$(slot_net "$slot")
  make_slot_network "$slot" "${nodes[@]}"

  rm -rf "$dir/logs" "$dir/pids"
  mkdir -p "$dir/logs" "$dir/pids"
  write_hosts "$dir/hosts" "$slot" raycontrol "${nodes[@]}"

  start_node rayhead
  # The workers register with a running GCS only.
  for _ in $(seq 1 300); do
    nsenter --net="/run/netns/$(slot_netns "$slot" rayhead)" \
      bash -c "exec 3<>/dev/tcp/$net.11/6379" 2>/dev/null && break
    sleep 0.2
  done
  start_node raynode1
  start_node raynode2
  wait_alive 120 rayhead raynode1 raynode2
  trap - EXIT

  echo "RAY_ADDRESS=ray://$net.11:10001" >"$dir/env"
  {
    echo "SLOTSWEEP_RAY_CONTROLLER=$net.1"
    echo "SLOTSWEEP_RAY_SUBNET=$net.0/24"
    echo "SLOTSWEEP_RAY_NODES=rayhead:$net.11,raynode1:$net.12,raynode2:$net.13"
  } >"$dir/cluster"
  cat "$dir/env"
}

do_node_stop() {
  local node=$1 ns pids
  [[ -f "$dir/slot" ]] || { echo "ray.sh: no cluster in $dir" >&2; exit 1; }
  ns=$(slot_netns "$(cat "$dir/slot")" "$node")
  [[ -e "/run/netns/$ns" ]] || { echo "ray.sh: no node $node" >&2; exit 1; }
  # A power loss: the raylet, its workers and their torchrun die at once.
  pids=$(netns_pids "$ns")
  if [[ -n "$pids" ]]; then
    kill -KILL $pids 2>/dev/null || true
    wait_gone "$pids" 50 || true
  fi
  rm -f "$dir/pids/$node"
}

do_node_start() {
  local node=$1
  [[ -f "$dir/slot" ]] || { echo "ray.sh: no cluster in $dir" >&2; exit 1; }
  node_index "$node" >/dev/null || { echo "ray.sh: no node $node" >&2; exit 1; }
  [[ -n "$(node_sid "$dir" "$node")" ]] && return 0
  start_node "$node"
  wait_alive 120 "$node"
}

case "$action" in
  start) do_start ;;
  stop) do_stop ;;
  node-stop) [[ $# -eq 3 ]] || usage; do_node_stop "$3" ;;
  node-start) [[ $# -eq 3 ]] || usage; do_node_start "$3" ;;
  *) usage ;;
esac
