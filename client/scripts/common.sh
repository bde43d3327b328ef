# Shared by the comparison scripts (sourced, not run): scratch directory, the talon
# binary, clean-up of every mount and process they start, and a `talon up` starter.
# Expects HERE (the scripts' directory) and WORK_PREFIX to be set by the caller.

TARGET_DIR="${CARGO_TARGET_DIR:-$HERE/../../target}"
TALON="${TALON:-$TARGET_DIR/release/talon}"
WORK="${WORK:-$(mktemp -d "/tmp/$WORK_PREFIX.XXXXXX")}"
mkdir -p "$WORK"
PIDS=()
MOUNTS=()

cleanup() {
  for m in "${MOUNTS[@]}"; do
    fusermount3 -u -z "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

# talon_up MOUNTPOINT LISTEN [ARGS...]: a single-node `talon up` with its data in WORK;
# returns once it is mounted (or prints its log and fails).
talon_up() {
  local mnt="$1" listen="$2"
  shift 2
  mkdir -p "$mnt"
  "$TALON" up "$mnt" --data "$WORK/talon-data" --listen "$listen" "$@" \
    2>"$WORK/talon-up.log" &
  PIDS+=($!)
  MOUNTS+=("$mnt")
  for _ in $(seq 1 100); do
    grep -q "mounted at" "$WORK/talon-up.log" && return 0
    sleep 0.2
  done
  cat "$WORK/talon-up.log"
  return 1
}
