# bench/common.sh: shell helpers shared by bench/compare and bench/scale (sourced, not run).
# The sourcing script sets PROG (its name, for messages), WORK (its scratch directory),
# TALON and TALON_META (binaries); this file installs the EXIT trap that unmounts what is
# in MOUNTS, stops what is in PIDS and removes WORK.

PIDS=()
MOUNTS=()
cleanup() {
  local status=$?
  set +e
  trap - EXIT INT TERM
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    local m="${MOUNTS[$i]}"
    if mountpoint -q "$m"; then
      fusermount3 -u "$m" 2>/dev/null || umount "$m" 2>/dev/null || umount -l "$m"
    fi
  done
  # A JuiceFS daemon (`juicefs mount -d`) outlives its unmounted mount point, and once its
  # Redis below is stopped it keeps retrying it, on a sixth of a core, after the run.
  pkill -KILL -f -- "juicefs mount -d .* $WORK/" 2>/dev/null
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    kill "${PIDS[$i]}" 2>/dev/null
  done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  wait 2>/dev/null
  # Remove the scratch directory only when nothing is mounted below it any more.
  if ! grep -q " $WORK/" /proc/mounts; then
    rm -rf "$WORK"
  else
    echo "$PROG: left $WORK in place: something is still mounted below it" >&2
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "$PROG: $*" >&2; }
die() { log "$*"; exit 1; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_for SECONDS COMMAND...: polls COMMAND every 0.2 s.
wait_for() {
  local secs="$1"
  shift
  for _ in $(seq 1 $((secs * 5))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}

# start_talon3 DIR: a 3-node cluster of separate `talon-meta` processes (16 partitions,
# R=3; configs, data and logs under DIR); sets ADDRS, the client's seed list, once the
# cluster answers. (Not in a command substitution: the nodes must be this shell's children.)
start_talon3() {
  local dir="$1" p1 p2 p3
  p1=$(free_port) p2=$(free_port) p3=$(free_port)
  ADDRS="127.0.0.1:$p1,127.0.0.1:$p2,127.0.0.1:$p3"
  "$TALON_META" init --nodes "1=127.0.0.1:$p1,2=127.0.0.1:$p2,3=127.0.0.1:$p3" \
    --partitions 16 --replication 3 --data-root "$dir/data" --out "$dir" >&2
  for n in 1 2 3; do
    start_node "$dir" "$n"
  done
  wait_for 60 "$TALON" --cluster "$ADDRS" ls / || die "the 3-node cluster did not come up"
}

# start_node DIR N: starts node N of the cluster in DIR (log appended to DIR/nodeN.log);
# its pid is in NODE_PID[N] and in PIDS.
declare -A NODE_PID
start_node() {
  local dir="$1" n="$2"
  "$TALON_META" start --config "$dir/node$n.toml" >>"$dir/node$n.log" 2>&1 &
  NODE_PID[$n]=$!
  PIDS+=($!)
}
