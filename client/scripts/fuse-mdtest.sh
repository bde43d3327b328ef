#!/usr/bin/env bash
# mdtest-like comparison of a Talon FUSE mount with tmpfs and ext4 on a loop device
# and JuiceFS (SQLite and Redis metadata engines, when `juicefs` and `redis-server` are
# on PATH). Not a test: it prints a table.
#
# For each target and each file size (4 KiB, 110 KiB) and process count (1, 8), every
# process creates FILES files in its own directory (create+write+close), then stats them
# all, then opens, reads and closes them all; the rate of each phase is files per second
# over all processes.
#
# Usage (as root; needs fusermount3, mkfs.ext4, python3):
#   cargo build --release -p talon-client
#   client/scripts/fuse-mdtest.sh [FILES_PER_PROCESS]
# Environment: TALON (the talon binary, default target/release/talon), WORK (scratch
# directory, default a new one under /tmp), LISTEN (talon up's address, default
# 127.0.0.1:7101), REDIS_PORT (the private Redis server for JuiceFS, default 6391).
set -euo pipefail

FILES="${1:-2000}"
HERE="$(cd "$(dirname "$0")" && pwd)"
WORK_PREFIX=talon-mdtest
# shellcheck source=common.sh
. "$HERE/common.sh"
LISTEN="${LISTEN:-127.0.0.1:7101}"
REDIS_PORT="${REDIS_PORT:-6391}"

# One phase driver, run per process: python keeps the per-file work to system calls.
cat > "$WORK/phase.py" <<'PY'
import os, sys, time
phase, root, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
body = os.urandom(size)
names = [os.path.join(root, "f%06d" % i) for i in range(n)]
t = time.perf_counter()
if phase == "create":
    os.makedirs(root, exist_ok=True)
    for p in names:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, body)
        os.close(fd)
elif phase == "stat":
    for p in names:
        os.stat(p)
elif phase == "read":
    for p in names:
        fd = os.open(p, os.O_RDONLY)
        while os.read(fd, 1 << 20):
            pass
        os.close(fd)
elif phase == "remove":
    for p in names:
        os.unlink(p)
    os.rmdir(root)
print(time.perf_counter() - t)
PY

# run_phase DIR PHASE PROCS SIZE -> prints files/s
run_phase() {
  local dir="$1" phase="$2" procs="$3" size="$4" start end pids=()
  start=$(date +%s.%N)
  for p in $(seq 1 "$procs"); do
    python3 "$WORK/phase.py" "$phase" "$dir/p$p" "$FILES" "$size" >/dev/null &
    pids+=($!)
  done
  wait "${pids[@]}"
  end=$(date +%s.%N)
  python3 -c "print(int($procs * $FILES / ($end - $start)))"
}

bench() {
  local name="$1" dir="$2"
  for size in 4096 112640; do
    for procs in 1 8; do
      local d="$dir/run-$size-$procs"
      mkdir -p "$d"
      sync
      local c s r
      c=$(run_phase "$d" create "$procs" "$size")
      s=$(run_phase "$d" stat "$procs" "$size")
      r=$(run_phase "$d" read "$procs" "$size")
      run_phase "$d" remove "$procs" "$size" >/dev/null
      printf "%-10s %8s %5s %12s %12s %12s\n" "$name" "$size" "$procs" "$c" "$s" "$r"
    done
  done
}

printf "%-10s %8s %5s %12s %12s %12s\n" target bytes procs create/s stat/s read/s

# tmpfs
mkdir -p "$WORK/tmpfs"
mount -t tmpfs -o size=4g tmpfs "$WORK/tmpfs"
MOUNTS+=("$WORK/tmpfs")
bench tmpfs "$WORK/tmpfs"

# ext4 on a loop device
truncate -s 4G "$WORK/ext4.img"
mkfs.ext4 -q "$WORK/ext4.img"
mkdir -p "$WORK/ext4"
mount -o loop "$WORK/ext4.img" "$WORK/ext4"
MOUNTS+=("$WORK/ext4")
bench ext4 "$WORK/ext4"

# Talon: a single-node `talon up` in the scratch directory.
talon_up "$WORK/talon-mnt" "$LISTEN"
bench talon "$WORK/talon-mnt"

# JuiceFS (optional, when `juicefs` is on PATH): local-file object storage, with its
# SQLite metadata engine, and with Redis (when `redis-server` is on PATH; a private
# server on loopback, persistence as Redis ships it: no fsync per change).
jfs_bench() {
  local name="$1" meta="$2"
  juicefs format "$meta" --storage file --bucket "$WORK/$name-bucket/" "$name" \
    >"$WORK/$name-format.log" 2>&1
  mkdir -p "$WORK/$name"
  juicefs mount -d "$meta" "$WORK/$name" >"$WORK/$name-mount.log" 2>&1
  MOUNTS+=("$WORK/$name")
  bench "$name" "$WORK/$name"
  juicefs umount "$WORK/$name" >/dev/null 2>&1 || true
}
if command -v juicefs >/dev/null; then
  jfs_bench jfs-sqlite "sqlite3://$WORK/jfs.db"
  if command -v redis-server >/dev/null; then
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$WORK" --daemonize no \
      >"$WORK/redis.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 50); do
      redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
      sleep 0.1
    done
    jfs_bench jfs-redis "redis://127.0.0.1:$REDIS_PORT/1"
  fi
fi
echo "scratch: $WORK"
