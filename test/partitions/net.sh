# test/partitions/net.sh: the partition suite's network.  Every node (two
# PostgreSQL servers, three Kafka nodes, the clients) runs in a network
# namespace of its own, joined to a bridge this file creates; addresses
# exist only inside those namespaces.  Partitions are real drops of real
# packets: a node's veth taken down (silent, both ways, from everyone), or
# a route inside a namespace (blackhole: silent; unreachable or prohibit:
# refused at once) that drops what one node sends another (one way, or
# both when set on both sides).  tc netem is not needed.
#
# Source it, then: net_setup NODE...; net_exec NODE CMD...; net_cut A B;
# net_heal; net_teardown (also from an EXIT trap: it kills every process
# left in the namespaces and removes them and the bridge).
#
# NET_TAG names the run's objects (interface names are at most 15 bytes):
# the bridge NET_TAG, namespaces NET_TAG-NODE, veths NET_TAG+NODE.

NET_TAG=${NET_TAG:-obp$$}
NET_PREFIX=${NET_PREFIX:-10.231.$(($$ % 200 + 20))}
NET_NODES=()
declare -A NET_IP
# The routes net_block added, "NODE KIND ADDR" each, for net_heal.
NET_BLOCKS=()

# net_ns NODE: the namespace of NODE.
net_ns() {
    echo "$NET_TAG-$1"
}

# net_addr NODE: NODE's address.
net_addr() {
    echo "${NET_IP[$1]}"
}

# net_usable: whether this system lets the suite make a namespace, put a
# veth in it, and work in it with ip -n and nsenter (a container or a
# chroot without the rights, or whose / is no mount point, refuses one of
# them: ip -n remounts /, which test/matrix's root file systems refuse).
# Leaves nothing behind.
net_usable() {
    local ns=$NET_TAG-probe ok=1
    ip netns add "$ns" 2>/dev/null || return 1
    ip link add "${NET_TAG}p" type veth peer name eth0 netns "$ns" 2>/dev/null || ok=
    [ -n "$ok" ] && { ip -n "$ns" link set lo up 2>/dev/null || ok=; }
    [ -n "$ok" ] && { nsenter --net="/var/run/netns/$ns" -- true 2>/dev/null || ok=; }
    ip link del "${NET_TAG}p" 2>/dev/null
    ip netns del "$ns" 2>/dev/null
    [ -n "$ok" ]
}

# net_setup NODE:OCTET...: the bridge, then a namespace, a veth and the
# address NET_PREFIX.OCTET for each NODE.
net_setup() {
    local spec node octet
    ip link add "$NET_TAG" type bridge || return 1
    ip link set "$NET_TAG" up || return 1
    for spec in "$@"; do
        node=${spec%%:*} octet=${spec#*:}
        net_add_node "$node" "$NET_PREFIX.$octet" || return 1
    done
}

# net_add_node NODE ADDR: NODE's namespace, with loopback up and a veth on
# the bridge holding ADDR.
net_add_node() {
    local ns veth
    ns=$(net_ns "$1") veth=$NET_TAG$1
    ip netns add "$ns" || return 1
    NET_NODES+=("$1")
    NET_IP[$1]=$2
    ip link add "$veth" type veth peer name eth0 netns "$ns" || return 1
    ip link set "$veth" master "$NET_TAG" up || return 1
    ip -n "$ns" addr add "$2/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    ip -n "$ns" link set lo up
}

# net_exec NODE CMD...: run CMD in NODE's namespace.  nsenter execs CMD
# itself (ip netns exec forks it), so $! of "net_exec ... &" is CMD's own
# process, which a signal then reaches.
net_exec() {
    nsenter --net="$(net_path "$1")" -- "${@:2}"
}

# net_path NODE: the file naming NODE's namespace.
net_path() {
    echo "/var/run/netns/$(net_ns "$1")"
}

# net_link NODE up|down: NODE's bridge port up or down: down, nothing
# reaches NODE or leaves it, and no one is told.
net_link() {
    ip link set "$NET_TAG$1" "$2"
}

# net_block FROM TO [KIND]: FROM's packets to TO dropped inside FROM's
# namespace (KIND blackhole, silent, by default; unreachable or prohibit
# make the sender's kernel refuse them).  TO's packets still reach FROM.
net_block() {
    local kind=${3:-blackhole}
    ip -n "$(net_ns "$1")" route add "$kind" "${NET_IP[$2]}" || return 1
    NET_BLOCKS+=("$1 $kind ${NET_IP[$2]}")
}

# net_cut A B...: A and each B cannot reach each other, both ways, silently.
net_cut() {
    local a=$1 b
    shift
    for b in "$@"; do
        net_block "$a" "$b" && net_block "$b" "$a" || return 1
    done
}

# net_heal: every route net_block added removed, every bridge port up.
net_heal() {
    local block node kind addr
    for block in "${NET_BLOCKS[@]}"; do
        read -r node kind addr <<<"$block"
        ip -n "$(net_ns "$node")" route del "$kind" "$addr" 2>/dev/null
    done
    NET_BLOCKS=()
    for node in "${NET_NODES[@]}"; do net_link "$node" up; done
}

# net_teardown: kill what still runs in the run's namespaces (every
# process there is one this run started), then remove them and the bridge.
net_teardown() {
    local node ns pids
    for node in "${NET_NODES[@]}"; do
        ns=$(net_ns "$node")
        pids=$(ip netns pids "$ns" 2>/dev/null)
        # shellcheck disable=SC2086
        [ -z "$pids" ] || kill -KILL $pids 2>/dev/null
    done
    for node in "${NET_NODES[@]}"; do
        ip netns del "$(net_ns "$node")" 2>/dev/null
    done
    NET_NODES=()
    ip link del "$NET_TAG" 2>/dev/null
    return 0
}
