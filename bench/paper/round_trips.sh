#!/usr/bin/env bash
# Sherman §5.5: round trips per write (§5.5.2), bytes written back per
# insert (§5.5.3) and lookups without retry (§5.5.1), zipf 0.99.
source "$(dirname "$0")/common.sh"
MD="$OUT/round_trips.md"
echo "# Round trips, bytes and retries (Sherman §5.5), sim, zipf 0.99, $RECORDS records" > "$MD"
"$LB" run --systems sherman,sherman-2rt,fg --workload write-intensive --records "$RECORDS" --ops "$OPS" --json > "$OUT/rt-write.json"
"$LB" run --systems sherman,sherman-2rt,fg --workload insert-only --records "$RECORDS" --ops "$OPS" --json > "$OUT/rt-insert.json"
echo "## write-intensive (50% lookup, 50% update)" >> "$MD"
python3 "$(dirname "$0")/table.py" round-trips "$MD" "$OUT/rt-write.json"
echo "## insert-only (new keys: splits happen)" >> "$MD"
python3 "$(dirname "$0")/table.py" round-trips "$MD" "$OUT/rt-insert.json"
echo "wrote $MD"
