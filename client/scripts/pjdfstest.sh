#!/usr/bin/env bash
# Runs the pjdfstest POSIX conformance suite against ext4 (on a loop device, the bar), a
# `talon up` mount (one node, run as the README runs it) and a `talon mount` of a 3-node
# cluster (3 replicas), each in a relaxed and in a strict directory, and prints each run's
# summary with every failing test file and its failing subtests. Not a test of the suite:
# pjdfstest is not vendored; build it first.
#
# Usage (as root; needs fusermount3, mkfs.ext4, perl's prove):
#   git clone https://github.com/pjd/pjdfstest && (cd pjdfstest && autoreconf -ifs &&
#     ./configure && make pjdfstest)
#   cargo build --release -p talon-client -p talon-meta --bins
#   PJDFSTEST=/path/to/pjdfstest client/scripts/pjdfstest.sh [TESTS_SUBDIR...]
# With no TESTS_SUBDIR, every directory of pjdfstest's tests/ runs (about 4 minutes per
# suite on a 2-core machine). Environment: TARGETS (any of `ext4 up cluster`, default
# all three), TALON and TALON_META (the binaries, default target/release/), WORK (scratch
# directory), LISTEN (talon up's address, default 127.0.0.1:7102), CLUSTER_PORT (first of
# the cluster's three ports, default 7111).
set -euo pipefail

if [ -z "${PJDFSTEST:-}" ]; then
  echo "pjdfstest: skipped (set PJDFSTEST to a built pjdfstest checkout)"
  exit 0
fi
HERE="$(cd "$(dirname "$0")" && pwd)"
WORK_PREFIX=talon-pjd
# shellcheck source=common.sh
. "$HERE/common.sh"
TALON_META="${TALON_META:-$TARGET_DIR/release/talon-meta}"
TARGETS="${TARGETS:-ext4 up cluster}"
LISTEN="${LISTEN:-127.0.0.1:7102}"
CLUSTER_PORT="${CLUSTER_PORT:-7111}"

tests=()
if [ "$#" -eq 0 ]; then
  tests=("$PJDFSTEST/tests")
else
  for t in "$@"; do tests+=("$PJDFSTEST/tests/$t"); done
fi

# suite NAME DIR: runs the suite inside DIR (made if missing); prints the totals and each
# failing test file with its failing subtests.
suite() {
  local name="$1" dir="$2"
  mkdir -p "$dir"
  (cd "$dir" && prove -rf "${tests[@]}" >"$WORK/$name.out" 2>&1) || true
  echo "== $name"
  awk '/^Test Summary Report/ { p = 1 } p || /^Files=|^Result:/' "$WORK/$name.out" |
    sed "s|$PJDFSTEST/tests/||"
}

# talon_suites NAME MOUNTPOINT: a relaxed and a strict (under /checkpoints) directory.
talon_suites() {
  suite "$1-relaxed" "$2/pjd"
  suite "$1-strict" "$2/checkpoints/pjd"
}

for target in $TARGETS; do
  case "$target" in
  ext4)
    truncate -s 1G "$WORK/ext4.img"
    mkfs.ext4 -q "$WORK/ext4.img"
    mkdir -p "$WORK/ext4"
    mount -o loop "$WORK/ext4.img" "$WORK/ext4"
    MOUNTS+=("$WORK/ext4")
    suite ext4 "$WORK/ext4"
    ;;
  up)
    talon_up "$WORK/up" "$LISTEN"
    talon_suites talon-up "$WORK/up"
    ;;
  cluster)
    nodes="" addrs=""
    for id in 1 2 3; do
      addr="127.0.0.1:$((CLUSTER_PORT + id - 1))"
      nodes="$nodes${nodes:+,}$id=$addr"
      addrs="$addrs${addrs:+,}$addr"
    done
    "$TALON_META" init --nodes "$nodes" --replication 3 --data-root "$WORK/cluster" \
      --out "$WORK/cluster" >/dev/null
    for id in 1 2 3; do
      "$TALON_META" start --config "$WORK/cluster/node$id.toml" >"$WORK/node$id.log" 2>&1 &
      PIDS+=($!)
    done
    for _ in $(seq 1 100); do # until the cluster answers
      "$TALON" ls --cluster "$addrs" / >/dev/null 2>&1 && break
      sleep 0.2
    done
    mkdir -p "$WORK/cm"
    "$TALON" mount "$WORK/cm" --cluster "$addrs" 2>"$WORK/mount.log" &
    PIDS+=($!)
    MOUNTS+=("$WORK/cm")
    for _ in $(seq 1 100); do
      grep -q "mounted" "$WORK/mount.log" && break
      sleep 0.2
    done
    grep -q "mounted" "$WORK/mount.log" || { cat "$WORK/mount.log"; exit 1; }
    talon_suites talon-cluster "$WORK/cm"
    ;;
  *)
    echo "pjdfstest: unknown target $target (ext4, up or cluster)" >&2
    exit 2
    ;;
  esac
done
echo "outputs: $WORK"
