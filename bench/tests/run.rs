//! `loch-bench run` as scripts use it: every shipped workload runs, workload
//! files and flags combine as promised, `--seconds`, `--history` (with
//! `--check-history`) and `--plot` write what they say, and bad input exits
//! 2 with one line and no files.

mod common;

use common::bench;
use history::map::{check, Event, Op, Ret, Verdict};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

const TINY: [&str; 10] = [
    "run",
    "--memory-nodes",
    "2",
    "--compute-nodes",
    "2",
    "--threads",
    "2",
    "--records",
    "2000",
    "--json",
];

const SHIPPED: [&str; 12] = [
    "ycsb-a",
    "ycsb-b",
    "ycsb-c",
    "ycsb-d",
    "ycsb-e",
    "ycsb-f",
    "read-intensive",
    "write-intensive",
    "write-only",
    "insert-only",
    "range-100",
    "range-1000",
];

/// `TINY` with `extra`; a flag in `extra` replaces TINY's.
fn tiny(extra: &[&str]) -> Vec<String> {
    tiny_without(&[], extra)
}

/// `TINY` without the flags in `drop` (and those `extra` replaces), then `extra`.
fn tiny_without(drop: &[&str], extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    let mut it = TINY.iter();
    while let Some(&a) = it.next() {
        if a == "run" || a == "--json" {
            v.push(a.to_string());
            continue;
        }
        let value = it.next().expect("TINY flags take values");
        if !drop.contains(&a) && !extra.contains(&a) {
            v.extend([a.to_string(), value.to_string()]);
        }
    }
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn run_ok(args: &[String]) -> Vec<Value> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = bench(&a);
    assert!(
        out.status.success(),
        "{args:?}: exit {:?}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_slice(&out.stdout) {
        Ok(Value::Array(v)) => v,
        other => panic!("{args:?}: not a JSON array: {other:?}"),
    }
}

/// A fresh, empty folder for one test.
fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-run-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = walk(dir)
        .into_iter()
        .map(|p| p.strip_prefix(dir).unwrap().display().to_string())
        .collect();
    v.sort();
    v
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

fn count(doc: &Value, kind: &str) -> u64 {
    doc["round_trips"][kind]["count"].as_u64().unwrap_or(0)
}

#[test]
fn every_shipped_workload_runs_on_sim() {
    for name in SHIPPED {
        let docs = run_ok(&tiny(&["--workload", name, "--ops", "50"]));
        assert_eq!(docs.len(), 2, "{name}: sherman and fg");
        for d in &docs {
            let sys = d["system"].as_str().unwrap();
            assert_eq!(d["workload"], name, "{name}/{sys}");
            assert_eq!(d["ops"], 2 * 2 * 50, "{name}/{sys}: 4 clients x 50 ops");
            let range = name.starts_with("range-");
            assert_eq!(d["zipf"], if range { 0.0 } else { 0.99 }, "{name}/{sys}");
            assert!(d["ops_per_sec"].as_f64().unwrap() > 0.0, "{name}/{sys}");
            let kinds: u64 = ["read", "update", "insert", "scan", "rmw"]
                .iter()
                .map(|k| count(d, k))
                .sum();
            assert_eq!(kinds, 200, "{name}/{sys}: every op has a kind");
            // Kinds the mix does not have never run.
            let absent: &[&str] = match name {
                "ycsb-c" => &["update", "insert", "scan", "rmw"],
                "ycsb-d" => &["update", "scan", "rmw"],
                "ycsb-e" => &["read", "update", "rmw"],
                "ycsb-f" => &["update", "insert", "scan"],
                "write-only" => &["read", "insert", "scan", "rmw"],
                "insert-only" => &["read", "update", "scan", "rmw"],
                "range-100" | "range-1000" => &["read", "update", "insert", "rmw"],
                _ => &["insert", "scan", "rmw"],
            };
            for k in absent {
                assert_eq!(count(d, k), 0, "{name}/{sys}: {k}");
            }
        }
        let dist = docs[0]["request_distribution"].as_str().unwrap();
        assert_eq!(
            dist,
            match name {
                "ycsb-d" => "latest",
                "range-100" | "range-1000" => "uniform",
                _ => "zipfian",
            },
            "{name}"
        );
    }
}

/// `--half-workload`: the odd-numbered threads run the other mix (every
/// insert comes from their clients, every scan from the others', each scan
/// of exactly its constant length), the history of both halves together
/// checks, the report names both, and a run with one thread in all, or an
/// unknown half workload, is refused.
/// Each of `cases` (TINY with these flags) exits 2, naming the problem
/// on stderr, with nothing on stdout.
fn exits_2_naming(cases: &[(Vec<&str>, &str)]) {
    for (extra, needle) in cases {
        let args = tiny(extra);
        let out = bench(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{extra:?}: {err}");
        assert!(out.stdout.is_empty());
    }
}

/// `--value-size`: the trees store values of that size in larger nodes,
/// the history of a write-heavy run with splits checks out, the JSON
/// says what ran, and bad sizes exit 2.
#[test]
fn value_size_widens_the_tree_values() {
    let dir = scratch("value-size");
    let h = dir.join("wide.jsonl");
    let docs = run_ok(&tiny(&[
        "--workload",
        "write-only",
        "--systems",
        "sherman,fg",
        "--value-size",
        "1024",
        "--ops",
        "40",
        "--history",
        h.to_str().unwrap(),
    ]));
    for d in &docs {
        assert_eq!(d["config"]["tree"]["value_bytes"], 1024, "{d}");
        assert_eq!(d["config"]["tree"]["node_bytes"], 16384, "{d}");
        assert!(count(d, "update") > 0);
    }
    let f = read_history(&h.with_extension("sherman.jsonl"));
    assert_eq!(f.header["value_bytes"], 1024);
    assert_eq!(check(&events_of(&f.ops), &f.initial), Verdict::Ok);
    // FG+ writes whole 16 KiB leaves back; Sherman one entry's 17 lines.
    let written = |d: &Value| d["bytes_written_per_op"].as_f64().unwrap();
    assert!(written(&docs[1]) > 10.0 * written(&docs[0]), "{docs:?}");
    exits_2_naming(&[
        (
            vec!["--value-size", "7"],
            "--value-size: values must be 8 to 1024 bytes",
        ),
        (vec!["--value-size", "2000"], "--value-size"),
    ]);
}

/// `--key-size`: a tree of 256-byte keys (fences in lines of their own,
/// entries spanning five lines of 4 KiB nodes) runs a mix with inserts and
/// scans whose history checks out against the bulk-loaded records; bad
/// widths exit 2.
#[test]
fn key_size_widens_the_tree_keys() {
    let dir = scratch("key-size");
    let h = dir.join("keys.jsonl");
    let docs = run_ok(&tiny(&[
        "--workload",
        "ycsb-e",
        "--systems",
        "sherman",
        "--key-size",
        "256",
        "--ops",
        "30",
        "--history",
        h.to_str().unwrap(),
    ]));
    let d = &docs[0];
    assert_eq!(d["config"]["tree"]["key_bytes"], 256, "{d}");
    assert_eq!(d["config"]["tree"]["node_bytes"], 4096, "{d}");
    assert!(count(d, "scan") > 0 && count(d, "insert") > 0, "{d}");
    let f = read_history(&h);
    assert_eq!(f.header["key_bytes"], 256);
    assert_eq!(check(&events_of(&f.ops), &f.initial), Verdict::Ok);
    exits_2_naming(&[
        (vec!["--key-size", "12"], "--key-size must be 8 or one of"),
        (vec!["--key-size", "2048"], "--key-size must be 8 or one of"),
    ]);
}

/// The hash table beside the tree with 64-byte keys and 100-byte values:
/// both run YCSB-A, and both histories check out.
#[test]
fn key_and_value_sizes_apply_to_the_hash_table_too() {
    let dir = scratch("hash-sizes");
    let h = dir.join("sizes.jsonl");
    let docs = run_ok(&tiny(&[
        "--workload",
        "ycsb-a",
        "--systems",
        "sherman,cuckoo",
        "--key-size",
        "64",
        "--value-size",
        "100",
        "--ops",
        "40",
        "--history",
        h.to_str().unwrap(),
    ]));
    for (d, sys) in docs.iter().zip(["sherman", "cuckoo"]) {
        assert_eq!(d["system"], sys);
        assert_eq!(d["config"]["tree"]["key_bytes"], 64, "{d}");
        assert!(count(d, "update") > 0 && count(d, "read") > 0, "{d}");
        let f = read_history(&h.with_extension(format!("{sys}.jsonl")));
        assert_eq!(f.header["value_bytes"], 100);
        assert_eq!(check(&events_of(&f.ops), &f.initial), Verdict::Ok, "{sys}");
    }
}

#[test]
fn half_the_threads_run_the_half_workload() {
    let dir = scratch("half");
    let h = dir.join("half.jsonl");
    let docs = run_ok(&tiny(&[
        "--workload",
        "range-100",
        "--half-workload",
        "insert-only",
        "--systems",
        "sherman",
        "--ops",
        "20",
        "--history",
        h.to_str().unwrap(),
    ]));
    let d = &docs[0];
    assert_eq!(d["workload"], "range-100");
    assert_eq!(d["half_workload"], "insert-only");
    // 2 compute nodes x 2 threads: two threads scan, two insert.
    assert_eq!(count(d, "scan"), 2 * 20);
    assert_eq!(count(d, "insert"), 2 * 20);
    assert_eq!(count(d, "read") + count(d, "update"), 0);
    let f = read_history(&h);
    assert_eq!(f.header["half_workload"], "insert-only");
    // Client ids are 1 + core (one coroutine): odd cores, even ids.
    let (mut scans, mut puts) = (0, 0);
    for l in &f.ops {
        let odd_core = l["client"].as_u64().unwrap() % 2 == 0;
        match l["op"].as_str().unwrap() {
            "scan" => {
                assert!(!odd_core, "{l}");
                assert_eq!(l["limit"], 100, "{l}");
                scans += 1;
            }
            "put" => {
                assert!(odd_core, "{l}");
                puts += 1;
            }
            other => panic!("{other} in a range-write run: {l}"),
        }
    }
    assert!(scans > 0 && puts > 0);
    assert_eq!(check(&events_of(&f.ops), &f.initial), Verdict::Ok);
    let args = tiny(&[
        "--workload",
        "range-100",
        "--half-workload",
        "insert-only",
        "--compute-nodes",
        "1",
        "--threads",
        "1",
    ]);
    let one = bench(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(one.status.code(), Some(2));
    let err = String::from_utf8_lossy(&one.stderr);
    assert!(err.contains("--half-workload needs at least two"), "{err}");
    let args = tiny(&["--half-workload", "nope"]);
    let bad = bench(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("--half-workload: unknown workload `nope`"),
        "{err}"
    );
}

/// A workload file's operation count past what a run can count (its sum
/// with the warm-up, times the clients, would wrap) is bad input.
#[test]
fn a_workload_file_with_too_many_operations_is_refused() {
    let dir = scratch("huge");
    let f = dir.join("huge.properties");
    std::fs::write(
        &f,
        "operationcount=18446744073709551615\nreadproportion=1\nupdateproportion=0\n",
    )
    .unwrap();
    let out = bench(&["run", "--workload-file", f.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the workload file's operationcount must be at most"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn a_workload_file_sets_the_run_and_flags_override_it() {
    let dir = scratch("file");
    let f = dir.join("mine.properties");
    std::fs::write(
        &f,
        "# a custom mix\nrecordcount=3000\noperationcount=100\nreadproportion=0.8\n\
         updateproportion=0\nscanproportion=0.2\nmaxscanlength=5\nscanlengthdistribution=zipfian\n\
         requestdistribution=uniform\ninsertorder=hashed\n",
    )
    .unwrap();
    let fs = f.to_str().unwrap();
    let out = bench(
        &tiny_without(
            &["--records"],
            &["--workload-file", fs, "--systems", "sherman"],
        )
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "warning: {fs}:10: unknown key `insertorder` ignored"
        )),
        "{err}"
    );
    let d = &serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()[0];
    assert_eq!(d["config"]["records"], 3000);
    // operationcount is over all 4 clients.
    assert_eq!(d["config"]["ops_per_client"], 25);
    assert_eq!(d["ops"], 100);
    assert_eq!(d["zipf"], 0.0);
    assert_eq!(d["request_distribution"], "uniform");
    assert_eq!(d["config"]["max_scan_length"], 5);
    assert_eq!(count(d, "read") + count(d, "scan"), 100);
    assert!(count(d, "scan") > 0);

    let d = &run_ok(&tiny(&[
        "--workload-file",
        fs,
        "--systems",
        "sherman",
        "--records",
        "2500",
        "--ops",
        "10",
        "--zipf",
        "0.5",
    ]))[0];
    assert_eq!(d["config"]["records"], 2500);
    assert_eq!(d["config"]["ops_per_client"], 10);
    assert_eq!(d["ops"], 40);
    assert_eq!(d["zipf"], 0.5);
    assert_eq!(d["request_distribution"], "zipfian");

    // --zipf 0 makes a zipfian workload uniform.
    let d = &run_ok(&tiny(&[
        "--workload",
        "ycsb-b",
        "--zipf",
        "0",
        "--ops",
        "5",
    ]))[0];
    assert_eq!(d["request_distribution"], "uniform");

    // From a pipe: `--workload-file /dev/stdin` fed by the caller, as a
    // shell's `<(command)` would be.
    let mut child = Command::new(env!("CARGO_BIN_EXE_loch-bench"))
        .args(tiny(&[
            "--workload-file",
            "/dev/stdin",
            "--systems",
            "sherman",
        ]))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"readproportion=0.5\nupdateproportion=0.5\noperationcount=40\n")
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = &serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()[0];
    assert_eq!(d["ops"], 40);
    assert!(count(d, "update") > 0 && count(d, "read") > 0, "{d}");
}

#[test]
fn seconds_measure_until_the_deadline() {
    // 0.5 virtual ms: each op takes a few µs, so each client runs many.
    let docs = run_ok(&tiny(&["--seconds", "0.0005", "--systems", "sherman"]));
    let d = &docs[0];
    assert_eq!(d["config"]["seconds"], 0.0005);
    assert_eq!(d["config"]["ops_per_client"], Value::Null);
    let elapsed = d["elapsed_ns"].as_u64().unwrap();
    // Ops start before the deadline and finish within one op's latency.
    assert!(
        (500_000..600_000).contains(&elapsed),
        "elapsed {elapsed} ns"
    );
    let ops = d["ops"].as_u64().unwrap();
    assert!(ops > 4 * 20, "{ops} ops in 0.5 ms");
    // Longer deadline, more operations.
    let d2 = &run_ok(&tiny(&["--seconds", "0.001", "--systems", "sherman"]))[0];
    assert!(d2["ops"].as_u64().unwrap() > ops * 3 / 2);
}

fn history_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

/// A history file's parts: the header, the initial map, the operations.
struct HistoryFile {
    header: Value,
    initial: BTreeMap<u64, u64>,
    ops: Vec<Value>,
}

fn read_history(path: &Path) -> HistoryFile {
    let mut lines = history_lines(path).into_iter();
    let header = lines.next().expect("a header line");
    assert_eq!(header["type"], "header");
    assert_eq!(header["format"], "loch-history");
    assert_eq!(header["version"], 2);
    // Every run these tests read ran to its end.
    assert!(header["failure"].is_null(), "{header}");
    let (mut initial, mut ops) = (BTreeMap::new(), Vec::new());
    for l in lines {
        match l["type"].as_str().unwrap() {
            "initial" => {
                assert!(ops.is_empty(), "initial lines come before operations");
                let k = l["key"].as_u64().unwrap();
                assert!(initial.insert(k, l["value"].as_u64().unwrap()).is_none());
            }
            "op" => ops.push(l),
            other => panic!("unexpected line type {other}"),
        }
    }
    HistoryFile {
        header,
        initial,
        ops,
    }
}

/// The file's operations as the checker's events, read back as an outside
/// checker would: pending operations have no completion.
fn events_of(ops: &[Value]) -> Vec<Event> {
    let u = |v: &Value| v.as_u64().unwrap();
    ops.iter()
        .map(|l| {
            let op = match l["op"].as_str().unwrap() {
                "get" => Op::Get(u(&l["key"])),
                "put" => Op::Put(u(&l["key"]), u(&l["value"])),
                "delete" => Op::Delete(u(&l["key"])),
                "scan" => Op::Scan {
                    low: u(&l["low"]),
                    high: u(&l["high"]),
                    limit: u(&l["limit"]) as usize,
                },
                other => panic!("unexpected op {other}"),
            };
            let client = u(&l["client"]) as u32;
            let inv = u(&l["invoke_ns"]);
            let Some(cmp) = l["complete_ns"].as_u64() else {
                assert_eq!(l["ret"], "unknown", "{l}");
                return Event::pending(client, op, inv);
            };
            let ret = match (&op, &l["ret"]) {
                (Op::Get(_), r) => Ret::Get(r.as_u64()),
                (Op::Put(..), r) => {
                    assert_eq!(r, "ok");
                    Ret::Put
                }
                (Op::Delete(_), r) => Ret::Delete(r.as_bool()),
                (Op::Scan { .. }, r) => Ret::Scan(
                    r.as_array()
                        .unwrap()
                        .iter()
                        .map(|p| (u(&p[0]), u(&p[1])))
                        .collect(),
                ),
            };
            Event::completed(client, op, ret, inv, cmp)
        })
        .collect()
}

#[test]
fn history_files_hold_the_initial_state_and_every_op_and_check_ok_from_outside() {
    let dir = scratch("history");
    for (workload, backend) in [
        ("write-intensive", "sim"),
        ("ycsb-f", "sim"),
        ("ycsb-e", "sim"),
        ("ycsb-d", "sim"),
        ("write-intensive", "emu"),
    ] {
        let h = dir.join(format!("{workload}-{backend}.jsonl"));
        let hs = h.to_str().unwrap();
        let drop: &[&str] = if backend == "emu" {
            &["--compute-nodes"]
        } else {
            &[]
        };
        let args = tiny_without(
            drop,
            &[
                "--workload",
                workload,
                "--systems",
                "sherman",
                "--backend",
                backend,
                "--ops",
                "60",
                "--warmup",
                "20",
                "--history",
                hs,
                "--check-history",
            ],
        );
        let d = &run_ok(&args)[0];
        let f = read_history(&h);
        assert_eq!(f.header["system"], "sherman");
        assert_eq!(f.header["backend"], backend);
        assert_eq!(f.header["warmup_per_client"], 20);
        // Every bulk-loaded record (keys are hashes of 0..2000; none collide).
        assert_eq!(f.initial.len(), 2000, "{workload} on {backend}");
        // A read-modify-write is a get line and a put line.
        let measured = d["ops"].as_u64().unwrap() + count(d, "rmw");
        let marked = f.ops.iter().filter(|l| l["measured"] == true).count() as u64;
        assert_eq!(marked, measured, "{workload} on {backend}");
        assert_eq!(d["history"]["measured_events"], measured);
        assert_eq!(d["history"]["events"], f.ops.len());
        assert_eq!(d["history"]["events_checked"], f.ops.len());
        assert_eq!(d["history"]["check"], "ok", "{workload} on {backend}");
        let clients = f.header["clients"].as_u64().unwrap();
        // Warm-up is in the file too: 20 operations per client at least.
        assert!(f.ops.len() as u64 >= measured + 20 * clients);
        let invoked: Vec<u64> = f
            .ops
            .iter()
            .map(|l| l["invoke_ns"].as_u64().unwrap())
            .collect();
        assert!(
            invoked.windows(2).all(|w| w[0] <= w[1]),
            "lines in invocation order"
        );
        // Every written value is unique and none is an initial value.
        let mut written = BTreeSet::new();
        for l in &f.ops {
            assert!(l["invoke_ns"].as_u64().unwrap() <= l["complete_ns"].as_u64().unwrap());
            assert!((1..=clients).contains(&l["client"].as_u64().unwrap()));
            if l["op"] == "put" {
                let v = l["value"].as_u64().unwrap();
                assert!(written.insert(v), "value {v} written twice");
                assert_eq!(v >> 39, l["client"].as_u64().unwrap(), "{l}");
            }
        }
        assert!(f.initial.values().all(|v| !written.contains(v)));
        // What an outside checker sees: the file alone decides.
        let v = check(&events_of(&f.ops), &f.initial);
        assert_eq!(v, Verdict::Ok, "{workload} on {backend}");
    }
    // Several systems: one file per system, nothing at the plain name.
    let h = dir.join("two.jsonl");
    let docs = run_ok(&tiny(&["--ops", "10", "--history", h.to_str().unwrap()]));
    assert!(!h.exists());
    for d in &docs {
        let f = dir.join(format!("two.{}.jsonl", d["system"].as_str().unwrap()));
        assert_eq!(d["history"]["file"], f.to_str().unwrap());
        let file = read_history(&f);
        // 2 compute nodes × 2 threads, 10 measured + 50 warm-up each.
        assert_eq!(file.ops.len(), 4 * 60);
        assert_eq!(d["history"]["check"], Value::Null, "not asked to check");
    }
    // A thread sweep of one system: one file per thread count, each
    // written as its run ended, with that run's clients.
    let h = dir.join("sweep.jsonl");
    let docs = run_ok(&tiny(&[
        "--ops",
        "10",
        "--systems",
        "sherman",
        "--threads",
        "1,2",
        "--history",
        h.to_str().unwrap(),
    ]));
    assert!(!h.exists());
    assert_eq!(docs.len(), 2);
    for d in &docs {
        let threads = d["config"]["threads_per_compute_node"].as_u64().unwrap();
        let f = dir.join(format!("sweep.t{threads}.jsonl"));
        assert_eq!(d["history"]["file"], f.to_str().unwrap());
        let file = read_history(&f);
        assert_eq!(file.header["clients"], 2 * threads);
        assert_eq!(file.ops.len() as u64, 2 * threads * 60);
    }
    assert!(
        !listing(&dir).iter().any(|f| f.contains(".tmp")),
        "{:?}",
        listing(&dir)
    );
}

/// At the paper's scale (176 clients), no two clients' streams are copies:
/// for every pair of clients and every offset within a window, the
/// (operation, key) pairs they share at that offset are a small fraction.
#[test]
fn clients_draw_independent_operation_streams_at_paper_scale() {
    let dir = scratch("streams");
    let h = dir.join("h.jsonl");
    for seed in ["1", "2"] {
        let docs = run_ok(&[
            "run".into(),
            "--systems".into(),
            "sherman".into(),
            "--records".into(),
            "100000".into(),
            "--ops".into(),
            "300".into(),
            "--warmup".into(),
            "0".into(),
            "--seed".into(),
            seed.into(),
            "--history".into(),
            h.to_str().unwrap().into(),
            "--json".into(),
        ]);
        assert_eq!(docs[0]["config"]["threads_per_compute_node"], 22);
        let f = read_history(&h);
        let clients = f.header["clients"].as_u64().unwrap() as usize;
        assert_eq!(clients, 176);
        // Each client's operations in its own order.
        let mut seqs: Vec<Vec<(String, u64)>> = vec![Vec::new(); clients + 1];
        for l in &f.ops {
            let c = l["client"].as_u64().unwrap() as usize;
            seqs[c].push((
                l["op"].as_str().unwrap().to_string(),
                l["key"].as_u64().unwrap(),
            ));
        }
        // Where each (op, key) occurs: (client, position).
        let mut at: HashMap<&(String, u64), Vec<(usize, usize)>> = HashMap::new();
        for (c, s) in seqs.iter().enumerate() {
            for (i, p) in s.iter().enumerate() {
                at.entry(p).or_default().push((c, i));
            }
        }
        const WINDOW: i64 = 300;
        let mut same: HashMap<(usize, usize, i64), u32> = HashMap::new();
        for occ in at.values() {
            for (x, &(c1, i1)) in occ.iter().enumerate() {
                for &(c2, i2) in &occ[x + 1..] {
                    let d = i2 as i64 - i1 as i64;
                    if c1 != c2 && d.abs() <= WINDOW {
                        *same.entry((c1.min(c2), c1.max(c2), d)).or_default() += 1;
                    }
                }
            }
        }
        let (&(a, b, d), &n) = same.iter().max_by_key(|(_, &n)| n).expect("some overlap");
        // Zipf 0.99 makes a few chance matches; copies would match ~300.
        assert!(
            n <= 30,
            "seed {seed}: clients {a} and {b} share {n} of 300 (op, key) pairs at offset {d}"
        );
    }
}

/// A run with faults goes on with the clients that can, counts what failed,
/// and writes the failed operations as pending; the history still checks.
#[test]
fn faults_from_the_command_line_fail_operations_that_are_counted_and_pending() {
    let dir = scratch("faults");
    let h = dir.join("h.jsonl");
    let hs = h.to_str().unwrap();
    let args = tiny(&[
        "--systems",
        "sherman",
        "--ops",
        "200",
        "--fault",
        "memory-crash@300us:0",
        "--fault",
        "thread-stall@50us:1/100us",
        "--fault",
        "link-cut@50us:1-1/80us",
        "--fault",
        "latency-spike@20us:5us/100us",
        "--history",
        hs,
        "--check-history",
    ]);
    let d = &run_ok(&args)[0];
    let failed = d["failed_ops"]["total"].as_u64().unwrap();
    assert!(failed > 0, "node 0 holds the root: {d}");
    let by_kind: u64 = ["read", "update", "insert", "scan", "rmw"]
        .iter()
        .map(|k| d["failed_ops"][k].as_u64().unwrap())
        .sum();
    assert_eq!(by_kind, failed);
    assert_eq!(
        d["faults"].as_array().unwrap().len(),
        5,
        "a cut with a duration heals"
    );
    assert_eq!(d["history"]["check"], "ok");
    let f = read_history(&h);
    assert_eq!(f.header["faults"], d["faults"]);
    let pending = f.ops.iter().filter(|l| l["complete_ns"].is_null()).count() as u64;
    // Each failed operation is one pending line, and so is the operation a
    // stuck client never finished.
    assert!(pending >= failed, "{pending} pending, {failed} failed");
    assert!(pending <= failed + d["unfinished_clients"].as_u64().unwrap());
    assert_eq!(check(&events_of(&f.ops), &f.initial), Verdict::Ok);

    // A plan drawn from a seed: replayable, figure for figure.
    let seeded = tiny(&["--systems", "sherman", "--ops", "100", "--fault-seed", "4"]);
    let (a, b) = (&run_ok(&seeded)[0], &run_ok(&seeded)[0]);
    assert!(!a["faults"].as_array().unwrap().is_empty());
    for k in [
        "ops",
        "elapsed_ns",
        "failed_ops",
        "unfinished_clients",
        "faults",
        "sim_events",
    ] {
        assert_eq!(a[k], b[k], "{k}");
    }
}

#[test]
fn bad_faults_exit_2_naming_the_problem() {
    for (extra, says) in [
        (vec!["--fault", "memory-crash@1ms:9"], "does not exist"),
        (vec!["--fault", "meltdown@1ms:0"], "unknown fault kind"),
        (vec!["--fault", "memory-crash:0"], "no `@TIME`"),
        (vec!["--fault", "thread-stall@1ms:4/1ms"], "there are 4"),
        (vec!["--fault-seed", "x"], "--fault-seed"),
        (
            vec!["--backend", "emu", "--fault", "memory-crash@1ms:0"],
            "sim only",
        ),
    ] {
        // TINY's cluster (one compute node on emu); bad input exits before
        // it boots.
        let drop: &[&str] = if extra.contains(&"emu") {
            &["--compute-nodes"]
        } else {
            &[]
        };
        let args = tiny_without(drop, &extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = bench(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{extra:?}: {stderr}");
        assert!(stderr.contains(says), "{extra:?}: {stderr}");
    }
}

/// Enough of XML to catch what a hand writer gets wrong: balanced tags, an
/// `<svg>` root with the SVG namespace, quoted attributes, escaped text.
/// Returns the element names.
fn svg_elements(doc: &str) -> Vec<String> {
    let body = doc
        .strip_prefix("<?xml version=\"1.0\" encoding=\"UTF-8\"?>")
        .expect("XML declaration");
    let mut stack: Vec<String> = Vec::new();
    let mut names = Vec::new();
    let mut rest = body;
    while let Some(open) = rest.find('<') {
        let text = &rest[..open];
        for (i, _) in text.match_indices('&') {
            assert!(
                ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
                    .iter()
                    .any(|e| text[i..].starts_with(e)),
                "stray & in {text:?}"
            );
        }
        let close = open + rest[open..].find('>').expect("unclosed tag");
        let tag = &rest[open + 1..close];
        rest = &rest[close + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name), "mismatched </{name}>");
            if stack.is_empty() {
                assert!(rest.trim().is_empty(), "content after the root");
            }
            continue;
        }
        let selfclosing = tag.ends_with('/');
        let tag = tag.trim_end_matches('/');
        let name = tag.split_whitespace().next().expect("tag name").to_string();
        if stack.is_empty() {
            assert!(names.is_empty() && name == "svg", "root <{name}>");
            assert!(tag.contains("xmlns=\"http://www.w3.org/2000/svg\""));
        }
        assert_eq!(
            tag.matches('"').count() % 2,
            0,
            "unbalanced quotes in <{tag}>"
        );
        names.push(name.clone());
        if !selfclosing {
            stack.push(name);
        }
    }
    assert!(stack.is_empty(), "unclosed {stack:?}");
    names
}

#[test]
fn plot_writes_well_formed_svgs_and_pngs() {
    let dir = scratch("plot");
    let plots = dir.join("plots");
    run_ok(&tiny(&[
        "--threads",
        "1,2",
        "--ops",
        "20",
        "--plot",
        plots.to_str().unwrap(),
    ]));
    assert_eq!(
        listing(&plots),
        [
            "latency-cdf-t1.png",
            "latency-cdf-t1.svg",
            "latency-cdf-t2.png",
            "latency-cdf-t2.svg",
            "throughput.png",
            "throughput.svg"
        ]
    );
    for f in ["latency-cdf-t1.png", "latency-cdf-t2.png", "throughput.png"] {
        let png = std::fs::read(plots.join(f)).unwrap();
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{f} is not a PNG");
    }
    for f in ["latency-cdf-t1.svg", "latency-cdf-t2.svg", "throughput.svg"] {
        let doc = std::fs::read_to_string(plots.join(f)).unwrap();
        let names = svg_elements(&doc);
        assert_eq!(
            names.iter().filter(|n| *n == "polyline").count(),
            2,
            "{f}: a line per system"
        );
        assert!(
            doc.contains(">sherman</text>") && doc.contains(">fg</text>"),
            "{f}"
        );
        if f == "throughput.svg" {
            // A marker per system and thread count.
            assert_eq!(names.iter().filter(|n| *n == "circle").count(), 4);
        }
    }
    // One thread count: one CDF, no throughput chart.
    let one = dir.join("one");
    run_ok(&tiny(&["--ops", "20", "--plot", one.to_str().unwrap()]));
    assert_eq!(listing(&one), ["latency-cdf.png", "latency-cdf.svg"]);
    // No font to be had: the SVGs, a warning naming the way out, exit 0.
    let nofont = dir.join("nofont");
    let out = Command::new(env!("CARGO_BIN_EXE_loch-bench"))
        .args(tiny(&["--ops", "20", "--plot", nofont.to_str().unwrap()]))
        .env("LOCH_PLOT_FONT", dir.join("no-such.ttf"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(listing(&nofont), ["latency-cdf.svg"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("SVG only").count(), 1, "{err}");
    assert!(err.contains("no-such.ttf"), "{err}");
    // A "font" that never ends (it was read until memory ran out): not a
    // regular file, the same warning.
    let zero = dir.join("zero");
    let out = Command::new(env!("CARGO_BIN_EXE_loch-bench"))
        .args(tiny(&["--ops", "20", "--plot", zero.to_str().unwrap()]))
        .env("LOCH_PLOT_FONT", "/dev/zero")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(listing(&zero), ["latency-cdf.svg"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/dev/zero") && err.contains("not a regular file"),
        "{err}"
    );
}

#[test]
fn bad_input_exits_2_with_one_line_and_no_files() {
    let dir = scratch("bad");
    let good = dir.join("good.properties");
    std::fs::write(&good, "readproportion=1\nupdateproportion=0\n").unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let malformed = write("malformed.properties", "readproportion=lots\n");
    let unsummed = write(
        "unsummed.properties",
        "# note\nunknownkey=1\nreadproportion=0.7\nupdateproportion=0.2\n",
    );
    let badzipf = write("badzipf.properties", "zipfianconstant=1.0\n");
    let baddist = write("baddist.properties", "requestdistribution=hotspot\n");
    let afile = write("a-file", "");
    // A FIFO nobody writes (its open waited for a writer without end; it
    // reads as nothing now) and a file past the 1 MiB a workload file may
    // hold.
    let fifo = dir.join("fifo.properties");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let fifo = fifo.to_str().unwrap();
    let big = dir.join("big.properties");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(2 << 20)
        .unwrap();
    let big = big.to_str().unwrap();
    let missing = dir.join("missing.properties");
    let missing = missing.to_str().unwrap();
    let nodir = dir.join("nowhere/h.jsonl");
    let nodir = nodir.to_str().unwrap();
    let before = listing(&dir);
    let h = dir.join("h.jsonl");
    let p = dir.join("plots");
    let outputs = [
        "--history",
        h.to_str().unwrap(),
        "--plot",
        p.to_str().unwrap(),
    ];
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec!["--workload-file", missing],
            format!("--workload-file: cannot read `{missing}`"),
        ),
        (
            vec!["--workload-file", &malformed],
            format!("{malformed}:1: readproportion=`lots` is not a number"),
        ),
        (
            vec!["--workload-file", &unsummed],
            format!("{unsummed}:4: proportions sum to 0.9, not 1: readproportion=0.7 (line 3) + updateproportion=0.2 (line 4)"),
        ),
        (
            vec!["--workload-file", &badzipf],
            format!("{badzipf}:1: zipfianconstant=1 is out of range"),
        ),
        (
            vec!["--workload-file", &baddist],
            format!("{baddist}:1: requestdistribution=`hotspot` is not supported"),
        ),
        (
            vec!["--workload-file", "/dev/zero"],
            "--workload-file: cannot read `/dev/zero`: not a regular file or a pipe".into(),
        ),
        (
            vec!["--workload-file", fifo],
            format!("--workload-file: cannot read `{fifo}`: a pipe with nothing in it"),
        ),
        (
            vec!["--workload-file", big],
            format!("--workload-file: `{big}` is larger than 1 MiB"),
        ),
        (vec!["--workload", "ycsb-z"], "unknown workload `ycsb-z`".into()),
        (
            vec!["--workload", "ycsb-a", "--workload-file", good.to_str().unwrap()],
            "exclude each other".into(),
        ),
        (vec!["--zipf", "1"], "--zipf must be 0 (uniform) or in (0,1) or (1,5]".into()),
        (vec!["--zipf", "7"], "--zipf must be".into()),
        (vec!["--zipf", "-0.5"], "--zipf must be".into()),
        (vec!["--threads", "0"], "--threads: 0 is out of range".into()),
        (vec!["--threads", "2,0"], "--threads: 0 is out of range".into()),
        (vec!["--threads", "2,x"], "--threads: `x` is not a whole number".into()),
        (vec!["--threads", "2,2"], "--threads: 2 is given twice".into()),
        (vec!["--systems", "sherman,btree9000"], "unknown system `btree9000`".into()),
        (vec!["--systems", "fg,sherman,fg"], "--systems: `fg` is given twice".into()),
        (vec!["--cache-mb", "inf"], "--cache-mb must be in [0, 65536], got inf".into()),
        (vec!["--ops", "5", "--seconds", "1"], "--ops and --seconds exclude each other".into()),
        (vec!["--seconds", "0"], "--seconds must be in (0, 86400]".into()),
        (vec!["--seconds", "soon"], "invalid value 'soon' for '--seconds".into()),
        (vec!["--records", "0"], "--records must be".into()),
        (vec!["--history", nodir], "--history: folder".into()),
        (vec!["--plot", &afile], "is not a folder".into()),
    ];
    for (extra, needle) in cases {
        let mut args = tiny(&extra);
        // Every case also asks for files, except those about the files.
        if !extra.contains(&"--history") && !extra.contains(&"--plot") {
            args.extend(outputs.iter().map(|s| s.to_string()));
        }
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = bench(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(
            err.contains(&needle),
            "{extra:?}:\n got  {err}\n want {needle}"
        );
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{extra:?}: one line, got {err}"
        );
        assert!(err.starts_with("loch-bench run: "), "{err}");
        assert!(out.stdout.is_empty(), "{extra:?}: no partial output");
        assert_eq!(listing(&dir), before, "{extra:?}: no files left behind");
    }
}

#[test]
fn help_documents_every_flag() {
    let out = bench(&["run", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--backend",
        "--workload ",
        "--workload-file",
        "--zipf",
        "--systems",
        "--memory-nodes",
        "--compute-nodes",
        "--threads <N[,N,...]>",
        "--coroutines",
        "--records",
        "--ops",
        "--seconds",
        "--warmup",
        "--cache-mb",
        "--seed",
        "--json",
        "--history",
        "--check-history",
        "--plot",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
    for name in SHIPPED {
        assert!(help.contains(name) || name.starts_with("ycsb-"), "{name}");
    }
    // Words, not line breaks: the help wraps to the terminal.
    let words = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("overrides the file's recordcount"));
    assert!(words.contains("overrides the file's operationcount"));
}

/// The hash table's location cache is allocated whole on every compute
/// node: one larger than the machine's available memory is refused with
/// one clear line (it once aborted the process, or drew the OOM killer).
#[test]
fn a_location_cache_larger_than_memory_is_refused() {
    let args = tiny(&[
        "--systems",
        "cuckoo",
        "--cache-mb",
        "65536",
        "--compute-nodes",
        "256",
    ]);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = bench(&a);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("65536 MiB on each of 256 compute nodes, 16777216 MiB in all, is more than this machine's"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}
