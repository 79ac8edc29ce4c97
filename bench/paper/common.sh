# Shared by the paper scripts: build once, run loch-bench, keep results.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${OUT:-$ROOT/bench/paper/results}"
mkdir -p "$OUT"
# FEATURES=bench/mlx5 builds the real-NIC backend in.
cargo build --release -p bench ${FEATURES:+--features "$FEATURES"} --manifest-path "$ROOT/Cargo.toml" >/dev/null
LB="$ROOT/target/release/loch-bench"
# Scale knobs (the paper: 1 billion records; we default to 1 million).
RECORDS="${RECORDS:-1000000}"
OPS="${OPS:-3000}"
