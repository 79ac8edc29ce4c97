#!/usr/bin/env bash
# Issue 17's read path (ours, not the paper's), in wall time on this host:
# one thread, uniform YCSB-C, Sherman and FG+ lookups per second against
# the same run's BTreeMap reference (item 6), and the executor's CPU a
# verb: one core, 8-byte READs, 16 in flight, one verb a doorbell (item
# 7). ROUNDS rounds (default 7) of each; the table gives every round and
# each figure's median and range. Run it on a quiet host: wall-clock
# figures take whatever else runs. On a NIC: BACKEND=mlx5 DEVICE=mlx5_0
# FEATURES=bench/mlx5 (the NIC in loopback).
source "$(dirname "$0")/common.sh"
BACKEND="${BACKEND:-emu}"
ROUNDS="${ROUNDS:-7}"
DEV=()
if [ -n "${DEVICE:-}" ]; then DEV=(--device "$DEVICE"); fi
# The tree measured, named before anything is written; "dirty" for changes
# to the code, not to the results (the tables are tracked files: written
# first, or left from a run before, they made every tree dirty).
COMMIT="$(git -C "$ROOT" describe --always)"
if [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no -- . ':(exclude)bench/paper/results')" ]; then
    COMMIT="$COMMIT-dirty"
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
for i in $(seq "$ROUNDS"); do
    "$LB" run --backend "$BACKEND" "${DEV[@]}" --threads 1 --workload ycsb-c --zipf 0 --json > "$TMP/run-$i.json"
    "$LB" verbs --backend "$BACKEND" "${DEV[@]}" --depth 16 -D 1 --json > "$TMP/verbs-$i.json"
    echo "round $i of $ROUNDS done" >&2
done
MD="$OUT/read_path-$BACKEND.md"
{
    echo "# The read path on $BACKEND (issue 17, items 6 and 7)"
    echo
    echo "Host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs;" \
        "commit $COMMIT; $(date -u +%Y-%m-%d)."
    echo
} > "$MD"
runs=(); verbs=()
for i in $(seq "$ROUNDS"); do runs+=("$TMP/run-$i.json"); verbs+=("$TMP/verbs-$i.json"); done
python3 "$(dirname "$0")/table.py" read-path "$MD" "${runs[@]}" "${verbs[@]}"
echo "wrote $MD"
cat "$MD"
