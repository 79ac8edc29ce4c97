#!/usr/bin/env bash
# Sherman §5.6.1: key size. Uniform write-intensive (50% lookup, 50%
# update) at the paper's scale (8 memory nodes, 8 compute nodes x 22
# threads) with keys of 8 (our default, for reference), 16, 64, 256 and
# 1024 bytes, then 1 KiB keys at zipf 0.99. The paper: Sherman's lead over
# FG+ grows from 1.17x at 16 B to 1.47x at 1 KiB; 1.4x at 1 KiB skewed.
# 1000 warm-up operations per client first (WARMUP=...), so that the index
# cache is as warm as it gets before measuring: larger keys make more and
# larger internal nodes to fetch.
source "$(dirname "$0")/common.sh"
SYS=sherman,fg,sherman-2rt
OPS_KEY="${OPS_KEY:-300}"
WARMUP="${WARMUP:-1000}"
MD="$OUT/key_size.md"
echo "# Key size (Sherman §5.6.1), sim, $RECORDS records, write-intensive, $WARMUP warm-up ops per client" > "$MD"
files=()
for k in 8 16 64 256 1024; do
  "$LB" run --systems "$SYS" --workload write-intensive --zipf 0 --key-size "$k" --records "$RECORDS" --ops "$OPS_KEY" --warmup "$WARMUP" --json > "$OUT/key-size-$k.json"
  files+=("$OUT/key-size-$k.json")
done
"$LB" run --systems "$SYS" --workload write-intensive --key-size 1024 --records "$RECORDS" --ops "$OPS_KEY" --warmup "$WARMUP" --json > "$OUT/key-size-1024-z0.99.json"
files+=("$OUT/key-size-1024-z0.99.json")
python3 "$(dirname "$0")/table.py" key-size "$MD" "${files[@]}"
echo "wrote $MD"
