#!/usr/bin/env bash
# Sherman §5.6.2: index cache size against hit ratio. The paper: 400 MB of
# cache reaches ~98% hits for 1 billion entries; with RECORDS entries the
# same ratio is 400 MB x RECORDS / 1e9 (0.4 MB at 1 million).
source "$(dirname "$0")/common.sh"
MD="$OUT/cache.md"
echo "# Index cache size vs hit ratio (Sherman §5.6.2), sim, write-intensive, uniform (as the paper), $RECORDS records" > "$MD"
files=()
for mb in 0.05 0.1 0.2 0.4 0.8 1.6 6.4; do
  "$LB" run --systems sherman --workload write-intensive --zipf 0 --records "$RECORDS" --ops "$OPS" --warmup "${WARMUP:-1000}" --cache-mb "$mb" --json > "$OUT/cache-$mb.json"
  files+=("$OUT/cache-$mb.json")
done
python3 "$(dirname "$0")/table.py" cache "$MD" "${files[@]}"
echo "paper: 400 MB for 1 billion entries gives about 98% hits" >> "$MD"
echo "wrote $MD"
