#!/usr/bin/env bash
# The hash table's gets in one round trip (location cache), YCSB-C at zipf
# 0.99 on the paper setup, after warm-ups of growing length. WARMUPS lists
# the warm-up gets per client (default "5000 50000 200000"; the last takes
# about 2.5 minutes).
source "$(dirname "$0")/common.sh"
MD="$OUT/nessie_gets.md"
WARMUPS="${WARMUPS:-5000 50000 200000}"
echo "# Hash-table gets in one round trip, sim, YCSB-C zipf 0.99, $RECORDS records" > "$MD"
files=()
for w in $WARMUPS; do
  f="$OUT/nessie-gets-$w.json"
  "$LB" run --systems cuckoo --workload ycsb-c --zipf 0.99 --records "$RECORDS" \
    --warmup "$w" --seconds 0.002 --json > "$f"
  files+=("$f")
done
python3 "$(dirname "$0")/table.py" gets "$MD" "${files[@]}"
echo "wrote $MD"
