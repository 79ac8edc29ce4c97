#!/usr/bin/env python3
"""Turns loch-bench JSON into the paper-comparison markdown tables.

usage: table.py KIND OUT.md RESULT.json [RESULT.json ...]
KIND: breakdown | round-trips | scalability | cache | range | gets | key-size | locks | read-path
"""
import json
import sys


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        rows.extend(doc if isinstance(doc, list) else [doc])
    return rows


def by_system(rows):
    return {r["system"]: r for r in rows}


def breakdown(rows, out):
    out.append("| workload | system | Mops/s | p50 µs | p99 µs | × FG+ throughput | FG+ p99 / p99 | paper |")
    out.append("|---|---|---|---|---|---|---|---|")
    paper = {
        ("write-intensive", 0.99, "fg+comb"): "3.37× from combination",
        ("write-intensive", 0.99, "fg+comb+onchip"): "on-chip locks: 3.06× throughput, 3.48× p99",
        ("write-intensive", 0.99, "fg+comb+onchip+hier"): "hierarchical lock: 2.22×",
        ("write-intensive", 0.99, "sherman"): "23.6× FG+ throughput, 30.2× lower p99",
        ("write-intensive", 0.0, "sherman"): "1.15× FG+ (uniform)",
        ("write-intensive", 0.99, "sherman-2rt"): "beyond the paper: writes in 2 round trips",
        ("write-intensive", 0.0, "sherman-2rt"): "beyond the paper: writes in 2 round trips",
    }
    groups = {}
    for r in rows:
        groups.setdefault((r["workload"], r["zipf"]), []).append(r)
    for (w, z), rs in groups.items():
        s = by_system(rs)
        fg = s.get("fg")
        for r in rs:
            t = r["ops_per_sec"] / fg["ops_per_sec"] if fg else float("nan")
            p = fg["latency_ns"]["p99"] / r["latency_ns"]["p99"] if fg else float("nan")
            out.append(
                f"| {w} zipf {z} | {r['system']} | {r['ops_per_sec']/1e6:.2f} | "
                f"{r['latency_ns']['p50']/1e3:.1f} | {r['latency_ns']['p99']/1e3:.1f} | {t:.2f}× | {p:.2f}× | "
                f"{paper.get((w, z, r['system']), '')} |"
            )


def pct(v, digits):
    """A ratio as a percentage; n/a where the figure does not apply (null)."""
    return "n/a" if v is None else f"{100 * v:.{digits}f}%"


def num(v, digits):
    return "n/a" if v is None else f"{v:.{digits}f}"


def round_trips(rows, out):
    out.append("| system | writes ≤ 2 round trips | writes ≤ 3 round trips | write p99 round trips | bytes written per non-split write | lookups without retry | paper |")
    out.append("|---|---|---|---|---|---|---|")
    paper = {
        "sherman": "93.6% need 3; p99 11; 17 B (+ unlock); 99.98% no retry",
        "sherman-2rt": "beyond the paper (issue target: ≥ 90% within 2; p99 ≤ 6)",
        "fg": "94% need 4; p99 453; whole node",
    }
    # The paper's §5.5 figures and the target are for the
    # write-intensive mix; other mixes get none beside them.
    if rows and rows[0].get("workload") != "write-intensive":
        paper = {
            "sherman-2rt": "beyond the paper (the target above is for write-intensive; inserts also split)",
        }
    for r in rows:
        out.append(
            f"| {r['system']} | {pct(r.get('writes_within_2_round_trips'), 2)} | {pct(r['writes_within_3_round_trips'], 2)} | {num(r['write_round_trips_p99'], 0)} | "
            f"{num(r['bytes_written_per_nonsplit_write'], 1)} | {pct(r['clean_lookup_ratio'], 3)} | {paper.get(r['system'], '')} |"
        )
    for r in rows:
        rt = r["round_trips"]
        for kind, v in rt.items():
            out.append(f"\n{r['system']} {kind}: round-trip histogram (index = round trips) {v['hist']}")


def locks(rows, out):
    out.append("| variant | Macq/s | p50 µs | p99 µs | remote CAS / acquisition | handed over | × the step before: throughput, p50, p99 | paper (§5.7, the same step) |")
    out.append("|---|---|---|---|---|---|---|---|")
    # Each variant adds one technique to the one before it here; a ratio is
    # against that variant's row, blank when it was not run.
    order = ["host", "dm", "dm+local", "dm+local+queue", "dm+local+queue+handover"]
    paper = {
        "dm": "2.89× throughput, 3.01× p50, 2.88× p99",
        "dm+local": "3.85× throughput, 5.39× p50, 3.65× p99",
        "dm+local+queue": "p99 414 → 372 µs (1.11×)",
        "dm+local+queue+handover": "2.34× throughput, 3.19× p99",
    }
    by_variant = {r["variant"]: r for r in rows}

    def ratio(a, b):
        return "n/a" if not a or not b else f"{a / b:.2f}×"

    for r in rows:
        lat = r["latency_ns"]
        step = ""
        i = order.index(r["variant"]) if r["variant"] in order else 0
        before = by_variant.get(order[i - 1]) if i > 0 else None
        if before is not None:
            b = before["latency_ns"]
            step = (
                f"{ratio(r['acquisitions_per_sec'], before['acquisitions_per_sec'])}, "
                f"{ratio(b['p50'], lat['p50'])}, {ratio(b['p99'], lat['p99'])}"
            )
        out.append(
            f"| {r['variant']} | {r['acquisitions_per_sec'] / 1e6:.3f} | {lat['p50'] / 1e3:.2f} | {lat['p99'] / 1e3:.1f} | "
            f"{num(r['remote_cas_per_acquisition'], 3)} | {pct(r['handed_over'], 1)} | {step} | {paper.get(r['variant'], '')} |"
        )


def read_path(rows, out):
    """Rounds of the emu read path: each `loch-bench run` file gives a
    sherman and an fg row with the same run's BTreeMap reference, each
    `loch-bench verbs` file a read row; the median and range of each ratio
    over the rounds, beside issue 17's targets."""
    sh = [r for r in rows if r.get("system") == "sherman"]
    fg = [r for r in rows if r.get("system") == "fg"]
    verbs = [r for r in rows if r.get("verb") == "read"]
    rounds = list(zip(sh, fg))
    if not rounds or len(sh) != len(fg):
        raise SystemExit("read-path: every run needs a sherman and an fg row")

    def median(v):
        v = sorted(v)
        n = len(v)
        return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2

    def line(name, target, v, fmt, met):
        m = median(v)
        out.append(
            f"| {name} | {target} | **{fmt(m)}** ({'met' if met(m) else 'not met'}) | "
            f"{fmt(min(v))}–{fmt(max(v))} |"
        )

    out.append(f"{len(rounds)} rounds of `loch-bench run --threads 1 --workload ycsb-c --zipf 0`"
               f" and {len(verbs)} of `loch-bench verbs --depth 16 -D 1` (backend {sh[0]['backend']})."
               " Per round: Sherman and FG+ lookups per second, and the BTreeMap reference of the same run.")
    out.append("")
    out.append("| round | Sherman Mops/s | FG+ Mops/s | BTreeMap Mops/s | Sherman / FG+ | Sherman / BTreeMap | CPU ns a READ |")
    out.append("|---|---|---|---|---|---|---|")
    for i, (s, f) in enumerate(rounds):
        bt = s["btreemap_lookups_per_sec"]
        cpu = f"{verbs[i]['ns_per_op']:.1f}" if i < len(verbs) else ""
        out.append(
            f"| {i + 1} | {s['ops_per_sec'] / 1e6:.3f} | {f['ops_per_sec'] / 1e6:.3f} | {bt / 1e6:.3f} | "
            f"{s['ops_per_sec'] / f['ops_per_sec']:.3f} | {s['ops_per_sec'] / bt:.3f} | {cpu} |"
        )
    out.append("")
    out.append("| figure (issue 17) | target | median | range |")
    out.append("|---|---|---|---|")
    three = lambda x: f"{x:.3f}"
    line("Sherman / FG+ lookups per second (item 6)", "≥ 1",
         [s["ops_per_sec"] / f["ops_per_sec"] for s, f in rounds], three, lambda m: m >= 1)
    line("Sherman / BTreeMap lookups per second (item 6)", "≥ 0.5",
         [s["ops_per_sec"] / s["btreemap_lookups_per_sec"] for s, _ in rounds], three, lambda m: m >= 0.5)
    if verbs:
        line("CPU ns a verb: one core, 8-byte READ, depth 16, one verb a doorbell (item 7)", "≤ 100",
             [v["ns_per_op"] for v in verbs], lambda x: f"{x:.1f}", lambda m: m <= 100)


def scalability(rows, out):
    out.append("| system | client threads | Mops/s | p99 µs | paper |")
    out.append("|---|---|---|---|---|")
    paper = {
        ("sherman", 528): "9 Mops at 528 threads, zipf 0.99 (§5.4)",
        ("fg", 528): "collapses as threads grow (§5.4)",
    }
    for r in sorted(rows, key=lambda r: (r["system"], r["config"]["compute_nodes"] * r["config"]["threads_per_compute_node"])):
        c = r["config"]
        n = c["compute_nodes"] * c["threads_per_compute_node"] * c["coroutines_per_thread"]
        out.append(
            f"| {r['system']} | {n} | "
            f"{r['ops_per_sec']/1e6:.2f} | {r['latency_ns']['p99']/1e3:.1f} | {paper.get((r['system'], n), '')} |"
        )


def cache(rows, out):
    out.append("| cache (MB, scaled) | equivalent at 1 billion records | hit ratio | Mops/s |")
    out.append("|---|---|---|---|")
    for r in sorted(rows, key=lambda r: r["config"]["cache_bytes"]):
        mb = r["config"]["cache_bytes"] / (1 << 20)
        scale = 1e9 / r["config"]["records"]
        out.append(f"| {mb:.3f} | {mb*scale/1024:.1f} GB | {pct(r['cache_hit_ratio'], 2)} | {r['ops_per_sec']/1e6:.2f} |")


def gets(rows, out):
    out.append("| warm-up gets per client | location cache (MiB) | gets in 1 round trip | location-cache hits | Mops/s |")
    out.append("|---|---|---|---|---|")
    for r in rows:
        c = r["config"]
        out.append(
            f"| {c['warmup_per_client']} | {c['cache_bytes'] / (1 << 20):.0f} "
            f"| {pct(r['reads_within_1_round_trip'], 1)} | {pct(r['cache_hit_ratio'], 1)} "
            f"| {r['ops_per_sec'] / 1e6:.1f} |"
        )


def range_(rows, out):
    out.append("| workload | system | Mops/s | scans Mops/s | inserts Mops/s | p50 µs | p99 µs | × FG+ | paper (Sherman / FG+) |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    paper = {
        ("range-100", None): "0.98 (FG+ 2% ahead)",
        ("range-1000", None): "about 1 (both bandwidth-bound)",
        ("range-100", "insert-only"): "up to 1.82",
    }
    groups = {}
    for r in rows:
        groups.setdefault((r["workload"], r.get("half_workload")), []).append(r)
    for (w, half), rs in groups.items():
        s = by_system(rs)
        fg = s.get("fg")
        name = w if half is None else f"{w} + {half} (half the threads each)"
        for sysname, r in s.items():
            secs = r["elapsed_ns"] / 1e9
            kinds = r["round_trips"]
            rate = lambda k: kinds.get(k, {}).get("count", 0) / secs / 1e6 if secs else 0.0
            x = r["ops_per_sec"] / fg["ops_per_sec"] if fg else float("nan")
            lat = r["latency_ns"]
            out.append(
                f"| {name} | {sysname} | {r['ops_per_sec']/1e6:.2f} | {rate('scan'):.2f} | {rate('insert'):.2f} "
                f"| {lat['p50']/1e3:.1f} | {lat['p99']/1e3:.1f} | {x:.2f} | {paper.get((w, half), '') if sysname == 'sherman' else ''} |"
            )


def key_size(rows, out):
    out.append("| key bytes | zipf | node bytes | system | Mops/s | p50 µs | p99 µs | B written / write (no split) | B read / op | cache hits | × FG+ | paper (Sherman / FG+) |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    paper = {(16, 0.0): "1.17", (1024, 0.0): "1.47", (1024, 0.99): "1.4"}
    groups = {}
    for r in rows:
        t = r["config"]["tree"]
        groups.setdefault((t["key_bytes"], r["zipf"]), []).append(r)
    for (k, z), rs in groups.items():
        s = by_system(rs)
        fg = s.get("fg")
        for sysname, r in s.items():
            x = r["ops_per_sec"] / fg["ops_per_sec"] if fg else float("nan")
            lat = r["latency_ns"]
            out.append(
                f"| {k} | {z} | {r['config']['tree']['node_bytes']} | {sysname} | {r['ops_per_sec']/1e6:.2f} "
                f"| {lat['p50']/1e3:.1f} | {lat['p99']/1e3:.1f} | {num(r.get('bytes_written_per_nonsplit_write'), 0)} "
                f"| {r['bytes_read_per_op']:.0f} | {pct(r.get('cache_hit_ratio'), 1)} | {x:.2f} "
                f"| {paper.get((k, z), '') if sysname == 'sherman' else ''} |"
            )


# Why our figures differ from the paper's, under each table (the model's
# parameters and their calibration: bench/paper/README.md).
WHY = {
    "breakdown": """
Why ours differ: FG+'s collapse under skew comes from the simulator's atomic
window (a CAS storm on a host-memory lock fills the memory NIC's atomic
window and stalls everything sent to it), calibrated to FG's published
0.34 Mops while the benchmark's clients still replayed correlated random
streams; with independent clients the same window gives 0.40 Mops (left
as calibrated: see bench/paper/README.md). Combination shortens each hold by a round trip but leaves the
storm, so it gains less than the paper's 3.37×; on-chip locks remove it
(device-memory atomics are 4× faster, so the window stays clear) and the
hierarchical lock leaves one spinner per compute node, so those two steps
gain more than the paper's. Our key space is 1 million records, not 1
billion; keys are drawn as YCSB does (ranks over 10^10 items), so the
hottest record has the same 3.8% share at any scale. Uniform: Sherman's
lead is a little larger than the paper's 1.15×; which model parameter
accounts for that has not been isolated. sherman-2rt (not in the paper)
takes a round trip off every write, and a hot lock is held a round trip
less each time, so under skew its gain is larger than the latency's.""",
    "round-trips": """
Why ours differ: round-trip histograms stop at 64, so FG+'s p99 (paper 453)
shows as 64, meaning "64 or more". Sherman hands over up to 8 times in a row
(its code's kMaxHandOverTime; the paper's text says 4); about 3.9% of our
writes are handed over (the paper: 3.6%). Bytes per non-split write: 17 bytes
of entry plus the 8-byte unlock when the lock is released rather than
handed over, so the mean lies between 17 and 25. sherman-2rt is not in the
paper: the lock CAS and the leaf READ share a doorbell (2 round trips a
write) and a handed-over lock comes with the node (1 round trip); its
writes beyond 2 are lock retries against other compute nodes, splits and
stale routes. Insert-only (not in the paper's §5.5), new keys fill
leaves until they split: 28,548 splits in 528,000 inserts (5.4%), and a
split insert takes several round trips more (the new node's allocation
and write, the parent's lock and update). The bumps at 6 and 7 round
trips in sherman-2rt's insert histogram hold 4.1% of its inserts, so
88.7% of them finish within 2 round trips, where 96% of updates do; the
issue's target (≥ 90%, p99 ≤ 6) is for the write-intensive mix.""",
    "locks": """
Why ours differ: every step moves throughput and p99 the way the paper's
does, and by more; p50 moves less. The paper's text does not give this
experiment's lock count, skew or critical section; the script's defaults
(the figures here) are 1000 lock words at zipf 0.99, released at once,
so the median acquisition meets no contention (its p50 moves only with
on-chip locks, whose CAS skips the memory node's PCIe) while the hottest
words are very hot: without wait queues a released lock goes to
whichever local thread tries first, not the longest waiting (p99 1003
µs, against 398 µs served in order), and handover serves a hot lock's
local queue without a remote round trip per holder (26% of acquisitions
here). These are predictions of the simulator as it stands; no parameter
was changed to approach the paper.""",
    "scalability": """
Why ours differ: 8 compute nodes × 6…66 threads gives 48…528 client threads
(the paper starts at 44). FG+ collapses under skew from the simulated CAS
storm (see breakdown.md); the paper's FG+ collapses the same way.""",
    "cache": """
Why ours differ: the tree holds 1 million records, not 1 billion, so cache
sizes are scaled by 1000 (0.4 MB here stands for 400 MB there). At 0.4 MB
we get about 78% hits, not the paper's 98%: our internal nodes for 1
million bulk-loaded records take between 0.4 and 0.8 MB, so 0.4 MB cannot
hold the whole level above the leaves (bench/paper/README.md).""",
    "gets": """
Not in a paper: the Nessie slides have no such figure; the target is
ours (issue: at least 90% after warm-up). A compute node answers a key in
one round trip once it has read the key and remembered its slot, so the
share grows with the warm-up (at zipf 0.99 over a million keys, the keys
that make up 90% of the reads number about 250,000, and each compute node
must have read each of them once). Entries lie on their slot's memory
node, so the slot READ and the entry READ run in order on one queue pair
and a remembered slot serves however long ago it was seen
(index/src/cuckoo/mod.rs, "Cached gets").""",
    "key-size": """
Why ours differ: up to 64-byte keys Sherman leads FG+ by 1.29-1.31x, about
its uniform lead at 8-byte keys in breakdown.md (1.26x; the paper: 1.15x
there, 1.17x at 16 B): a write is a round trip shorter and writes back an
entry instead of a node. From there the lead falls instead of growing. A
wider key makes wider entries, so nodes grow until they hold 8 (2 KiB at
64-byte keys, 4 KiB at 256, 16 KiB at 1 KiB) and every lookup, and every
write's read under the lock, moves a whole leaf out of a memory node. The
simulator gives each NIC its bandwidth in each direction (12 GB/s) and
charges PCIe as latency only: those reads fill the memory NICs' outbound
direction, while write-backs go the other way. FG+'s whole-node write-backs (16 KiB per write at 1 KiB
keys, against Sherman's 1 KiB entry) spend inbound bandwidth that bounds
nobody, so from 256-byte keys on both systems run at the rate of the leaf
READs, where the paper's lead grows to 1.47x. Larger keys also make more,
larger internal nodes: the 64 MiB index cache holds a shrinking share of
them, and misses add internal-node READs. The paper gives neither its node
size at each key size nor its cache size for this figure; a lead that
grows with the key means its writes cost more than our model charges.
Skewed (zipf 0.99), FG+ collapses under its CAS storm as in breakdown.md,
so Sherman's lead is far larger than the paper's 1.4x. sherman-2rt (not
in the paper) saves a round trip per write, which counts only while
bandwidth does not bound.""",
    "range": """
Why ours differ: range-only, the three systems are the same run: leaves
are bulk-loaded sorted and full for all of them, a scan reads the same
leaves through the same code (the cached node above the leaves names
them, read in one round trip, 8 at most), and the simulator does not
charge the CPU for sorting an unsorted leaf's entries, the cost the paper
gives for FG+'s 2% lead at size 100. At 1000 both are bound by the memory
NICs' bandwidth, as in the paper. Range-write: half the threads scan,
half insert new keys; Sherman's inserts write back an entry rather than
the whole node and hand the lock over, so its insert half runs faster
while the scan half is the same: a smaller lead than the paper's 1.82x,
whose range-write mix may differ in its insert keys and range size (the
paper's text gives neither). sherman-2rt (not in the paper) takes a
round trip off every insert.""",
}


KINDS = {"breakdown": breakdown, "round-trips": round_trips, "scalability": scalability, "cache": cache, "range": range_, "gets": gets, "key-size": key_size, "locks": locks, "read-path": read_path}


def main():
    # Bad input: one line on stderr and exit 2, as the project's commands do.
    if len(sys.argv) < 4 or sys.argv[1] not in KINDS:
        known = " | ".join(KINDS)
        print(f"table.py: usage: table.py KIND OUT.md RESULT.json [RESULT.json ...], KIND one of {known}", file=sys.stderr)
        sys.exit(2)
    kind, dest, *paths = sys.argv[1:]
    rows = load(paths)
    out = []
    KINDS[kind](rows, out)
    try:
        with open(dest) as f:
            said = "Why ours differ" in f.read()
    except FileNotFoundError:
        said = False
    if not said and kind in WHY:
        out.append(WHY[kind])
    with open(dest, "a") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
