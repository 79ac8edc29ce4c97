#!/usr/bin/env bash
# FaRM §6.5 on emu, in wall time: four `loch node` machine processes run
# the replicated bank with FaRM's failure handling, the configuration in a
# local etcd; one is killed with SIGKILL under load. Prints, from the kill:
# the first suspicion, NEW-CONFIG-COMMIT, every survivor's regions active,
# the last new backup copied and the end of the last 10 ms bucket under
# 80% of the survivors' throughput before the kill; then the survivors'
# commits per 10 ms around it.
#
#   bench/paper/farm_kill.sh [VICTIM] [LEASE_MS]    (defaults 3, 300)
#
# Needs target/release/loch (cargo build --release) and etcd (Debian's
# etcd-server, or LOCH_ETCD=/path/to/etcd). On a small host the four
# processes oversubscribe the CPUs: shorter leases there see false
# suspicions (a machine suspected falsely is removed like a failed one,
# and after a second removal of four the bank runs on with two replicas
# of each region).
set -euo pipefail
VICTIM=${1:-3}
LEASE_MS=${2:-300}
# The cluster is machines 0..3 (another index once killed etcd, or
# nothing and failed on an unset variable).
case "$VICTIM" in
  0|1|2|3) ;;
  *) echo "VICTIM must be a machine of the cluster, 0 to 3, got '$VICTIM'" >&2; exit 2 ;;
esac
# loch node's own bounds for --lease-ms, checked before anything starts
# (refused by the nodes, it left this script waiting a minute for them).
python3 -c 'import sys; v = float(sys.argv[1]); sys.exit(0 if 0 < v <= 10000 else 1)' "$LEASE_MS" 2>/dev/null || {
  echo "LEASE_MS must be milliseconds in (0, 10000], got '$LEASE_MS'" >&2; exit 2; }
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
LOCH="$ROOT/target/release/loch"
ETCD=${LOCH_ETCD:-$(command -v etcd || true)}
[ -x "$LOCH" ] || { echo "build first: cargo build --release" >&2; exit 2; }
[ -n "$ETCD" ] || { echo "no etcd (apt install etcd-server, or set LOCH_ETCD)" >&2; exit 2; }
DIR=$(mktemp -d)
PIDS=()
PORTS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$DIR"
  # The memory files of the machines killed here (the victim, and any
  # left when the script is stopped): named for the coordinator's port.
  [ "${#PORTS[@]}" -gt 0 ] && rm -f "/dev/shm/loch-u$(id -u)-p${PORTS[0]}-node"*
  true
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
C=$(port); P=$(port)
"$ETCD" --data-dir "$DIR/etcd" --listen-client-urls "http://127.0.0.1:$C" \
  --advertise-client-urls "http://127.0.0.1:$C" --listen-peer-urls "http://127.0.0.1:$P" \
  --initial-advertise-peer-urls "http://127.0.0.1:$P" --initial-cluster "default=http://127.0.0.1:$P" \
  > "$DIR/etcd.log" 2>&1 &
PIDS+=($!)
PORTS=("$(port)" "$(port)" "$(port)" "$(port)")
echo "0123456789abcdef0123456789abcdef-farm" > "$DIR/secret"
chmod 600 "$DIR/secret"
{
  printf 'secret_file = "secret"\nlock_table_words = 4096\nhuge_pages = false\n[backend]\nkind = "emu"\n'
  for id in 0 1 2 3; do
    printf '[[nodes]]\nid = %d\naddress = "127.0.0.1:%d"\nroles = ["memory", "compute"]\nmemory = "16MiB"\ncores = [%d]\n' \
      "$id" "${PORTS[$id]}" $((id % 2))
  done
} > "$DIR/cluster.toml"
for _ in $(seq 100); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$C/health', timeout=1)" 2>/dev/null && break
  sleep 0.1
done
for id in 0 1 2 3; do
  "$LOCH" node --config "$DIR/cluster.toml" --id "$id" --workload txn --etcd "http://127.0.0.1:$C" \
    --lease-ms "$LEASE_MS" --seconds 6 > "$DIR/out$id" 2> "$DIR/err$id" &
  PIDS+=($!)
done
for _ in $(seq 600); do
  n=$( (grep -l "machine role: a bank" "$DIR"/err* 2>/dev/null || true) | wc -l)
  [ "$n" -eq 4 ] && break
  sleep 0.1
done
sleep 2
KILL_MS=$(python3 -c 'import time; print(time.time()*1e3)')
kill -9 "${PIDS[$((VICTIM + 1))]}"
for id in 0 1 2 3; do
  [ "$id" -eq "$VICTIM" ] && continue
  wait "${PIDS[$((id + 1))]}" || { echo "machine $id failed:" >&2; cat "$DIR/err$id" >&2; exit 1; }
done
python3 - "$DIR" "$VICTIM" "$KILL_MS" "$LEASE_MS" <<'EOF'
import json, sys
d, victim, kill, lease = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
runs = {}
for m in range(4):
    if m == victim:
        continue
    runs[m] = json.loads(open(f"{d}/out{m}").read().strip().splitlines()[-1])
def unix(r, at):
    return r["timeline"]["unix_ms"] + at
sus = [unix(r, s["at_ms"]) - kill for r in runs.values() for s in r["suspicions"]]
com = [unix(r, e["at_ms"]) - kill for r in runs.values() for e in r["events"] if e["event"] == "committed"]
act = [unix(r, r["active_ms"]) - kill for r in runs.values() if r["active_ms"] is not None]
cop = [unix(r, r["copied_ms"]) - kill for r in runs.values() if r["copied_ms"] is not None]
# The survivors' commits per 10 ms bucket, aligned on the kill.
series = {}
for r in runs.values():
    t0 = r["timeline"]["unix_ms"]
    for i, c in enumerate(r["timeline"]["committed"]):
        b = int((t0 + i * 10 - kill) // 10)
        series[b] = series.get(b, 0) + c
# 100 ms windows: an oversubscribed host commits few transactions a 10 ms.
win = lambda w: sum(series.get(b, 0) for b in range(w * 10, w * 10 + 10))
base = sum(win(w) for w in range(-10, 0)) / 10
end = max((w for w in range(0, 60) if win(w) > 0), default=0)
low = [w for w in range(0, end) if win(w) < 0.8 * base]
print(f"emu, 4 machine processes, 3-way, bank, {lease} ms leases, machine {victim} killed; ms from the kill")
print(f"first suspicion {min(sus):.1f}" if sus else "no suspicion")
print(f"NEW-CONFIG-COMMIT {min(com):.1f}" if com else "no commit")
print(f"regions active (last survivor) {max(act):.1f}" if act else "no lock recovery")
print(f"re-replicated (last copy) {max(cop):.1f}" if cop else "no copy")
print(f"80% of throughput (100 ms windows): {(low[-1] + 1) * 100 if low else 0} (before: {base:.1f} commits per 100 ms)")
rec = [(r["recovered"]["committed"], r["recovered"]["aborted"]) for r in runs.values()]
print("recovered transactions (commit+abort) per survivor:", " ".join(f"{c}+{a}" for c, a in rec))
print("configuration:", {m: r["config"] for m, r in runs.items()}, "bad audits:", sum(r["bad_audits"] for r in runs.values()))
cps = [r["copies"] for r in runs.values() if r.get("copies")]
print(f"replicas: {sum(c['primaries'] for c in cps)} accounts' primaries, {sum(c['backups'] for c in cps)} backup copies, {sum(c['differ'] for c in cps)} differ")
print("survivors' commits per 100 ms, from 1 s before the kill:")
for row in range(-10, 30, 10):
    print(f"{row * 100:>6} ms " + "".join(f"{win(w):>6}" for w in range(row, row + 10)))
EOF
