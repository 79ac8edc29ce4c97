#!/usr/bin/env bash
# The hash-table issue's growth figure: YCSB-A (zipf 0.99) on 8 compute
# nodes x 22 clients while one more client inserts into a table preloaded
# to 97% until it doubles online. Throughput before the growth and during
# it (target: at least half), and the longest YCSB-A operation during it
# (target: none stalled longer than 1 ms of virtual time). About 4 minutes.
source "$(dirname "$0")/common.sh"
CAP="${CAPACITY:-131072}"
MD="$OUT/nessie_grow.md"
"$LB" hash-grow --capacity "$CAP" --compute-nodes 8 --threads 22 --json > "$OUT/nessie_grow.json"
python3 - "$OUT/nessie_grow.json" > "$MD" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"# Nessie: YCSB-A while the table doubles (sim, {r['compute_nodes']} compute nodes x {r['threads']} clients, {r['memory_nodes']} memory nodes)")
print()
print("| figure | ours | target |")
print("|---|---|---|")
print(f"| table | {r['slots_before']} -> {r['slots_after']} slots, preloaded to {r['fill']*100:.0f}%, {r['inserts']} inserts by one more client | |")
print(f"| growth took (virtual) | {r['growth_virtual_ns']/1e6:.1f} ms | |")
print(f"| YCSB-A before | {r['ycsb_a_ops_per_sec_before']/1e6:.2f} Mops/s | |")
print(f"| YCSB-A during the growth | {r['ycsb_a_ops_per_sec_during']/1e6:.2f} Mops/s | |")
print(f"| during / before | {r['during_over_before']:.2f} | >= 0.5 |")
print(f"| YCSB-A operations during it: p99 / longest | {r['latency_p99_ns_during']/1e3:.1f} / {r['latency_max_ns_during']/1e3:.1f} us | longest <= 1 ms |")
print()
print("Gets and updates never wait for a growth: they read the key's buckets at both")
print("levels (one doorbell) while it runs. Inserts of new keys wait for it to end.")
print()
print("Reproduce: bench/paper/nessie_grow.sh (CAPACITY=N to resize).")
PY
echo "wrote $MD"
