#!/usr/bin/env bash
# Sherman §5.7: HOCL one technique at a time. `loch-bench locks` on the
# simulator at the paper's scale (8 memory nodes, 8 compute nodes x 22
# threads): lock words drawn zipfian, taken and released at once, by CAS on
# host memory, on device memory, plus the local lock table, plus its wait
# queues, plus handover. LOCKS=N and LOCK_ZIPF=THETA change the point.
source "$(dirname "$0")/common.sh"
MD="$OUT/locks.md"
echo "# HOCL (Sherman §5.7), sim, ${LOCKS:-1000} lock words, zipf ${LOCK_ZIPF:-0.99}" > "$MD"
"$LB" locks --locks "${LOCKS:-1000}" --zipf "${LOCK_ZIPF:-0.99}" --json > "$OUT/locks.json"
python3 "$(dirname "$0")/table.py" locks "$MD" "$OUT/locks.json"
echo "wrote $MD"
