#!/usr/bin/env bash
# Sherman §5.2 / Figure 8: FG+ and each technique added in turn, skewed
# (zipf 0.99) and uniform, write-intensive, at the paper's scale
# (8 memory nodes, 8 compute nodes x 22 threads) on the simulator.
source "$(dirname "$0")/common.sh"
SYS=fg,fg+comb,fg+comb+onchip,fg+comb+onchip+hier,sherman,sherman-2rt
MD="$OUT/breakdown.md"
echo "# Technique breakdown (Sherman §5.2.1), sim, $RECORDS records" > "$MD"
for z in 0.99 0; do
  "$LB" run --systems "$SYS" --zipf "$z" --records "$RECORDS" --ops "$OPS" --plot "$OUT/breakdown-z$z" --json > "$OUT/breakdown-z$z.json"
done
python3 "$(dirname "$0")/table.py" breakdown "$MD" "$OUT/breakdown-z0.99.json" "$OUT/breakdown-z0.json"
echo "wrote $MD"
