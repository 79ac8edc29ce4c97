#!/usr/bin/env bash
# Sherman §5.4: throughput as client threads grow from 48 to 528
# (8 compute nodes x 6..66 threads), zipf 0.99, write-intensive.
source "$(dirname "$0")/common.sh"
MD="$OUT/scalability.md"
echo "# Scalability (Sherman §5.4), sim, zipf 0.99, write-intensive, $RECORDS records" > "$MD"
"$LB" run --systems sherman,fg --threads 6,11,22,44,66 --records "$RECORDS" --ops "${SCALE_OPS:-1000}" --plot "$OUT/scalability" --json > "$OUT/scalability.json"
python3 "$(dirname "$0")/table.py" scalability "$MD" "$OUT/scalability.json"
echo "wrote $MD"
