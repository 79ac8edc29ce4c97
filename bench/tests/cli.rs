//! `loch-bench` as scripts use it: JSON with the promised keys, and exit
//! code 2 with one clear line on bad input.

mod common;

use std::process::Command;

use common::{bench, json_doc};

/// The first point of a `--json` run that must succeed.
fn first_point(args: &[&str]) -> serde_json::Value {
    json_doc(args)[0].clone()
}

#[test]
fn verbs_json_has_the_promised_keys() {
    for verb in ["read", "write", "cas", "faa", "masked-cas"] {
        let out = bench(&[
            "verbs", "--verb", verb, "--depth", "4", "--batch", "2", "--ops", "20000", "--json",
            "--no-pin",
        ]);
        assert!(
            out.status.success(),
            "{verb}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON array");
        assert_eq!(all.as_array().map(Vec::len), Some(1), "one point: {all}");
        let v = &all[0];
        assert_eq!(v["schema_version"].as_u64(), Some(1));
        for key in [
            "ops",
            "ops_per_sec",
            "ns_per_op",
            "bytes_per_op",
            "round_trips_per_op",
        ] {
            assert!(v[key].is_number(), "{verb}: missing {key} in {v}");
        }
        for q in ["p50", "p99", "p999"] {
            assert!(
                v["latency_ns"][q].as_u64().is_some_and(|x| x > 0),
                "{verb}: latency {q}"
            );
        }
        assert!(v["ops"].as_u64().unwrap() >= 20000);
        assert_eq!(v["errors"].as_u64(), Some(0));
        // Two verbs per doorbell: half a round trip per verb.
        assert!((v["round_trips_per_op"].as_f64().unwrap() - 0.5).abs() < 1e-9);
    }
}

/// `--span`: the point says its span, its READs land (no errors, every
/// byte counted) on emu and on sim, and a sim run is reproducible.
#[test]
fn verbs_spread_over_a_span_run_and_say_so() {
    for backend in ["emu", "sim"] {
        let mut args = vec![
            "verbs",
            "--backend",
            backend,
            "--size",
            "1k",
            "--span",
            "2m",
            "--depth",
            "2",
            "--threads",
            "2",
            "--ops",
            "4000",
            "--json",
        ];
        if backend == "emu" {
            args.push("--no-pin");
        }
        let v = &first_point(&args);
        assert_eq!(v["span"].as_u64(), Some(2 << 20), "{v}");
        assert!(v["ops"].as_u64().unwrap() >= 4000, "{v}");
        assert_eq!(v["errors"].as_u64(), Some(0));
        assert_eq!(v["bytes_read_per_op"].as_f64(), Some(1024.0));
    }
    let v = &first_point(&["verbs", "--ops", "100", "--json", "--no-pin"]);
    assert!(v["span"].is_null(), "no span unless asked: {v}");
}

#[test]
fn sim_json_has_the_seed_and_the_simulator_speed_and_is_reproducible() {
    let run = || {
        first_point(&[
            "verbs",
            "--backend",
            "sim",
            "--verb",
            "faa",
            "--threads",
            "16",
            "--compute-nodes",
            "2",
            "--memory-nodes",
            "2",
            "--duration",
            "0.0005",
            "--seed",
            "4",
            "--json",
        ])
    };
    let (a, b) = (run(), run());
    assert_eq!(a["seed"].as_u64(), Some(4));
    assert_eq!(a["simulated"].as_bool(), Some(true));
    assert!(a["sim_verbs_per_wall_sec"].as_f64().unwrap() > 0.0);
    for key in ["ops", "ops_per_sec", "latency_ns", "round_trips_per_op"] {
        assert_eq!(a[key], b[key], "{key} differs between two runs of one seed");
    }
    // Uncontended 8-byte FAA on host memory: two link latencies, the atomic,
    // the post and a turn; nowhere near a millisecond.
    let p50 = a["latency_ns"]["p50"].as_u64().unwrap();
    assert!((2_000..4_000).contains(&p50), "p50 {p50} ns");
}

#[test]
fn bad_input_exits_2_with_a_clear_line() {
    for (args, needle) in [
        (vec!["verbs", "--verb", "teleport"], "unknown verb"),
        (vec!["verbs", "--depth", "0"], "--depth"),
        (vec!["verbs", "--size", "lots"], "--size"),
        (vec!["verbs", "--backend", "carrier-pigeon"], "--backend"),
        (
            vec!["verbs", "--bogus", "1"],
            "unexpected argument '--bogus'",
        ),
        (
            vec!["verbs", "--duration"],
            "a value is required for '--duration",
        ),
        (vec!["frobnicate"], "unrecognized subcommand 'frobnicate'"),
        (
            vec!["verbs", "--backend", "sim", "--duration", "-1"],
            "--duration",
        ),
        (
            vec!["verbs", "--backend", "sim", "--memory-nodes", "0"],
            "--memory-nodes",
        ),
        (vec!["verbs", "--size", "1k", "--span", "512"], "--span"),
        // Once wrapped to no latency at all on emu.
        (
            vec!["verbs", "--latency-ns", "18446744073709551615"],
            "--latency-ns must be at most",
        ),
        (vec!["verbs", "--matrix", "--span", "1000"], "--span"),
        (vec!["verbs", "--span", "17g"], "--span"),
        // Output paths that would fail only after the run (exit 1), or
        // replace a device's link in /dev.
        (
            vec!["hash-load", "--plot", "/proc/x.svg"],
            "cannot write in folder",
        ),
        (
            vec!["run", "--history", "/dev/stdout"],
            "not a regular file",
        ),
        // Accepted and unused (emu draws nothing without --span).
        (vec!["verbs", "--seed", "7"], "--seed applies to sim"),
        // Rounded to 0 ns: a row of zeros, exit 0.
        (vec!["verbs", "-D", "1e-10"], "--duration must be in"),
        (
            vec!["verbs", "--span", "1m", "--contended"],
            "cannot be used with",
        ),
        (
            vec!["run", "--systems", "cuckoo", "--hash-grace-ms", "1"],
            "--hash-grace-ms",
        ),
        (
            vec!["run", "--systems", "sherman", "--hash-grace-ms", "50"],
            "add cuckoo",
        ),
        // Counts whose sum with the warm-up, or product with the
        // clients, would wrap: once a run of no operations, reported.
        (
            vec!["run", "--ops", "18446744073709551615"],
            "--ops must be at most",
        ),
        (
            vec!["run", "--ops", "10", "--warmup", "18446744073709551615"],
            "--warmup must be at most",
        ),
        // The device flags belong to --backend mlx5.
        (
            vec!["verbs", "--device", "mlx5_0"],
            "--device is for --backend mlx5, not emu",
        ),
        (
            vec!["locks", "--port", "2"],
            "--port is for --backend mlx5, not sim",
        ),
        (
            vec!["verbs", "--backend", "sim", "--gid-index", "3"],
            "--gid-index is for --backend mlx5, not sim",
        ),
        (
            vec!["verbs", "--backend", "emu", "--traffic-class", "106"],
            "--traffic-class is for --backend mlx5, not emu",
        ),
        // Flags a backend or mode has no use for, once silently dropped,
        // and a simulated task count past any host's memory (it aborted).
        (
            vec!["verbs", "--matrix", "--depth", "4"],
            "cannot be used with",
        ),
        (
            vec!["verbs", "--compute-nodes", "2"],
            "--compute-nodes: the emu and mlx5 backends run one compute node (this process)",
        ),
        (
            vec!["locks", "--backend", "emu", "--compute-nodes", "2"],
            "--compute-nodes: the emu and mlx5 backends run one compute node (this process)",
        ),
        (
            vec![
                "verbs",
                "--backend",
                "sim",
                "--threads",
                "100000",
                "--depth",
                "1024",
            ],
            "simulated tasks; at most 1048576 on sim",
        ),
        (
            vec!["ring", "--backend", "sim", "--no-pin"],
            "--no-pin applies to emu and mlx5",
        ),
        (
            vec!["locks", "--no-pin"],
            "--no-pin applies to emu and mlx5",
        ),
        (
            vec!["verbs", "--backend", "sim", "--no-pin"],
            "--no-pin applies to emu and mlx5",
        ),
        // Simulated clusters past a host's memory (each flag in range,
        // their product not): killed for memory, with no word why.
        (
            vec![
                "locks",
                "--compute-nodes",
                "1024",
                "--threads",
                "1024",
                "--memory-nodes",
                "1024",
            ],
            "queue pairs; at most 1048576 on sim",
        ),
        (
            vec![
                "locks",
                "--compute-nodes",
                "1024",
                "--threads",
                "16",
                "--coroutines",
                "1024",
                "--memory-nodes",
                "1",
            ],
            "simulated tasks; at most 1048576 on sim",
        ),
        (
            vec![
                "verbs",
                "--backend",
                "sim",
                "--threads",
                "100000",
                "--memory-nodes",
                "64",
            ],
            "queue pairs; at most 1048576 on sim",
        ),
        (
            vec!["txn", "--machines", "20000"],
            "queue pairs; at most 1048576 on sim",
        ),
        (
            vec![
                "txn",
                "--fault",
                "machine-crash@30ms:3",
                "--machines",
                "2000",
            ],
            "queue pairs; at most 1048576 on sim",
        ),
        // Once the boot's failure, exit 1, as if the benchmark had failed.
        (
            vec![
                "locks",
                "--backend",
                "emu",
                "--coroutines",
                "1024",
                "--memory-nodes",
                "128",
            ],
            "--coroutines 1024 with --memory-nodes 128 needs a completion queue",
        ),
        // Once silently ignored.
        (
            vec!["txn", "--workload", "tatp", "--ops", "9"],
            "--ops does not apply but to --workload ycsb-t",
        ),
        (
            vec!["txn", "--workload", "bank", "--writes", "1"],
            "--writes does not apply but to --workload ycsb-t",
        ),
        (
            vec![
                "txn",
                "--fault",
                "machine-crash@30ms:3",
                "--detection-only",
                "--threads",
                "8",
            ],
            "--threads does not apply with --detection-only",
        ),
        (
            vec![
                "txn",
                "--fault",
                "machine-crash@30ms:3",
                "--detection-only",
                "--keys",
                "1",
            ],
            "--keys does not apply with --detection-only",
        ),
        // Sums with it wrapped (a panic in a debug build).
        (
            vec![
                "run",
                "--backend",
                "sim",
                "--sim-model",
                "header_bytes=18446744073709551615",
            ],
            "header_bytes must be at most 1 MiB",
        ),
        // A verb that takes no time breaks the history checker's tie rule.
        (
            vec![
                "run",
                "--backend",
                "sim",
                "--sim-model",
                "link_latency_ns_one_way=0",
            ],
            "link_latency_ns_one_way must be positive",
        ),
        (vec!["ring", "--seed", "3"], "--seed applies to sim"),
        (
            vec!["verbs", "--depth", "1024", "--memory-nodes", "128"],
            "needs a completion queue of 2097152 entries a core; emu holds 1048576",
        ),
    ] {
        let out = bench(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: no partial output");
    }
}

/// Runs whose memory is past this machine's available memory are refused
/// before anything is built, naming it (they were killed for memory
/// part-way): a load of 100 million records of 1 KiB keys and values
/// (about 300 GB of leaves), and 100,000 simulated tasks each holding a
/// 16 MiB READ (1.6 TB). Each is skipped on a machine with that memory.
#[test]
fn runs_past_this_machines_memory_are_refused() {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .unwrap();
    let avail: u64 = line
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024;
    for (args, need, what) in [
        (
            vec![
                "run",
                "--backend",
                "sim",
                "--systems",
                "sherman",
                "--records",
                "100000000",
                "--key-size",
                "1024",
                "--value-size",
                "1024",
            ],
            250u64 << 30,
            "--records 100000000 of 1024-byte keys and 1024-byte values",
        ),
        (
            vec![
                "verbs",
                "--backend",
                "sim",
                "--threads",
                "100000",
                "--size",
                "16m",
                "--memory-nodes",
                "1",
            ],
            1500 << 30,
            "--threads 100000 × --depth 1 tasks",
        ),
        // A history held whole until the run ends: 4 clients × 10^11
        // operations, past any machine's memory, once recorded until the
        // run was killed for memory.
        (
            vec![
                "run",
                "--backend",
                "sim",
                "--systems",
                "sherman",
                "--records",
                "2000",
                "--memory-nodes",
                "2",
                "--compute-nodes",
                "2",
                "--threads",
                "2",
                "--ops",
                "100000000000",
                "--history",
                "/tmp/never-written.jsonl",
            ],
            1 << 50,
            "the history of 400000000200 operations",
        ),
        // The memory nodes' memory counts too (only the tasks' scratch
        // did; the emu nodes faulted the span in until killed).
        (
            vec!["verbs", "--span", "16g", "--memory-nodes", "64", "-D", "60"],
            64 << 34,
            "64 memory nodes of 16385 MiB",
        ),
        // hash-load keeps every operation for its rows: 2^24 keys, each
        // updated 64 times, 32 bytes each (it ran until killed).
        (
            vec!["hash-load", "--capacity", "16777216", "--updates", "64"],
            (1 << 24) * 65 * 32,
            "the 1090519040 inserts and updates kept",
        ),
    ] {
        if avail >= need {
            continue;
        }
        let out = bench(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(what) && err.contains("more than this machine's"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn the_hash_table_runs_as_a_system_beside_the_tree() {
    let v = json_doc(&[
        "run",
        "--systems",
        "sherman,cuckoo",
        "--workload",
        "ycsb-a",
        "--memory-nodes",
        "2",
        "--compute-nodes",
        "2",
        "--threads",
        "2",
        "--records",
        "3000",
        "--ops",
        "50",
        "--json",
    ]);
    let systems: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["system"].as_str().unwrap())
        .collect();
    assert_eq!(systems, ["sherman", "cuckoo"]);
    let cuckoo = &v[1];
    // The tree's figures do not apply to the hash table: null, not zero;
    // the configuration is JSON values, not a Debug string.
    for k in ["clean_lookup_ratio", "retries_per_op", "splits"] {
        assert!(cuckoo[k].is_null(), "{k}: {}", cuckoo[k]);
        assert!(v[0][k].is_number(), "{k}: {}", v[0][k]);
    }
    assert_eq!(v[0]["schema_version"].as_u64(), Some(1));
    assert_eq!(v[0]["config"]["tree"]["combine"].as_bool(), Some(true));
    // A hash-table get is two round trips (both buckets, then the entry)
    // or, where the compute node's location cache knew the key's slot,
    // one; the share of one-round-trip reads is reported.
    let p50 = cuckoo["round_trips"]["read"]["p50"].as_u64();
    assert!(matches!(p50, Some(1 | 2)), "{p50:?}");
    let one = cuckoo["reads_within_1_round_trip"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&one), "{one}");
    // Its cache figure is the location cache's: gets answered from it.
    let hit = cuckoo["cache_hit_ratio"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&hit), "{hit}");
    assert_eq!(
        cuckoo["ops"].as_u64(),
        Some(2 * 2 * 50),
        "2 compute nodes x 2 threads x 50 ops"
    );
    // No scans in a hash table: refused before anything runs.
    let out = bench(&["run", "--systems", "cuckoo", "--workload", "ycsb-e"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no scans"));
}

#[test]
fn help_and_version_exit_0_on_stdout() {
    for args in [
        vec!["--help"],
        vec!["-h"],
        vec!["verbs", "--help"],
        vec!["run", "--help"],
        vec!["ring", "--help"],
        vec!["hash-load", "--help"],
        vec!["hash-grow", "--help"],
        vec!["help", "run"],
    ] {
        let out = bench(&args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("Usage: loch-bench"), "{args:?}: {help}");
        assert!(help.contains("Exit codes:"), "{args:?}: {help}");
        assert!(out.stderr.is_empty(), "{args:?}");
    }
    let verbs = String::from_utf8_lossy(&bench(&["verbs", "--help"]).stdout).to_string();
    for flag in [
        "-s, --size",
        "-n, --ops",
        "--iters",
        "-D, --duration",
        "-a, --all-sizes",
        "--report_gbits",
    ] {
        assert!(verbs.contains(flag), "verbs --help lacks {flag}");
    }
    for args in [vec!["--version"], vec!["-V"], vec!["verbs", "--version"]] {
        let out = bench(&args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let v = String::from_utf8_lossy(&out.stdout);
        let want = format!(" {} (commit ", env!("CARGO_PKG_VERSION"));
        assert!(
            v.starts_with("loch-bench") && v.contains(&want),
            "{args:?}: {v}"
        );
        assert!(v.trim_end().ends_with("backends: emu, sim)"), "{v}");
        assert_eq!(v.lines().count(), 1, "{v}");
    }
}

#[test]
fn unknown_flags_suggest_the_nearest_in_one_line() {
    let out = bench(&["run", "--recods", "5"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("'--recods'") && err.contains("'--records'"),
        "{err}"
    );
    assert!(err.contains("see `loch-bench run --help`"), "{err}");
    assert!(out.stdout.is_empty());
}

/// A small simulated cluster for short sweeps: 2 threads, one node of each
/// kind, 0.2 virtual ms per point.
const SMALL_SIM: [&str; 8] = [
    "--threads",
    "2",
    "--compute-nodes",
    "1",
    "--memory-nodes",
    "1",
    "-D",
    "0.0002",
];

#[test]
fn perftest_flags_sweep_sizes_and_report_gbits() {
    // -a: 2 B .. 8 MiB, a row each; -n as perftest's iterations; the verb
    // in any case; --report_gbits: bits, eight times the bytes.
    let mut sim = vec!["verbs", "--verb", "READ", "--backend", "Sim"];
    sim.extend(SMALL_SIM);
    let mut args = sim.clone();
    args.extend(["-a", "--json"]);
    let out = bench(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sizes: Vec<u64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, (1..=23).map(|p| 1u64 << p).collect::<Vec<_>>());
    for p in v.as_array().unwrap() {
        let (gb, gbit) = (
            p["gbytes_per_sec"].as_f64().unwrap(),
            p["gbits_per_sec"].as_f64().unwrap(),
        );
        assert!((gbit - 8.0 * gb).abs() <= 1e-9 * gbit.max(1.0), "{p}");
    }
    let mut args = sim.clone();
    args.extend(["-s", "4k", "--report_gbits"]);
    let out = bench(&args);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.lines().next().unwrap().contains("Gb/s"), "{table}");
    assert!(table.contains(" 4096 "), "{table}");
    let out = bench(&["verbs", "--verb", "cas", "-a"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("atomics are 8 bytes"));
    let out = bench(&["verbs", "-n", "3000", "--json", "--no-pin"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v[0]["ops"].as_u64().unwrap() >= 3000);
}

/// `-n` alone runs every verb it asks for (perftest's -n), however long
/// they take; with `-D` too, whichever comes first. Before, `-n` stopped
/// at the default duration as well: on sim 10 ms of virtual time, about
/// 4,000 verbs of one task in a row.
#[test]
fn verbs_ops_alone_run_every_verb_and_a_duration_still_bounds_them() {
    let one_task = [
        "verbs",
        "--backend",
        "sim",
        "--threads",
        "1",
        "--compute-nodes",
        "1",
        "--memory-nodes",
        "1",
        "--depth",
        "1",
        "--json",
    ];
    let ops = |more: &[&str]| {
        let mut args = one_task.to_vec();
        args.extend(more);
        first_point(&args)["ops"].as_u64().unwrap()
    };
    assert_eq!(ops(&["-n", "20000"]), 20000);
    let bounded = ops(&["-n", "20000", "-D", "0.001"]);
    assert!(bounded < 20000, "{bounded} verbs in 1 ms of virtual time");
}

#[test]
fn a_closed_stdout_ends_the_output_quietly() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    // `loch-bench verbs -a | head -1`: the reader leaves after the header,
    // the benchmark still has 23 rows to print.
    let mut child = Command::new(env!("CARGO_BIN_EXE_loch-bench"))
        .args(["verbs", "--backend", "sim", "-a"])
        .args(SMALL_SIM)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with("verb"), "{first}");
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{err}"
    );
}

#[test]
fn a_closed_stderr_is_not_a_panic() {
    use std::process::Stdio;
    // `loch-bench ... 2>&1 | head -0`: bad input and a warning with nowhere
    // to go (`eprintln!` panicked, exit 101); the exit codes stand.
    for (args, code) in [
        (&["run", "--bogus"][..], 2),
        (&["run", "--threads", "0"][..], 2),
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_loch-bench"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stderr.take());
        assert_eq!(child.wait().unwrap().code(), Some(code), "{args:?}");
    }
}

/// Runs `loch-bench ARGS`, sends SIGINT after two seconds, and returns
/// its output; it must stop within ten seconds, with exit code 130.
fn interrupted(args: &[&str]) -> std::process::Output {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let mut child = Command::new(env!("CARGO_BIN_EXE_loch-bench"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: kill(2) on our own child, not yet waited for.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    // Its output is a few KiB at the end, within a pipe's buffer: waiting
    // without reading cannot block it.
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} did not stop within 10 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{args:?}: {err}");
    out
}

/// [`interrupted`]'s first JSON result.
fn interrupted_json(args: &[&str]) -> serde_json::Value {
    let out = interrupted(args);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the results");
    v[0].clone()
}

#[test]
fn sigint_ends_a_run_with_its_results_and_exit_130() {
    let run = interrupted_json(&[
        "run",
        "--backend",
        "emu",
        "--systems",
        "sherman",
        "--records",
        "20000",
        "--threads",
        "1",
        "--warmup",
        "10",
        "--seconds",
        "60",
        "--json",
    ]);
    // The results of what ran: a measured window shorter than asked.
    assert!(run["ops"].as_u64().unwrap() > 0, "{run}");
    assert!(
        run["elapsed_ns"].as_u64().unwrap() < 30_000_000_000,
        "{run}"
    );
    // On sim the world stops at the next slice, its operations in flight
    // pending: 11,264 FG+ clients spinning on hot locks each took minutes
    // of wall time to end the put they were in.
    let run = interrupted_json(&["run", "--systems", "fg", "--coroutines", "64", "--json"]);
    assert!(run["unfinished_clients"].as_u64().unwrap() > 0, "{run}");
}

/// `txn`, `ring`, `hash-grow`, `hash-load` and `locks` stop on SIGINT too (they once ran on to
/// the end, their signal swallowed): each coordinator ends its transaction
/// in flight, the ring's sender sends an end record, and what ran is
/// reported.
#[test]
fn sigint_ends_txn_ring_and_hash_table_runs_with_exit_130() {
    let lots = "100000000000";
    let txn = interrupted_json(&["txn", "--txs", lots, "--json"]);
    let committed = txn["committed"].as_u64().unwrap();
    assert!(committed > 0, "{txn}");
    // Far fewer than asked: 16 coordinators × 10^11.
    assert!(committed < 1_000_000_000, "{txn}");
    let ring = interrupted_json(&["ring", "--backend", "sim", "-n", lots, "--json"]);
    let records = ring["records"].as_u64().unwrap();
    assert!(records > 0 && records < 1_000_000_000, "{ring}");
    assert!(ring["records_per_sec"].as_f64().unwrap() > 0.0, "{ring}");
    // hash-grow (about a minute at this capacity) has no partial figure:
    // it says so and prints nothing.
    let grow = interrupted(&["hash-grow", "--capacity", "4194304", "--json"]);
    assert!(grow.stdout.is_empty());
    let err = String::from_utf8_lossy(&grow.stderr);
    assert!(
        err.contains("stopped by SIGINT/SIGTERM before the growth"),
        "{err}"
    );
    // hash-load likewise (it exited 1, "an operation failed", though its
    // help promised 130).
    let load = interrupted(&["hash-load", "--capacity", "16777216", "--json"]);
    assert!(load.stdout.is_empty());
    let err = String::from_utf8_lossy(&load.stderr);
    assert!(err.contains("before the table was full"), "{err}");
    // locks on sim: 17,600 clients spinning on hot host-memory locks
    // took 34 s to stop, each ending the acquisition it was in; the world
    // now stops at its next look. No variant ended: an empty array.
    let locks = interrupted(&["locks", "--coroutines", "100", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&locks.stdout).expect("the results");
    assert_eq!(v, serde_json::json!([]));
}

#[test]
fn more_threads_than_cpus_online_are_warned_about() {
    // SAFETY: sysconf takes no pointers.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    let over = (online + 1).to_string();
    let out = bench(&[
        "verbs",
        "--threads",
        &over,
        "-n",
        "2000",
        "--no-pin",
        "--json",
    ]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "warning: {over} threads asked for, but this machine has {online} CPUs online"
        )),
        "{err}"
    );
    let out = bench(&[
        "verbs",
        "--threads",
        "1",
        "-n",
        "2000",
        "--no-pin",
        "--json",
    ]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("CPUs online"));
}

/// An emu cluster of more memory nodes than the soft limit on open files
/// allows boots, the soft limit raised to the hard one; under a hard limit
/// too low the boot fails saying which limit to raise.
#[test]
fn emu_nodes_past_the_soft_open_file_limit_boot() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct it is given; checked.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    assert!(
        lim.rlim_max >= 1024,
        "this test needs a hard limit on open files of at least 1024 (`ulimit -Hn`: {})",
        lim.rlim_max
    );
    let with_limit = |ulimit: &str| {
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "ulimit {ulimit} 64 && exec \"$0\" verbs --backend emu --memory-nodes 200 \
                 -n 2000 --no-pin --json"
            ))
            .arg(env!("CARGO_BIN_EXE_loch-bench"))
            .output()
            .expect("run sh")
    };
    let out = with_limit("-Sn");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(doc[0]["memory_nodes"], 200, "{doc}");
    let out = with_limit("-n");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Too many open files") && err.contains("`ulimit -n`"),
        "{err}"
    );
}

/// `loch-bench ring`: every record arrives, in order and whole (the
/// receiver checks), on both backends; on sim the run is reproducible and
/// its median one-way latency sits at what the model predicts for one
/// WRITE and the poll; bad sizes are refused with exit 2.
#[test]
fn ring_moves_records_and_reports_their_latency() {
    let sim = ["ring", "--backend", "sim", "-n", "5000", "--json"];
    let a = first_point(&sim);
    assert_eq!(a["records"].as_u64(), Some(5000));
    assert_eq!(a["schema_version"].as_u64(), Some(1));
    let p50 = a["latency_us"]["p50"].as_f64().unwrap();
    let model = a["model_one_way_us"].as_f64().unwrap();
    assert!(
        (p50 - model).abs() < 0.1,
        "sim p50 {p50} us, the model's one WRITE plus the poll {model} us"
    );
    assert_eq!(a, first_point(&sim), "a sim run is reproducible");
    let e = first_point(&["ring", "-n", "20000", "--batch", "4", "--json", "--no-pin"]);
    assert_eq!(e["backend"], "emu");
    assert!(e["records_per_sec"].as_f64().unwrap() > 0.0);
    assert!(e["model_one_way_us"].is_null());
    // Doorbells that fill the ring exactly: eight 32-byte records in 256
    // bytes, never split by its end.
    let full = first_point(&[
        "ring",
        "--backend",
        "sim",
        "--capacity",
        "256",
        "--size",
        "16",
        "--batch",
        "8",
        "-n",
        "1000",
        "--json",
    ]);
    assert_eq!(full["records"].as_u64(), Some(1000));
    for bad in [
        vec!["ring", "--size", "8"],
        vec!["ring", "--size", "1m"],
        vec!["ring", "--batch", "16"],
        vec!["ring", "--capacity", "1000"],
        // Doorbells of records the ring cannot hold at once (once found
        // in the run: "ring full", exit 1).
        vec!["ring", "--capacity", "256", "--size", "85", "--batch", "15"],
        vec![
            "ring",
            "--capacity",
            "1024",
            "--size",
            "64",
            "--batch",
            "13",
        ],
        vec!["ring", "-n", "0"],
    ] {
        let out = bench(&bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).lines().count(),
            1,
            "{bad:?}"
        );
    }
}

/// Checks a `loch-bench txn --history` file (Elle list-append JSON lines)
/// with the outside checker the transaction tests use.
fn assert_strict_serializable(lines: &str, what: &str) {
    let h = adya::History::from_json(lines).expect("the history parses");
    let r = adya::check(&h, adya::Workload::ListAppend, &adya::Opts::default());
    assert_eq!(
        r.valid,
        adya::Valid::True,
        "{what}: not strict serializable: {:?}",
        r.anomaly_types
    );
}

#[test]
fn txn_runs_each_workload_and_counts_its_verbs() {
    for w in ["tatp", "smallbank", "ycsb-t", "append", "bank"] {
        let args = [
            "txn",
            "--workload",
            w,
            "--machines",
            "4",
            "--threads",
            "2",
            "--txs",
            "60",
            "--json",
        ];
        let a = first_point(&args);
        assert_eq!(a["schema_version"].as_u64(), Some(1));
        assert_eq!(a["workload"], w);
        assert_eq!(a["replicas"].as_u64(), Some(3));
        let committed = a["committed"].as_u64().unwrap();
        assert!(committed > 0, "{w}: nothing committed");
        assert!(a["committed_per_sec"].as_f64().unwrap() > 0.0);
        let by_type: u64 = a["by_type"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v["committed"].as_u64().unwrap())
            .sum();
        assert_eq!(by_type, committed, "{w}: types add up");
        // Every commit writes its records; none of them is free.
        let per = &a["per_committed"];
        assert!(per["writes"].as_f64().unwrap() > 0.0);
        assert_eq!(
            per["writes"], per["messages"],
            "{w}: every WRITE is a ring message"
        );
        assert_eq!(a, first_point(&args), "{w}: a sim run is reproducible");
    }
    let e = first_point(&[
        "txn",
        "--backend",
        "emu",
        "--machines",
        "2",
        "--replicas",
        "2",
        "--txs",
        "300",
        "--json",
    ]);
    assert_eq!(e["backend"], "emu");
    assert!(e["committed"].as_u64().unwrap() > 0);
    let dir = std::env::temp_dir().join(format!("loch-txn-history-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("h.jsonl");
    let f = file.to_str().unwrap();
    first_point(&[
        "txn",
        "--workload",
        "append",
        "--machines",
        "3",
        "--txs",
        "20",
        "--history",
        f,
        "--json",
    ]);
    let lines = std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        lines.lines().count(),
        3 * 20 * 2,
        "an invoke and a completion a transaction"
    );
    assert_strict_serializable(&lines, "sim");
    // On emu the coordinators run at once on threads of their own: the
    // file an outside checker gets from a real concurrent run.
    let e = first_point(&[
        "txn",
        "--backend",
        "emu",
        "--workload",
        "append",
        "--machines",
        "2",
        "--replicas",
        "2",
        "--keys",
        "3",
        "--txs",
        "150",
        "--history",
        f,
        "--json",
    ]);
    let lines = std::fs::read_to_string(&file).unwrap();
    let tried = e["attempted"].as_u64().unwrap() + e["given_up"].as_u64().unwrap();
    assert_eq!(
        lines.lines().count() as u64,
        2 * tried,
        "an invoke and a completion a transaction tried (a full list's appends are given up)"
    );
    assert_strict_serializable(&lines, "emu");
    std::fs::remove_dir_all(&dir).unwrap();
    for bad in [
        vec!["txn", "--replicas", "1"],
        vec!["txn", "--machines", "2", "--replicas", "3"],
        vec!["txn", "--workload", "tatp", "--history", "/tmp/x"],
        vec!["txn", "--workload", "ycsb-t", "--ops", "3", "--writes", "4"],
        vec!["txn", "--keys", "1"],
        vec!["txn", "--keys", "18446744073709551615"],
        vec!["txn", "--keys", "4294967296"],
        vec!["txn", "--log-bytes", "1000"],
        vec!["txn", "--lease-ms", "0"],
        vec!["txn", "--fault", "nonsense"],
        vec!["txn", "--fault", "machine-crash@1ms:0", "--backend", "emu"],
        vec!["txn", "--fault", "machine-crash@1ms:0", "--seeds", "0"],
        // One OS thread each: a spawn the OS refused once panicked.
        vec![
            "txn",
            "--backend",
            "emu",
            "--machines",
            "16",
            "--threads",
            "100",
        ],
        vec![
            "txn",
            "--workload",
            "append",
            "--history",
            "/nonexistent/dir/h",
        ],
        // Flags of the other mode, once accepted and ignored; a fault's
        // machine that is not there (once found inside the run: exit 1),
        // and one past the run's time limit (once simulated for hours).
        vec!["txn", "--plot", "/tmp/t.svg"],
        vec!["txn", "--seeds", "3"],
        vec!["txn", "--detection-only"],
        vec!["txn", "--fault", "machine-crash@30ms:3", "--txs", "10"],
        vec![
            "txn",
            "--fault",
            "machine-crash@30ms:3",
            "--history",
            "/tmp/h",
        ],
        vec![
            "txn",
            "--fault",
            "machine-crash@30ms:3",
            "--detection-only",
            "--plot",
            "/tmp/t.svg",
        ],
        vec!["txn", "--fault", "machine-crash@30ms:99"],
        // Past 2^32 appended values a coordinator's would repeat.
        vec!["txn", "--workload", "append", "--txs", "1073741824"],
        // Threads past the run's (3 × (1 core + a lease core + a recovery
        // core); 3 lease and 3 reconfiguration cores): the simulator
        // refused them once the run began (exit 1).
        vec![
            "txn",
            "--fault",
            "thread-stall@30ms:9/1ms",
            "--machines",
            "3",
        ],
        vec![
            "txn",
            "--fault",
            "thread-stall@30ms:6/1ms",
            "--machines",
            "3",
            "--detection-only",
        ],
        vec!["txn", "--fault", "machine-crash@30ms:3", "--machines", "3"],
        vec!["txn", "--fault", "partition@30ms:0+20", "--machines", "4"],
        // Crashes no configuration can recover from: once a run that
        // stalled until its time limit (exit 1) or failed a task.
        vec![
            "txn",
            "--fault",
            "machine-crash@30ms:1",
            "--machines",
            "2",
            "--replicas",
            "2",
        ],
        vec![
            "txn",
            "--fault",
            "machine-crash@30ms:1",
            "--fault",
            "memory-crash@40ms:2",
            "--machines",
            "4",
            "--replicas",
            "2",
        ],
        vec![
            "txn",
            "--fault",
            "machine-crash@1000000s:3",
            "--detection-only",
        ],
    ] {
        let out = bench(&bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr).lines().count(),
            1,
            "{bad:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A fault run's last thread takes a stall, under the workload (its
/// recovery core) and with `--detection-only` (a reconfiguration core):
/// the thread numbers `txn --help` gives are the simulator's.
#[test]
fn txn_thread_stalls_reach_the_last_thread() {
    for last in [
        &["--fault", "thread-stall@30ms:8/1ms"][..],
        &["--fault", "thread-stall@30ms:5/1ms", "--detection-only"],
    ] {
        let mut args = vec!["txn", "--machines", "3", "--seeds", "1"];
        args.extend_from_slice(last);
        let out = bench(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `txn --lease-ms` reports the leases of a run under load; `txn --fault
/// --detection-only` the detection and reconfiguration times over seeds,
/// each run's new configuration without the crashed machine; `txn
/// --fault` under a workload the recovery's times and the throughput
/// timeline (and its chart).
#[test]
fn txn_reports_leases_and_fault_timelines() {
    let json = first_point;
    let a = json(&[
        "txn",
        "--machines",
        "4",
        "--txs",
        "300",
        "--lease-ms",
        "1",
        "--json",
    ]);
    let l = &a["leases"];
    assert_eq!(l["lease_ns"].as_u64(), Some(1_000_000));
    assert_eq!(l["suspicions"].as_u64(), Some(0));
    assert!(l["grants"].as_u64().unwrap() > 0);
    let f = json(&[
        "txn",
        "--machines",
        "6",
        "--fault",
        "machine-crash@20ms:0",
        "--seeds",
        "5",
        "--detection-only",
        "--json",
    ]);
    assert_eq!(f["bench"], "txn-fault");
    let runs = f["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 5);
    for r in runs {
        let c = &r["configuration"];
        assert_eq!(c["id"].as_u64(), Some(2), "{r}");
        assert_eq!(c["cm"].as_u64(), Some(1), "{r}");
        assert_eq!(c["machines"], serde_json::json!([1, 2, 3, 4, 5]));
        let (s, st, cm) = (
            r["suspected_ms"].as_f64().unwrap(),
            r["stored_ms"].as_f64().unwrap(),
            r["committed_ms"].as_f64().unwrap(),
        );
        assert!(s > 0.0 && s <= st && st <= cm && cm < 30.0, "{r}");
    }
    assert_eq!(f["summary"]["NEW-CONFIG-COMMIT"]["runs"].as_u64(), Some(5));
    // Seeds from --seed on wrap past u64::MAX (the range once came out
    // empty there: no runs, and a panic under a workload).
    let w = json(&[
        "txn",
        "--machines",
        "4",
        "--fault",
        "machine-crash@20ms:0",
        "--seed",
        "18446744073709551615",
        "--seeds",
        "2",
        "--detection-only",
        "--json",
    ]);
    let seeds: Vec<u64> = w["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["seed"].as_u64().unwrap())
        .collect();
    assert_eq!(seeds, [u64::MAX, 0], "{w}");
    // Under a workload: the bank holds (or the run fails), throughput
    // comes back, and the timeline covers the window.
    let plot = std::env::temp_dir().join(format!("loch-fault-plot-{}.svg", std::process::id()));
    let g = json(&[
        "txn",
        "--machines",
        "5",
        "--workload",
        "bank",
        "--keys",
        "40",
        "--fault",
        "machine-crash@20ms:2",
        "--seeds",
        "2",
        "--plot",
        plot.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(g["workload"], "bank");
    for r in g["runs"].as_array().unwrap() {
        let t = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {r}"));
        assert!(t("suspected_ms") <= t("committed_ms"), "{r}");
        assert!(t("committed_ms") <= t("active_ms"), "{r}");
        assert!(t("active_ms") < t("rereplicated_ms"), "{r}");
        // Throughput comes back soon after the new configuration (to_80
        // is the end of the last 1 ms bucket under 80%, which at this
        // small scale a bucket's noise can put anywhere in the window):
        // no earlier than the start of the bucket the commit fell in,
        // whose rest may already run at full rate.
        let bucket = r["timeline"]["bucket_ms"].as_f64().unwrap();
        let committed_bucket = (t("committed_ms") / bucket).floor() * bucket;
        assert!(t("to_80_ms") >= committed_bucket, "{r}");
        let before = r["committed_per_ms_before"].as_f64().unwrap();
        assert!(before > 0.0);
        let line: Vec<f64> = r["timeline"]["committed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_f64().unwrap())
            .collect();
        assert_eq!(line.len(), 70);
        let back = (10 + t("committed_ms") as usize..line.len()).find(|&i| line[i] >= 0.8 * before);
        assert!(
            back.is_some_and(|i| (i as f64 - 10.0) < t("committed_ms") + 5.0),
            "{r}"
        );
    }
    // Three machines, 3-way: no machine is left to take the lost
    // replicas' place, so the two left run on with two replicas of each
    // region (once refused: the bank never resumed) and nothing is
    // re-replicated.
    let d = json(&[
        "txn",
        "--machines",
        "3",
        "--replicas",
        "3",
        "--workload",
        "bank",
        "--keys",
        "40",
        "--fault",
        "machine-crash@20ms:1",
        "--seeds",
        "2",
        "--json",
    ]);
    for r in d["runs"].as_array().unwrap() {
        let t = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {r}"));
        assert!(t("committed_ms") <= t("active_ms"), "{r}");
        assert!(r["rereplicated_ms"].is_null(), "{r}");
        let line = r["timeline"]["committed"].as_array().unwrap();
        let after = line[10 + t("active_ms") as usize + 1..]
            .iter()
            .map(|c| c.as_u64().unwrap())
            .sum::<u64>();
        assert!(after > 0, "{r}");
    }
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("polyline"));
    let _ = std::fs::remove_file(&plot);
}

/// `loch-bench locks`: every variant acquires every lock asked for, on sim
/// and on emu; only handover hands locks over, and a variant without it
/// wins one remote CAS or more per acquisition; the local lock table cuts
/// the remote CAS attempts of a hot lock. Bad variants exit 2.
#[test]
fn locks_compares_the_lock_variants() {
    let out = bench(&[
        "locks",
        "--compute-nodes",
        "2",
        "--threads",
        "3",
        "--coroutines",
        "2",
        "--locks",
        "4",
        "--ops",
        "50",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON array");
    let rows = all.as_array().expect("an array");
    let names: Vec<&str> = rows
        .iter()
        .map(|r| r["variant"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "host",
            "dm",
            "dm+local",
            "dm+local+queue",
            "dm+local+queue+handover"
        ]
    );
    let cas = |r: &serde_json::Value| r["remote_cas_per_acquisition"].as_f64().unwrap();
    for r in rows {
        assert_eq!(r["schema_version"].as_u64(), Some(1));
        assert_eq!(r["acquisitions"].as_u64(), Some(2 * 3 * 2 * 50), "{r}");
        assert!(r["acquisitions_per_sec"].as_f64().unwrap() > 0.0);
        assert!(
            r["latency_ns"]["p99"].as_u64().unwrap() >= r["latency_ns"]["p50"].as_u64().unwrap()
        );
        let handed = r["handed_over"].as_f64().unwrap();
        if r["variant"] == "dm+local+queue+handover" {
            assert!(handed > 0.0, "{r}");
        } else {
            assert_eq!(handed, 0.0, "{r}");
            assert!(cas(r) >= 1.0, "{r}");
        }
    }
    // Four hot locks, twelve clients: the local table, with wait queues
    // or without, leaves one remote spinner per compute node and lock.
    assert!(cas(&rows[2]) < cas(&rows[1]), "{rows:?}");
    assert!(cas(&rows[3]) < cas(&rows[1]), "{rows:?}");
    let emu = bench(&[
        "locks",
        "--backend",
        "emu",
        "--threads",
        "2",
        "--ops",
        "2000",
        "--locks",
        "8",
        "--json",
        "--no-pin",
    ]);
    assert!(
        emu.status.success(),
        "{}",
        String::from_utf8_lossy(&emu.stderr)
    );
    let all: serde_json::Value = serde_json::from_slice(&emu.stdout).expect("a JSON array");
    for r in all.as_array().unwrap() {
        assert_eq!(r["acquisitions"].as_u64(), Some(2 * 2000), "{r}");
    }
    let bad = bench(&["locks", "--variants", "dm,spin"]);
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("unknown lock variant `spin`"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let none = bench(&["locks", "--ops", "0"]);
    assert_eq!(none.status.code(), Some(2));
    let err = String::from_utf8_lossy(&none.stderr);
    assert!(err.contains("--ops must be positive"), "{err}");
    // A hold past the timer horizon (an hour) is bad input, not a run
    // whose every client fails.
    let long = bench(&["locks", "--hold-ns", "3600000000001"]);
    assert_eq!(long.status.code(), Some(2));
    let err = String::from_utf8_lossy(&long.stderr);
    assert!(err.contains("--hold-ns must be at most"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// `loch-bench hash-load`: the table fills past 90% with one client; an
/// insert takes at least its uncontended 4 round trips, more once
/// displacement starts; an update takes 3 at any load; bad input exits
/// 2.
#[test]
fn hash_load_fills_the_table_and_reports_round_trips_per_load_factor() {
    let v = json_doc(&["hash-load", "--capacity", "2048", "--json"]);
    let full = v["full_at_load"].as_f64().unwrap();
    assert!((0.9..=1.0).contains(&full), "{v}");
    assert_eq!(v["slots"].as_u64(), Some(2048));
    let rows = v["buckets"].as_array().unwrap();
    assert_eq!(rows.len(), 20, "{v}");
    let mut inserts = 0;
    for r in rows {
        let mean = r["insert_round_trips_mean"].as_f64().unwrap();
        let p99 = r["insert_round_trips_p99"].as_u64().unwrap();
        assert!(mean >= 4.0 && p99 >= 4, "{r}");
        assert_eq!(r["update_round_trips_p99"].as_u64(), Some(3), "{r}");
        inserts += r["inserts"].as_u64().unwrap();
    }
    assert_eq!(inserts, v["keys"].as_u64().unwrap());
    // Displacement only where the table is nearly full.
    assert_eq!(rows[0]["displacement_moves_max"].as_u64(), Some(0));
    assert!(
        rows[19]["displacement_moves_max"].as_u64().unwrap() > 0,
        "{v}"
    );
    for bad in [
        vec!["hash-load", "--capacity", "0"],
        vec!["hash-load", "--bucket", "0"],
        // Rows of 1e-9 passed and then took days to table.
        vec!["hash-load", "--bucket", "1e-9"],
        vec!["hash-load", "--max-search-buckets", "100000000"],
        vec!["hash-load", "--max-search-buckets", "1"],
        vec!["hash-load", "--memory-nodes", "0"],
        vec!["hash-load", "--capacity", "2048", "--max-capacity", "1000"],
    ] {
        let out = bench(&bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
    }
}

/// `loch-bench hash-load --max-capacity`: the table doubles twice instead
/// of filling up; each growing insert is reported apart, and the table
/// ends full at four times its size.
#[test]
fn hash_load_grows_the_table_online() {
    let v = json_doc(&[
        "hash-load",
        "--capacity",
        "1024",
        "--max-capacity",
        "4096",
        "--json",
    ]);
    assert_eq!(v["slots"].as_u64(), Some(4096), "{v}");
    let growths = v["growths"].as_array().unwrap();
    assert_eq!(growths.len(), 2, "{v}");
    for g in growths {
        assert!(g["at_load"].as_f64().unwrap() >= 0.9, "{g}");
        assert!(g["round_trips"].as_u64().unwrap() > 10, "{g}");
    }
    assert!(v["full_at_load"].as_f64().unwrap() >= 0.9, "{v}");
}

/// `loch-bench hash-grow`: YCSB-A keeps going while the table doubles
/// (a small run: 2 compute nodes x 2 clients), and bad input exits 2.
#[test]
fn hash_grow_measures_ycsb_a_through_a_doubling() {
    let v = json_doc(&[
        "hash-grow",
        "--capacity",
        "2048",
        "--compute-nodes",
        "2",
        "--threads",
        "2",
        "--quiet-ms",
        "2",
        "--json",
    ]);
    assert_eq!(
        v["slots_after"].as_u64(),
        Some(2 * v["slots_before"].as_u64().unwrap())
    );
    assert!(
        v["ycsb_a_ops_per_sec_before"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    assert!(v["ops_during"].as_u64().unwrap() > 100, "{v}");
    // Gets and updates never wait for the growth: none comes near the
    // 46 ms its two phase gaps alone take.
    assert!(
        v["latency_max_ns_during"].as_u64().unwrap() < 1_000_000,
        "{v}"
    );
    // Nine clients on one hot key (zipf 4): its word once kept the split
    // walk from ever moving it, and the insert driving the growth gave up
    // after a million attempts (exit 1).
    let hot = json_doc(&[
        "hash-grow",
        "--capacity",
        "1469",
        "--fill",
        "0.64",
        "--memory-nodes",
        "5",
        "--compute-nodes",
        "3",
        "--threads",
        "3",
        "--zipf",
        "4",
        "--seed",
        "16309",
        "--json",
    ]);
    assert!(
        hot["slots_after"].as_u64().unwrap() > hot["slots_before"].as_u64().unwrap(),
        "{hot}"
    );
    // A low fill and a short quiet period: the inserts take longer than
    // the 100 quiet periods the bench once allowed them (exit 1).
    json_doc(&[
        "hash-grow",
        "--capacity",
        "17363",
        "--fill",
        "0.53",
        "--memory-nodes",
        "4",
        "--compute-nodes",
        "2",
        "--threads",
        "3",
        "--zipf",
        "0.5",
        "--quiet-ms",
        "1",
        "--seed",
        "16877",
        "--json",
    ]);
    for bad in [
        vec!["hash-grow", "--capacity", "10"],
        vec!["hash-grow", "--fill", "1.5"],
        vec!["hash-grow", "--threads", "0"],
        vec!["hash-grow", "--zipf", "1"],
    ] {
        let out = bench(&bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
    }
}

/// `--backend mlx5` on every command that takes a backend: without the
/// feature, bad input
/// naming the build that runs it; with it, on a host without an RDMA
/// device, a failure at once naming the cause; a latency cannot be
/// injected into a real NIC.
#[test]
fn mlx5_commands_say_what_they_need() {
    for cmd in ["verbs", "locks", "run", "txn", "ring"] {
        let out = bench(&[cmd, "--backend", "mlx5", "--device", "mlx5_0"]);
        let err = String::from_utf8_lossy(&out.stderr);
        if cfg!(feature = "mlx5") {
            if std::path::Path::new("/sys/class/infiniband").exists() {
                eprintln!("skipped: this machine has RDMA devices");
                return;
            }
            assert_eq!(out.status.code(), Some(1), "{cmd}: {err}");
            assert!(err.contains("no RDMA device"), "{cmd}: {err}");
        } else {
            assert_eq!(out.status.code(), Some(2), "{cmd}: {err}");
            assert!(
                err.contains("built without the mlx5 feature"),
                "{cmd}: {err}"
            );
            assert!(out.stdout.is_empty());
        }
    }
    // Bad input either way: failures on seeds run on the simulator only;
    // a latency cannot be injected into a real NIC.
    for (args, with_mlx5) in [
        (
            ["txn", "--backend", "mlx5", "--fault", "crash"],
            "--fault runs on --backend sim",
        ),
        (
            ["verbs", "--backend", "mlx5", "--latency-ns", "100"],
            "cannot be injected on a real NIC",
        ),
    ] {
        let out = bench(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        let want = if cfg!(feature = "mlx5") {
            with_mlx5
        } else {
            "built without the mlx5 feature"
        };
        assert!(err.contains(want), "{args:?}: {err}");
    }
    let out = bench(&["run", "--backend", "emu", "--gid-index", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--gid-index is for --backend mlx5"));
}

/// `bench/paper/read_path.sh`'s table from real runs: two rounds of the
/// issue's emu run and of the verbs point, through `table.py read-path`:
/// every round's row, and each figure's median beside its target.
#[test]
fn the_read_path_table_reads_the_runs_it_is_given() {
    let dir = std::env::temp_dir().join(format!("loch-read-path-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = Vec::new();
    for (name, args) in [
        (
            "run",
            &[
                "run",
                "--backend",
                "emu",
                "--threads",
                "1",
                "--workload",
                "ycsb-c",
                "--zipf",
                "0",
                "--records",
                "20000",
                "-D",
                "0.1",
                "--json",
            ][..],
        ),
        (
            "verbs",
            &["verbs", "--depth", "16", "-D", "0.1", "--no-pin", "--json"],
        ),
    ] {
        for round in 0..2 {
            let out = bench(args);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let f = dir.join(format!("{name}-{round}.json"));
            std::fs::write(&f, &out.stdout).unwrap();
            files.push(f);
        }
    }
    let md = dir.join("read_path.md");
    let table = concat!(env!("CARGO_MANIFEST_DIR"), "/paper/table.py");
    let out = Command::new("python3")
        .arg(table)
        .arg("read-path")
        .arg(&md)
        .args(&files)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&md).unwrap();
    assert!(text.contains("2 rounds of `loch-bench run"), "{text}");
    assert!(
        text.contains("\n| 1 | ") && text.contains("\n| 2 | "),
        "{text}"
    );
    for figure in [
        "| Sherman / FG+ lookups per second (item 6) | ≥ 1 | **",
        "| Sherman / BTreeMap lookups per second (item 6) | ≥ 0.5 | **",
        "| CPU ns a verb: one core, 8-byte READ, depth 16, one verb a doorbell (item 7) | ≤ 100 | **",
    ] {
        assert!(text.contains(figure), "{figure}: {text}");
    }
    // A run without its FG+ row is refused, not tabled.
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    let only: Vec<_> = v
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["system"] == "sherman")
        .collect();
    let f = dir.join("sherman-only.json");
    std::fs::write(&f, serde_json::to_vec(&only).unwrap()).unwrap();
    let out = Command::new("python3")
        .arg(table)
        .arg("read-path")
        .arg(dir.join("refused.md"))
        .arg(&f)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs a sherman and an fg row"));
    // An unknown kind, or too few arguments: one usage line, exit 2 (a
    // traceback before).
    for args in [&["reed-path", "x.md", "y.json"][..], &["read-path"][..]] {
        let out = Command::new("python3")
            .arg(table)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.starts_with("table.py: usage:") && err.lines().count() == 1,
            "{err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
