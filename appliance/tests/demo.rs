//! `loch demo` as a user runs it: it boots, works, checks itself and exits 0;
//! bad flags exit 2.

use std::process::Command;

#[test]
fn demo_runs_and_passes_its_checks() {
    let out = Command::new(env!("CARGO_BIN_EXE_loch"))
        .args(["demo", "--seconds", "0.5", "--no-pin"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "operations/s",
        "round trips/op",
        "bytes read/op",
        "latency p50",
        "latency p99",
    ] {
        assert!(stdout.contains(line), "summary lacks {line}: {stdout}");
    }
    assert_eq!(stdout.matches(": ok").count(), 11, "{stdout}");
    assert!(stdout.contains("hash table (Nessie"), "{stdout}");
    assert!(stdout.contains("transactions: a bank of"), "{stdout}");
    assert!(stdout.contains("B+tree"), "{stdout}");
    // Memory nodes and scratch both fall back without huge pages: one
    // warning for the process, not one per allocator.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warned = stderr.lines().filter(|l| l.contains("huge pages")).count();
    assert!(warned <= 1, "{stderr}");
}

/// `loch demo --backend sim` with `args`: its stdout, after asserting exit 0.
fn demo_sim(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_loch"))
        .args(["demo", "--backend", "sim"])
        .args(args)
        .output()
        .unwrap();
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{s}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    s
}

/// The summary's lines without the wall-clock speed: everything else is a
/// function of the seed.
fn seeded_lines(s: &str) -> Vec<String> {
    s.lines()
        .map(|l| match l.find(';') {
            Some(i) if l.starts_with("loch demo summary") => {
                l[..i].to_string() + &l[l.find("trace").unwrap()..]
            }
            _ => l.to_string(),
        })
        .collect()
}

#[test]
fn demo_on_sim_is_deterministic_and_passes_its_checks() {
    let run = || {
        let s = demo_sim(&["--seed", "9", "--seconds", "0.002"]);
        assert_eq!(s.matches(": ok").count(), 11, "{s}");
        assert!(s.contains("SIMULATED"), "{s}");
        assert!(s.contains("committed audits saw the total"), "{s}");
        seeded_lines(&s)
    };
    assert_eq!(run(), run());
}

#[test]
fn demo_refuses_bad_flags_with_exit_2() {
    for args in [
        &["demo", "--cores", "zero"][..],
        &["demo", "--warp"],
        &["teleport"],
        &["demo", "--seconds", "0"],
        &["demo", "--backend", "sim", "--fault", "memory-crash@1ms:5"],
        &["demo", "--backend", "sim", "--fault", "meltdown@1ms:0"],
        &["demo", "--fault", "memory-crash@1ms:0"],
        &["demo", "--fault-seed", "3"],
        // Once a panic (a bulk load's buffer of 2^64 records) and a
        // latency that wrapped to none.
        &["demo", "--tree-records", "18446744073709551615"],
        &["demo", "--latency-ns", "18446744073709551615"],
        &["demo", "--backend", "sim", "--latency-ns", "1000000001"],
        &["demo", "--tree", "btree"],
        &["demo", "--processes", "--tree", "fg++"],
        // Accepted once and then ignored (emu's one compute node; the
        // processes have no transactions phase) or failed as a run
        // (exit 1: the processes' nodes refused txn and leases).
        &["demo", "--compute-nodes", "8"],
        &["demo", "--backend", "sim", "--compute-nodes", "70000"],
        &["demo", "--processes", "--txn-txs", "5"],
        &["demo", "--processes", "--workload", "txn"],
        &["demo", "--processes", "--workload", "leases"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_loch"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// `--key-size` and `--value-size`: the index phases load and check
/// records of those sizes (trees of wider nodes), on emu and on sim, and
/// the summary says which; sizes the indexes do not take, or records this
/// host could not hold, are refused before anything boots.
#[test]
fn demo_runs_its_index_phases_with_wide_records() {
    let emu = Command::new(env!("CARGO_BIN_EXE_loch"))
        .args(["demo", "--seconds", "0.3", "--no-pin", "--txn-txs", "0"])
        .args([
            "--tree-records",
            "3000",
            "--key-size",
            "1024",
            "--value-size",
            "1024",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&emu.stdout);
    assert!(
        emu.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&emu.stderr)
    );
    let sizes = "3000 records loaded (1024-byte keys, 1024-byte values)";
    assert_eq!(stdout.matches(sizes).count(), 2, "{stdout}");
    assert_eq!(stdout.matches("0 mismatches: ok").count(), 3, "{stdout}");
    assert!(!stdout.contains("FAILED"), "{stdout}");
    // A 1 KiB record cannot share a 1 KiB node: the tree split its wider
    // leaves as the tasks inserted their own keys.
    let splits: u64 = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("splits"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .expect("a splits line");
    assert!(splits > 0, "{stdout}");

    let run = || {
        let s = demo_sim(&[
            "--seed",
            "4",
            "--seconds",
            "0.002",
            "--txn-txs",
            "0",
            "--tree-records",
            "2000",
            "--key-size",
            "64",
            "--value-size",
            "200",
        ]);
        assert_eq!(
            s.matches("(64-byte keys, 200-byte values)").count(),
            2,
            "{s}"
        );
        assert!(!s.contains("FAILED"), "{s}");
        seeded_lines(&s)
    };
    assert_eq!(run(), run());

    for (args, says) in [
        (
            &["--key-size", "12"][..],
            "--key-size must be 8 or one of [16, 32, 64, 128, 256, 512, 1024], got 12",
        ),
        (
            &["--value-size", "7"],
            "--value-size: values must be 8 to 1024 bytes, not 7",
        ),
        (&["--key-size", "2048"], "--key-size must be 8 or one of"),
        (
            &[
                "--tree-records",
                "10000000",
                "--key-size",
                "1024",
                "--value-size",
                "1024",
            ],
            "records of 1024-byte keys and 1024-byte values need about",
        ),
        (&["--processes", "--key-size", "24"], "--key-size must be"),
        // --processes sized its memory nodes before checking these (the
        // products wrapped), and left --tasks past 64 to its nodes.
        (
            &["--processes", "--tree-records", "18446744073709551615"],
            "--tree-records must be 1..=10000000",
        ),
        (
            &["--processes", "--tasks", "1000000000000000"],
            "--tasks must be 1..=64",
        ),
        (&["--processes", "--tasks", "65"], "--tasks must be 1..=64"),
        (
            &["--processes", "--cores", "9223372036854775808"],
            "--cores must be 1..=",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_loch"))
            .arg("demo")
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.starts_with("loch demo: ") && err.contains(says),
            "{args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// The verb phase counts its CAS successes in device memory, which the
/// tree phase then uses as its lock table: a word it left nonzero read as
/// a lock held by nobody, and a writer of a node hashed to it waited until
/// the phase gave up ("the tree phase did not finish": 16 seeds in 16
/// with 16-byte keys and 32-byte values). The loader clears the table.
#[test]
fn the_tree_phase_finds_no_lock_the_verb_phase_left() {
    for seed in ["60", "61", "62", "63"] {
        let s = demo_sim(&[
            "--seed",
            seed,
            "--txn-txs",
            "0",
            "--tree-records",
            "1000",
            "--key-size",
            "16",
            "--value-size",
            "32",
        ]);
        assert_eq!(s.matches("0 mismatches: ok").count(), 3, "seed {seed}: {s}");
        assert!(!s.contains("FAILED"), "seed {seed}: {s}");
    }
}

/// Each index phase starts on memory nodes as booted: the hash table's
/// loader clears the chunks the tree phase took. It ran in what the tree
/// left, and with 1 KiB keys and values its puts ran out of chunks on
/// memory sized for one index (64 of them failed with these flags).
#[test]
fn the_hash_phase_gets_the_memory_the_tree_phase_took() {
    let s = demo_sim(&[
        "--seed",
        "1",
        "--txn-txs",
        "0",
        "--memory-nodes",
        "2",
        "--cores",
        "8",
        "--tasks",
        "8",
        "--tree-records",
        "15000",
        "--seconds",
        "0.02",
        "--key-size",
        "1024",
        "--value-size",
        "1024",
    ]);
    assert_index_phases_had_no_failed_operation(&s);
}

/// A tree of 16 KiB nodes (1 KiB keys) splits leaves and their parents
/// within a slot's scratch: an operation holding six nodes still has room
/// for its word-sized verbs. With six nodes' worth alone, a put ran out
/// at the word after them ("task scratch exhausted: 8 bytes requested, 0
/// free") with these flags.
#[test]
fn a_split_of_16_kib_nodes_fits_a_slots_scratch() {
    let s = demo_sim(&[
        "--seed",
        "1",
        "--txn-txs",
        "0",
        "--tree",
        "sherman-2rt",
        "--tree-records",
        "10000",
        "--seconds",
        "0.02",
        "--key-size",
        "1024",
        "--value-size",
        "100",
    ]);
    assert_index_phases_had_no_failed_operation(&s);
}

/// Both index phases of the summary `s` ran, none of their operations
/// failed, and no check failed.
fn assert_index_phases_had_no_failed_operation(s: &str) {
    assert_eq!(
        s.matches("check: failed index operations: 0: ok").count(),
        2,
        "{s}"
    );
    assert!(!s.contains("FAILED"), "{s}");
}

/// `--tree`: the tree phase runs the tree named, here Sherman writing in
/// two round trips, checks itself and replays; the summary names it.
#[test]
fn demo_runs_the_tree_named() {
    let run = || {
        let s = demo_sim(&[
            "--seed",
            "5",
            "--seconds",
            "0.002",
            "--txn-txs",
            "0",
            "--tree-records",
            "3000",
            "--tree",
            "sherman-2rt",
        ]);
        assert!(
            s.contains("  B+tree (sherman-2rt, bulk load) (3000 records"),
            "{s}"
        );
        assert_eq!(s.matches("0 mismatches: ok").count(), 3, "{s}");
        assert!(!s.contains("FAILED"), "{s}");
        seeded_lines(&s)
    };
    assert_eq!(run(), run());
}

/// Faults from the command line: the demo goes on with the tasks that can,
/// counts what failed, keeps the checks that still hold, and replays.
#[test]
fn demo_on_sim_with_faults_goes_on_and_replays() {
    let run = |extra: &[&str]| {
        let mut args = vec!["--seed", "3", "--seconds", "0.002"];
        args.extend(extra);
        demo_sim(&args)
    };
    // Node 1 holds half the CAS words: crashed, they cannot be checked.
    let s = run(&[
        "--fault",
        "memory-crash@1ms:1",
        "--fault",
        "latency-spike@0.5ms:10us/1ms",
    ]);
    let failed: u64 = s
        .lines()
        .find_map(|l| l.trim().strip_prefix("failed operations: "))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no failed-operations line: {s}"));
    assert!(failed > 0, "{s}");
    assert!(
        s.contains("cannot be read (its memory node crashed): skipped"),
        "{s}"
    );
    assert!(s.contains("0 mismatches: ok"), "{s}");
    assert!(!s.contains("FAILED"), "{s}");
    // A compute node crash in the verb phase leaves its tasks unfinished.
    let s = run(&["--fault", "compute-crash@1ms:0"]);
    assert!(s.contains("SIMULATED"), "{s}");
    // The same faults from the same seed: the same run.
    let seeded = ["--fault-seed", "11"];
    assert_eq!(seeded_lines(&run(&seeded)), seeded_lines(&run(&seeded)));
}

#[test]
fn every_command_has_help_and_the_version_names_the_build() {
    let loch = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_loch"))
            .args(args)
            .output()
            .unwrap()
    };
    for (args, usage) in [
        (vec!["--help"], "Usage: loch <COMMAND>"),
        (vec!["demo", "--help"], "Usage: loch demo"),
        (vec!["node", "--help"], "Usage: loch node"),
        (vec!["check", "--help"], "Usage: loch check"),
        (vec!["help", "demo"], "Usage: loch demo"),
    ] {
        let out = loch(&args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains(usage), "{args:?}: {help}");
        assert!(help.contains("Exit codes:"), "{args:?}: {help}");
    }
    let out = loch(&["-V"]);
    assert_eq!(out.status.code(), Some(0));
    let v = String::from_utf8_lossy(&out.stdout);
    let want = format!("loch {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(
        v.starts_with(&want) && v.contains("backends: emu, sim"),
        "{v}"
    );
    // A near miss names the flag meant, in one line.
    let out = loch(&["demo", "--tree-record", "5"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with("loch demo: ") && err.contains("'--tree-records'"),
        "{err}"
    );
}

/// A short `loch demo` on sim, its stdout and stderr piped.
fn short_sim_demo() -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_loch"))
        .args([
            "demo",
            "--backend",
            "sim",
            "--seconds",
            "0.001",
            "--tree-records",
            "2000",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_closed_stdout_ends_the_demo_quietly() {
    // `loch demo --backend sim | head -0`: the reader has left before the
    // summary is printed.
    let mut child = short_sim_demo();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{err}"
    );
}

#[test]
fn a_closed_stderr_ends_the_demo_quietly() {
    use std::process::Stdio;
    // `loch demo ... 2>&1 | head -0`: the progress lines and the warning
    // meet a closed pipe (`eprintln!` panicked there); the run goes on and
    // its summary reaches stdout.
    let mut child = short_sim_demo();
    drop(child.stderr.take());
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("loch demo summary"), "{stdout}");
    // Bad input with nowhere to say it: still exit 2.
    let mut child = Command::new(env!("CARGO_BIN_EXE_loch"))
        .args(["demo", "--key-size", "12"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    assert_eq!(child.wait().unwrap().code(), Some(2));
}

/// Starts `loch` with `args`, sends SIGINT once its stderr says `ready`,
/// and returns its exit code, stdout and how long it took to stop.
fn interrupted(args: &[&str], ready: &str) -> (Option<i32>, String, std::time::Duration) {
    use std::io::{BufRead, BufReader, Read};
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_loch"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while err.read_line(&mut line).unwrap() > 0 && !line.contains(ready) {
        line.clear();
    }
    assert!(line.contains(ready), "never said `{ready}`");
    let t0 = std::time::Instant::now();
    // SAFETY: kill(2) on our own child, not yet waited for.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let drain = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest);
    });
    let out = child.wait_with_output().unwrap();
    let took = t0.elapsed();
    drain.join().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        took,
    )
}

#[test]
fn sigint_stops_the_demo_with_its_summary_and_exit_130() {
    // A 60-second run, stopped at its first progress line.
    let (code, stdout, took) = interrupted(
        &[
            "demo",
            "--seconds",
            "60",
            "--no-pin",
            "--tree-records",
            "2000",
        ],
        "t=1s",
    );
    assert_eq!(code, Some(130), "{stdout}");
    assert!(stdout.starts_with("loch demo summary"), "{stdout}");
    assert!(stdout.contains("0 mismatches: ok"), "{stdout}");
    assert!(!stdout.contains("FAILED"), "{stdout}");
    assert!(took.as_secs() < 10, "took {took:?} to stop");
}

#[test]
fn sigint_to_demo_processes_reaches_its_nodes_and_exits_130() {
    // SIGINT to the launcher alone (as `kill -INT` sends it, not a
    // terminal's Ctrl-C to the group): it passes it on to the compute
    // nodes, which stop; it reads the counters, stops the memory nodes and
    // prints what ran.
    let (code, stdout, took) = interrupted(
        &[
            "demo",
            "--processes",
            "--seconds",
            "60",
            "--no-pin",
            "--workload",
            "verbs",
        ],
        "t=1s",
    );
    assert_eq!(code, Some(130), "{stdout}");
    assert!(stdout.starts_with("loch demo summary"), "{stdout}");
    for check in [
        "FAA counter",
        "every compute node ran and exited 0 (2 results): ok",
        "memory nodes served every run, stopped on SIGTERM and removed their files: ok",
    ] {
        assert!(stdout.contains(check), "{check}: {stdout}");
    }
    assert!(!stdout.contains("FAILED"), "{stdout}");
    assert!(took.as_secs() < 15, "took {took:?} to stop");
}
