# Network namespaces for the throw-away test clusters of .ci/slurm.sh and .ci/ray.sh,
# sourced by both: each cluster takes a slot N (up to 8 at once), a bridge in the root
# namespace at <net>.1 and one namespace per node at <net>.(10 + i), joined to the
# bridge by a veth pair, with a host name and a private /etc/hosts of its own.
#
# The sourcing script sets, before calling anything here:
#   ns_prefix    names of a slot's links and namespaces (ssw, rsw): <prefix>N...
#   ns_net_base  the first two octets of its subnets: slot N is <base>.<7+N>.0/24
#   registry     the folder recording which cluster folder holds each slot
#   dir          the cluster's folder (slot, holder, pids, hosts)
# Needs root.

# Network names and addresses of slot $1.
slot_bridge() { echo "${ns_prefix}$1br"; }
slot_netns() { echo "${ns_prefix}$1-$2"; } # slot, node name
slot_veth() { echo "${ns_prefix}$1n$2"; }  # slot, node index: the root-namespace end
slot_net() { echo "$ns_net_base.$((7 + $1))"; }

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

netns_pids() { ip netns pids "$1" 2>/dev/null || true; }

# The namespaces of slot $1.
slot_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep "^${ns_prefix}$1-" || true; }

slot_in_use() { # slot: has a namespace, link or claim
  [[ -e "$registry/slot$1" ]] && return 0
  ip link show "$(slot_bridge "$1")" >/dev/null 2>&1 && return 0
  [[ -n "$(slot_namespaces "$1")" ]] && return 0
  return 1
}

# Remove slot $1's namespaces, veths and bridge and its claim (once nothing runs there),
# and empty the pid files of its folder $2 (which may be gone).
remove_slot_network() {
  local slot=$1 owner=$2 ns f
  for ns in $(slot_namespaces "$slot"); do
    ip netns delete "$ns" 2>/dev/null || true
  done
  for f in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^${ns_prefix}${slot}n[0-9]*$" || true); do
    ip link delete "$f" 2>/dev/null || true
  done
  ip link delete "$(slot_bridge "$slot")" 2>/dev/null || true
  rm -f "$registry/slot$slot"
  if [[ -d "$owner/pids" ]]; then rm -f "$owner"/pids/*; fi
}

# Clean every leftover slot of a crashed run with "$1 SLOT OWNER_DIR", take the first
# free one for $dir, held by process $2; sets slot. Holds the registry's lock (fd 9) from
# here on: the caller's start runs alone.
claim_slot() {
  local clean=$1 holder=$2 s owner
  mkdir -p "$registry"
  exec 9>"$registry/lock"
  flock 9
  slot=""
  for s in 0 1 2 3 4 5 6 7; do
    if [[ -e "$registry/slot$s" ]]; then
      owner=$(cat "$registry/slot$s")
      holder_alive "$owner/holder" && continue
      "$clean" "$s" "$owner"
    elif slot_in_use "$s"; then
      "$clean" "$s" /nonexistent
    fi
    [[ -z "$slot" ]] && slot=$s
  done
  if [[ -z "$slot" ]]; then
    echo "$(basename "$0"): all 8 cluster slots are held by running processes" >&2
    exit 1
  fi
  proc_id "$holder" >"$dir/holder"
  echo "$slot" >"$dir/slot"
  echo "$dir" >"$registry/slot$slot"
}

# Slot $1's bridge with the root namespace's address <net>.1 and a namespace with eth0
# at <net>.(10 + i) for the i-th node named in the rest.
make_slot_network() {
  local slot=$1 net i=0 node ns veth
  shift
  net=$(slot_net "$slot")
  ip link add "$(slot_bridge "$slot")" type bridge
  ip addr add "$net.1/24" dev "$(slot_bridge "$slot")"
  ip link set "$(slot_bridge "$slot")" up
  for node in "$@"; do
    i=$((i + 1))
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
}

# The hosts file $1 of slot $2's nodes: this machine as <net>.1 under the name $3 (seen
# from a node, the test and its servers are there), the nodes (the rest) in order.
write_hosts() {
  local file=$1 net i=0 node
  net=$(slot_net "$2")
  {
    echo "127.0.0.1 localhost"
    echo "::1 localhost ip6-localhost ip6-loopback"
    echo "$net.1 $3 $(uname -n)"
    shift 3
    for node in "$@"; do
      i=$((i + 1))
      echo "$net.$((10 + i)) $node"
    done
  } >"$file"
}

# In the background, run the command in the rest as node $2 of slot $1: in its network
# namespace (`nsenter --net`, not `ip netns exec`, which remounts /sys and hides the
# cgroup mounts slurmd needs), with its host name and $dir/hosts as /etc/hosts in a
# mount namespace of its own, as the leader of a new session, output appended to log
# $4. The exec chain (setsid, nsenter, unshare, sh) keeps one PID, which sh writes to
# $3 before it execs the command. Descriptors are closed so no caller waits on our
# pipes or lock.
run_on_node() {
  local ns pidfile=$3 node=$2 log=$4
  ns=$(slot_netns "$1" "$node")
  shift 4
  setsid nsenter --net="/run/netns/$ns" unshare --uts --mount \
    sh -c 'echo $$ >"$1" && hostname "$2" && mount --bind "$3" /etc/hosts && shift 3 && exec "$@"' \
    sh "$pidfile" "$node" "$dir/hosts" "$@" \
    </dev/null >>"$log" 2>&1 9>&- &
}
