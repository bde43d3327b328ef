#!/usr/bin/env bash
# Runs the pjdfstest POSIX conformance suite against ext4 (on a loop device, the bar) and
# a Talon mount (`talon up`, one node), in a strict and in a relaxed directory, and prints
# each run's summary. Not a test of the suite: pjdfstest is not vendored; build it first.
#
# Usage (as root; needs fusermount3, mkfs.ext4, perl's prove):
#   git clone https://github.com/pjd/pjdfstest && (cd pjdfstest && autoreconf -ifs &&
#     ./configure && make pjdfstest)
#   cargo build --release -p talon-client
#   PJDFSTEST=/path/to/pjdfstest client/scripts/pjdfstest.sh [TESTS_SUBDIR...]
# With no TESTS_SUBDIR, every directory of pjdfstest's tests/ runs (about 4 minutes each on
# a 2-core machine). Environment: TALON (the talon binary, default target/release/talon),
# WORK (scratch directory), LISTEN (talon up's address, default 127.0.0.1:7102).
set -euo pipefail

: "${PJDFSTEST:?set PJDFSTEST to a built pjdfstest checkout}"
HERE="$(cd "$(dirname "$0")" && pwd)"
WORK_PREFIX=talon-pjd
# shellcheck source=common.sh
. "$HERE/common.sh"
LISTEN="${LISTEN:-127.0.0.1:7102}"

tests=()
if [ "$#" -eq 0 ]; then
  tests=("$PJDFSTEST/tests")
else
  for t in "$@"; do tests+=("$PJDFSTEST/tests/$t"); done
fi

# suite NAME DIR: runs the suite inside DIR; prints the summary and failing files.
suite() {
  local name="$1" dir="$2"
  (cd "$dir" && prove -r "${tests[@]}" >"$WORK/$name.out" 2>&1) || true
  echo "== $name"
  grep -E "^Files=|^Result:|Failed tests:|^/.*\(Wstat" "$WORK/$name.out" || true
}

truncate -s 1G "$WORK/ext4.img"
mkfs.ext4 -q "$WORK/ext4.img"
mkdir -p "$WORK/ext4"
mount -o loop "$WORK/ext4.img" "$WORK/ext4"
MOUNTS+=("$WORK/ext4")
suite ext4 "$WORK/ext4"

talon_up "$WORK/mnt" "$LISTEN" --allow-other
"$TALON" mkdir --cluster "$LISTEN" --strict /strict
mkdir "$WORK/mnt/relaxed"
chmod 0777 "$WORK/mnt/strict" "$WORK/mnt/relaxed"
suite talon-strict "$WORK/mnt/strict"
suite talon-relaxed "$WORK/mnt/relaxed"
echo "outputs: $WORK"
