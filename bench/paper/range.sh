#!/usr/bin/env bash
# Sherman §5.3: range queries at the paper's scale (8 memory nodes, 8
# compute nodes x 22 threads) on the simulator. Range-only at sizes 100 and
# 1000 (every scan reads exactly that many records from a uniform start),
# then the range-write mix: half the client threads insert, half run
# range-100. The paper: FG+ 2% ahead of Sherman at 100, the two about equal
# at 1000, Sherman up to 1.82x FG+ in the range-write mix.
source "$(dirname "$0")/common.sh"
SYS=sherman,fg,sherman-2rt
MD="$OUT/range.md"
echo "# Range queries (Sherman §5.3), sim, $RECORDS records" > "$MD"
for size in 100 1000; do
  "$LB" run --systems "$SYS" --workload "range-$size" --records "$RECORDS" --ops "${RANGE_OPS:-500}" --json > "$OUT/range-$size.json"
done
# Measured over a window of virtual time, so that both halves run all of it.
"$LB" run --systems "$SYS" --workload range-100 --half-workload insert-only --records "$RECORDS" --seconds "${RANGE_SECONDS:-0.01}" --json > "$OUT/range-write.json"
python3 "$(dirname "$0")/table.py" range "$MD" "$OUT/range-100.json" "$OUT/range-1000.json" "$OUT/range-write.json"
echo "wrote $MD"
