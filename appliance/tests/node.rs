//! `loch check`, `loch node` and `loch demo --processes` as a user runs
//! them: exit codes, the lines they print, a multi-process cluster over the
//! control channel, and a memory node killed with SIGKILL mid-run.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LOCH: &str = env!("CARGO_BIN_EXE_loch");

use cluster::processes::{free_ports, wait_until, PrivateDir};
use nicdrv::clock::unix_ns;

/// Writes `text` to `name` in `dir` (0600).
fn write(dir: &PrivateDir, name: &str, text: &str) -> PathBuf {
    dir.write(name, text.as_bytes()).unwrap()
}

/// A cluster file: `memory` memory nodes (ids 0..) then one compute node on
/// CPU 0, on 127.0.0.1 with free ports, plus its secret.
fn cluster(dir: &PrivateDir, memory: usize) -> (PathBuf, Vec<u16>) {
    cluster_of(dir, memory, 1)
}

/// As [`cluster`], with `compute` compute nodes (the k-th on CPU k mod 2).
fn cluster_of(dir: &PrivateDir, memory: usize, compute: usize) -> (PathBuf, Vec<u16>) {
    let roles: Vec<&str> = (0..memory + compute)
        .map(|id| if id < memory { "memory" } else { "compute" })
        .collect();
    cluster_with(dir, &roles)
}

/// A cluster file with a node (ids 0..) per entry of `roles`: "memory",
/// "compute" or "both"; the k-th node that computes on CPU k mod 2.
fn cluster_with(dir: &PrivateDir, roles: &[&str]) -> (PathBuf, Vec<u16>) {
    write(dir, "secret", "0123456789abcdef0123456789abcdef-test");
    let ports = free_ports(roles.len()).unwrap();
    let mut t = String::from(
        "secret_file = \"secret\"\nlock_table_words = 4096\nhuge_pages = false\n[backend]\nkind = \"emu\"\n",
    );
    let mut computing = 0;
    for (id, (port, role)) in ports.iter().zip(roles).enumerate() {
        t += &format!("[[nodes]]\nid = {id}\naddress = \"127.0.0.1:{port}\"\n");
        t += match *role {
            "memory" => "roles = [\"memory\"]\n",
            "compute" => "roles = [\"compute\"]\n",
            _ => "roles = [\"memory\", \"compute\"]\n",
        };
        if *role != "compute" {
            t += "memory = \"16MiB\"\n";
        }
        if *role != "memory" {
            t += &format!("cores = [{}]\n", computing % 2);
            computing += 1;
        }
    }
    (write(dir, "cluster.toml", &t), ports)
}

/// `loch CMD --config FILE ARGS...`, run to its end.
fn loch_on(cmd: &str, file: &Path, args: &[&str]) -> std::process::Output {
    Command::new(LOCH)
        .args([cmd, "--config"])
        .arg(file)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn check_prints_every_check_and_exits_0_or_1() {
    let dir = PrivateDir::new("check").unwrap();
    let (file, _) = cluster(&dir, 2);
    let out = loch_on("check", &file, &["--id", "2"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    for (line, name) in lines
        .iter()
        .zip(["hugepages", "memlock", "cores", "nic", "workload"])
    {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&words[..2], ["node", "2"], "{line}");
        assert!(["ok", "warn", "FAIL"].contains(&words[2]), "{line}");
        assert_eq!(words[3], name, "{line}");
        assert!(words.len() > 4, "no sentence: {line}");
    }
    let failed = stdout.contains(" FAIL ");
    assert_eq!(out.status.code(), Some(i32::from(failed)), "{stdout}");
    // The emu backend needs no NIC.
    assert!(stdout.contains("ok   nic"), "{stdout}");

    // A node the file does not have is bad input: exit 2, said on stderr
    // (check_on_a_bad_config_exits_2_with_one_line has the case).
}

#[test]
fn check_refuses_what_node_would_refuse_memory_too_small_for_the_workload() {
    let dir = PrivateDir::new("small").unwrap();
    let (file, _) = cluster(&dir, 1);
    // 1 MiB cannot hold the verb areas of the cluster's cores.
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("memory = \"16MiB\"", "memory = \"1MiB\"");
    let small = write(&dir, "small.toml", &text);
    let out = loch_on("check", &small, &["--id", "1"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let line = stdout.lines().last().unwrap();
    assert!(
        line.starts_with("node 1 FAIL workload") && line.contains("needs"),
        "{line}"
    );
    // And loch node refuses it the same way, before starting.
    let out = loch_on("node", &small, &["--id", "1", "--seconds", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs"));

    // 16 MiB holds 100,000 records of 8 bytes, not of 1 KiB keys and
    // values (32 KiB leaves of 11 when loaded): both refuse the records
    // before any load runs out of chunks.
    let wide = ["--key-size", "1024", "--value-size", "1024"];
    let fits = loch_on("check", &file, &["--id", "1"]);
    let stdout = String::from_utf8_lossy(&fits.stdout);
    assert!(stdout.contains("ok   workload"), "{stdout}");
    let out = loch_on("check", &file, &[&["--id", "1"][..], &wide].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let line = stdout.lines().last().unwrap();
    assert!(
        line.starts_with("node 1 FAIL workload   100000 records of 1024-byte keys")
            && line.contains("need at least 292 MiB of each of the 1 memory nodes"),
        "{line}"
    );
    let out = loch_on(
        "node",
        &file,
        &[&["--id", "1", "--seconds", "1"][..], &wide].concat(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("need at least 292 MiB"), "{stderr}");
}

/// `loch check` takes every flag of `loch node`, so a line that boots a
/// node checks it with `check` in place of `node`, and the flags that
/// change what fits are counted: each task of the hash table carves a
/// chunk on every memory node.
/// A hash run whose records fit but whose puts' retired entries do not:
/// one node of 16 MiB, 4,000 records of 1 KiB values (2 KiB entries).
/// Its puts wait for retired entries instead of failing (they failed
/// with "every memory node is out of chunks", exit 1, before); twice the
/// records cannot be loaded at all, and both `loch check` and `loch node`
/// say so before loading (the load ran out of chunks, exit 1, before).
#[test]
fn a_hash_run_on_a_full_node_waits_for_entries_and_refuses_what_cannot_load() {
    let dir = PrivateDir::new("hashfull").unwrap();
    let (file, _) = cluster_with(&dir, &["both"]);
    // `loch check` takes every flag of `loch node`.
    let run = |cmd: &str, records: &str| {
        loch_on(
            cmd,
            &file,
            &[
                "--id",
                "0",
                "--workload",
                "hash",
                "--records",
                records,
                "--value-size",
                "1024",
                "--tasks",
                "4",
                "--seconds",
                "1",
                "--no-pin",
            ],
        )
    };
    let out = run("node", "4000");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(json["failures"], 0, "{json}");
    assert_eq!(json["mismatches"], 0, "{json}");
    assert!(json["ops"].as_u64().unwrap() > 1000, "{json}");
    let out = run("node", "8000");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("8000 records of 8-byte keys and 1024-byte values need at least"),
        "{stderr}"
    );
    let check = run("check", "8000");
    let stdout = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FAIL workload"), "{stdout}");
}

#[test]
fn check_takes_the_node_flags_and_counts_the_tasks() {
    let dir = PrivateDir::new("checkflags").unwrap();
    let (file, _) = cluster(&dir, 1);
    let run = [
        "--id",
        "1",
        "--tree",
        "sherman-2rt",
        "--tasks",
        "16",
        "--seconds",
        "5",
        "--seed",
        "3",
        "--no-pin",
    ];
    let out = loch_on("check", &file, &run);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap();
    assert_eq!(
        line,
        "node 1 ok   workload   the memory nodes hold --workload tree --records 100000 --tree sherman-2rt",
        "{stdout}"
    );
    // 8 tasks of the hash table fit 16 MiB, 64 do not (64 chunks of
    // 256 KiB besides the records); `loch node` refuses the same.
    let hash = |tasks: &'static str| ["--id", "1", "--workload", "hash", "--tasks", tasks];
    let out = loch_on("check", &file, &hash("8"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("ok   workload"), "{stdout}");
    let out = loch_on("check", &file, &hash("64"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let line = stdout.lines().last().unwrap();
    assert!(
        line.starts_with("node 1 FAIL workload") && line.contains("run fewer --tasks"),
        "{line}"
    );
    let out = loch_on(
        "node",
        &file,
        &[&hash("64")[..], &["--seconds", "1"]].concat(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("run fewer --tasks"), "{stderr}");
    // `--seconds` bounds the machine workloads' runs too (they once ran
    // for 0 s at -1, and not at all at 1e30), and `--etcd` belongs to
    // them: both refused by either command, naming the flag.
    let long_url = format!("http://{}:2379", "a".repeat(240));
    for cmd in ["check", "node"] {
        for (args, says) in [
            (
                &[
                    "--workload",
                    "leases",
                    "--etcd",
                    "http://127.0.0.1:1",
                    "--seconds",
                    "-1",
                ][..],
                "--seconds must be in (0, 86400], got -1",
            ),
            (
                &[
                    "--workload",
                    "txn",
                    "--etcd",
                    "http://127.0.0.1:1",
                    "--seconds",
                    "1e30",
                ][..],
                "--seconds must be in (0, 86400]",
            ),
            // Flags the machine workloads ignored.
            (
                &["--workload", "txn", "--seconds", "10"][..],
                "--seconds applies to --workload txn with --etcd",
            ),
            (
                &["--workload", "txn", "--tasks", "0"][..],
                "--tasks applies to the verbs, tree and hash workloads, not txn",
            ),
            (
                &["--workload", "leases", "--histogram", "/no/such/h.json"][..],
                "--histogram applies to the verbs, tree and hash workloads, not leases",
            ),
            (&["--workload", "txn", "--no-pin"][..], "--no-pin applies"),
            (
                &["--workload", "txn", "--records", "5"][..],
                "--records applies",
            ),
            (
                &[
                    "--workload",
                    "txn",
                    "--etcd",
                    "http://127.0.0.1:1",
                    "--txs",
                    "5",
                ][..],
                "--txs applies to --workload txn without --etcd",
            ),
            (
                &["--workload", "tree", "--lease-ms", "5"][..],
                "--lease-ms applies to --workload leases and txn --etcd, not tree",
            ),
            (&["--workload", "verbs", "--txs", "5"][..], "--txs applies"),
            (
                &["--workload", "tree", "--etcd", "http://127.0.0.1:1"][..],
                "--etcd applies to --workload txn and leases, not tree",
            ),
            // Every machine sends these flags at "memory-ready"; flags
            // longer than a frame once made every machine panic there.
            (
                &["--workload", "leases", "--etcd", long_url.as_str()][..],
                "the control channel carries at most",
            ),
            (
                &["--workload", "txn", "--etcd", "ftp://127.0.0.1:1"][..],
                "only http:// endpoints",
            ),
        ] {
            let out = loch_on(cmd, &file, &[&["--id", "0"][..], args].concat());
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd} {args:?}: {stderr}");
            assert!(out.stdout.is_empty(), "{cmd} {args:?}");
            assert!(stderr.contains(says), "{cmd} {args:?}: {stderr}");
        }
    }
}

#[test]
fn check_on_a_bad_config_exits_2_with_one_line() {
    let dir = PrivateDir::new("badcfg").unwrap();
    let (good, _) = cluster(&dir, 1);
    let good_text = std::fs::read_to_string(&good).unwrap();
    let cases = [
        ("syntax.toml", "secret_file = \n".to_string(), "line 1"),
        (
            "nosecret.toml",
            good_text.replace("secret_file = \"secret\"\n", ""),
            "secret_file",
        ),
        (
            "unknown.toml",
            good_text.replace("huge_pages", "hugepages"),
            "hugepages",
        ),
        (
            "role.toml",
            good_text.replace("\"compute\"", "\"gpu\""),
            "unknown role",
        ),
        (
            "unitless.toml",
            good_text.replace("memory = \"16MiB\"", "memory = 16"),
            "16 has no unit",
        ),
    ];
    for (name, text, expect) in cases {
        let f = write(&dir, name, &text);
        let out = loch_on("check", &f, &["--id", "0"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(out.stdout.is_empty(), "{name}");
        assert_eq!(stderr.lines().count(), 1, "{name}: {stderr}");
        assert!(
            stderr.contains(name) && stderr.contains(expect),
            "{name}: {stderr}"
        );
    }
    // A secret others can read: refused with the fix.
    std::fs::set_permissions(
        dir.path().join("secret"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let out = loch_on("check", &good, &["--id", "0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("chmod 600"), "{stderr}");
    std::fs::set_permissions(
        dir.path().join("secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    // An id the file does not have: bad input, said on stderr, as `loch node` says it.
    for cmd in ["check", "node"] {
        let out = Command::new(LOCH)
            .args([cmd, "--config"])
            .arg(&good)
            .args(["--id", "7"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {stderr}");
        assert!(out.stdout.is_empty(), "{cmd}");
        assert!(stderr.contains("node 7 is not in"), "{cmd}: {stderr}");
    }
    // A missing file, and a missing flag.
    let out = Command::new(LOCH)
        .args(["check", "--config", "/nonexistent/loch.toml", "--id", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(LOCH)
        .args(["check", "--id", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Summary line `key` → its first number.
fn figure(summary: &str, key: &str) -> f64 {
    let line = summary
        .lines()
        .find(|l| l.trim_start().starts_with(key))
        .unwrap_or_else(|| panic!("no `{key}` in {summary}"));
    line[line.find(key).unwrap() + key.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("bad figure in {line}"))
}

#[test]
fn demo_processes_runs_a_cluster_of_processes_and_passes_its_checks() {
    let t0 = Instant::now();
    let out = Command::new(LOCH)
        .args([
            "demo",
            "--processes",
            "--seconds",
            "1",
            "--tree-records",
            "20000",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        t0.elapsed() < Duration::from_secs(40),
        "took {:?}",
        t0.elapsed()
    );
    // The memory nodes booted once and served every run; the compute
    // nodes went through the control channel once per workload.
    for (id, runs) in [(0, 1), (1, 1), (2, 3), (3, 3)] {
        let joined = format!("loch node {id}: control channel: joined");
        assert_eq!(stderr.matches(&joined).count(), runs, "node {id}: {stderr}");
    }
    assert!(
        stderr.contains("loch node 0: compute run 3 joined"),
        "{stderr}"
    );
    // Verbs: 2 FAA counters + 2 words at offset 0 + mismatches + failures
    // + exits; each index: mismatches + failures + exits; then the memory
    // nodes' teardown.
    assert_eq!(stdout.matches(": ok").count(), 7 + 3 + 3 + 1, "{stdout}");
    for k in 0..2 {
        let null = format!("memory node {k} word at offset 0 is 0: ok");
        assert!(stdout.contains(&null), "{null}: {stdout}");
    }
    assert!(!stdout.contains("FAILED"), "{stdout}");
    assert!(figure(&stdout, "operations ") > 1000.0, "{stdout}");
    assert!(figure(&stdout, "operations/s") > 1000.0, "{stdout}");
    // Every operation is one verb, one round trip.
    assert_eq!(figure(&stdout, "round trips/op"), 1.0, "{stdout}");
    let (p50, p99) = (
        figure(&stdout, "latency p50"),
        figure(&stdout, "latency p99"),
    );
    assert!(p50 > 0.0 && p50 <= p99, "{stdout}");
    let first = figure(&stdout, "time to first op");
    assert!(first > 0.0 && first < 10_000.0, "{stdout}");
    // The index sections, as `loch demo` prints them.
    let tree = section(&stdout, "B+tree (Sherman");
    let hash = section(&stdout, "hash table (Nessie");
    for s in [&tree, &hash] {
        assert!(s.contains("20000 records loaded"), "{s}");
        assert!(figure(s, "operations ") > 1000.0, "{s}");
        let rt = figure(s, "round trips/op");
        assert!((1.0..10.0).contains(&rt), "{s}");
        let (p50, p99) = (figure(s, "latency p50"), figure(s, "latency p99"));
        assert!(p50 > 0.0 && p50 <= p99, "{s}");
        assert!(s.contains(": 0 mismatches: ok"), "{s}");
    }
    let hits = figure(&tree, "cache hit ratio");
    assert!(hits > 0.0 && hits <= 1.0, "{tree}");
}

/// `loch demo --processes` with wide records: every compute node is given
/// the sizes, the memory nodes are sized for them, and the index checks
/// itself as with 8-byte records.
#[test]
fn demo_processes_runs_the_indexes_with_wide_records() {
    // The tree workload as Sherman writing in two round trips: every
    // compute node is given the tree too. All three workloads: the verb
    // mix's nodes are given neither (they would refuse them).
    for (workload, records, title) in [
        ("tree", "4000", "B+tree (sherman-2rt, bulk load)"),
        ("all", "2000", "hash table (Nessie, puts)"),
    ] {
        let out = Command::new(LOCH)
            .args(["demo", "--processes", "--no-pin", "--seconds", "0.5"])
            .args(["--workload", workload, "--tree-records", records])
            .args(["--key-size", "256", "--value-size", "1000"])
            .args(["--tree", "sherman-2rt"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        let says = format!("{title} ({records} records loaded (256-byte keys, 1000-byte values)");
        assert!(stdout.contains(&says), "{stdout}");
        assert!(stdout.contains(": 0 mismatches: ok"), "{stdout}");
        assert!(figure(&stdout, "operations ") > 100.0, "{stdout}");
        assert!(!stdout.contains("FAILED"), "{stdout}");
    }
}

/// The line of `summary` containing `head` and the lines indented under it.
fn section(summary: &str, head: &str) -> String {
    let mut lines = summary.lines().skip_while(|l| !l.contains(head));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no `{head}` in {summary}"));
    let mut out = format!("{first}\n");
    for l in lines.take_while(|l| l.starts_with("    ")) {
        out += l;
        out.push('\n');
    }
    out
}

fn spawn_node(file: &Path, id: u32, extra: &[&str]) -> Child {
    Command::new(LOCH)
        .args(["node", "--config"])
        .arg(file)
        .args(["--id", &id.to_string()])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Kills the children still running when a test fails.
struct Reaper(Vec<Child>);

impl Drop for Reaper {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn a_memory_node_killed_with_sigkill_fails_its_operations_only() {
    let dir = PrivateDir::new("kill").unwrap();
    let (file, ports) = cluster(&dir, 2);
    let node_file = |id: u32| node_file(ports[0], id);
    let mut r = Reaper(vec![
        spawn_node(&file, 0, &[]),
        spawn_node(&file, 1, &[]),
        spawn_node(
            &file,
            2,
            &["--workload", "verbs", "--seconds", "2", "--tasks", "4"],
        ),
    ]);
    // Wait until the compute node runs its workload.
    let stderr = r.0[2].stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let log = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("compute role") {
                let _ = tx.send(());
            }
            all += &line;
            all.push('\n');
        }
        all
    });
    // Read stdout as it comes: the result line may exceed a pipe's buffer.
    let mut stdout = r.0[2].stdout.take().unwrap();
    let result = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
        out
    });
    rx.recv_timeout(Duration::from_secs(15))
        .expect("the compute node never started its workload");
    std::thread::sleep(Duration::from_millis(300));
    let killed_ns = unix_ns();
    r.0[1].kill().unwrap(); // SIGKILL
    let _ = r.0[1].wait();

    let by = Instant::now() + Duration::from_secs(10);
    let status = wait_until(&mut r.0[2], by).expect("the compute node hung after the kill");
    let log = log.join().unwrap();
    let out = result.join().unwrap();
    let json: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("no result line ({e}): {out}\n{log}"));
    assert_eq!(
        status.code(),
        Some(1),
        "failures must show in the exit code\n{log}"
    );
    let per = json["per_node"].as_array().unwrap();
    let (n0, n1) = (&per[0], &per[1]);
    assert_eq!(n1["node"], 1);
    assert!(n1["failures"].as_u64().unwrap() > 0, "{n1}");
    assert_eq!(n1["dead"], true, "{n1}");
    let err = n1["error"].as_str().unwrap();
    assert!(err.contains("memory node 1 is dead"), "{err}");
    assert!(log.contains("memory node 1 is dead"), "{log}");
    // Noticed within a bound of the kill.
    let noticed_ns = n1["first_failure_unix_ns"].as_u64().unwrap();
    assert!(
        noticed_ns >= killed_ns && noticed_ns - killed_ns < 1_000_000_000,
        "noticed {} ms after the kill",
        (noticed_ns as i64 - killed_ns as i64) / 1_000_000
    );
    // Node 0 kept working: no failures, and most of the run came after
    // the kill (~0.3 s of ~2 s), while node 1 only had the first part.
    assert_eq!(n0["failures"], 0, "{n0}");
    let (ops0, ops1) = (n0["ops"].as_u64().unwrap(), n1["ops"].as_u64().unwrap());
    assert!(
        ops0 > 2 * ops1 && ops1 > 0,
        "node 0: {ops0} ops, node 1: {ops1}"
    );
    assert_eq!(json["mismatches"], 0);

    // Node 0 stops on SIGTERM and removes its file; node 1 left a stale one.
    // SAFETY: kill(2) on a child we started and have not reaped.
    unsafe { libc::kill(r.0[0].id() as libc::pid_t, libc::SIGTERM) };
    let s0 = wait_until(&mut r.0[0], Instant::now() + Duration::from_secs(5))
        .expect("memory node 0 ignored SIGTERM");
    assert!(s0.success());
    assert!(!node_file(0).exists());
    assert!(node_file(1).exists(), "a SIGKILLed node cannot clean up");
    let _ = std::fs::remove_file(node_file(1));
}

/// CPU seconds (user + system) a live process has used, from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command name; utime and stime are
    // fields 14 and 15 of the whole line.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / hz
}

#[test]
fn nodes_stop_cleanly_on_signals_and_memory_nodes_stay_idle() {
    let dir = PrivateDir::new("signal").unwrap();
    let (file, _) = cluster(&dir, 1);
    // No --seconds: the compute node runs until a signal.
    let mut r = Reaper(vec![
        spawn_node(&file, 0, &[]),
        spawn_node(&file, 1, &["--workload", "verbs"]),
    ]);
    let stderr = r.0[1].stderr.take().unwrap();
    let mut stdout = r.0[1].stdout.take().unwrap();
    let result = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
        out
    });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("t=1s") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(15))
        .expect("the compute node printed no stats line");
    // SAFETY: kill(2) on a child we started and have not reaped.
    unsafe { libc::kill(r.0[1].id() as libc::pid_t, libc::SIGINT) };
    let s1 = wait_until(&mut r.0[1], Instant::now() + Duration::from_secs(5))
        .expect("the compute node ignored SIGINT");
    assert!(s1.success(), "{s1}");
    let out = result.join().unwrap();
    let json: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert!(json["ops"].as_u64().unwrap() > 0, "{out}");
    assert_eq!(json["failures"], 0);
    assert_eq!(json["mismatches"], 0);
    // The memory node stayed out of the data path while the compute node
    // busy-polled for over a second.
    let cpu = cpu_seconds(r.0[0].id());
    assert!(cpu < 0.25, "memory node used {cpu} CPU seconds");
    // SAFETY: as above.
    unsafe { libc::kill(r.0[0].id() as libc::pid_t, libc::SIGTERM) };
    let s0 = wait_until(&mut r.0[0], Instant::now() + Duration::from_secs(5))
        .expect("the memory node ignored SIGTERM");
    assert!(s0.success(), "{s0}");
}

#[test]
fn node_rejects_bad_input_with_exit_2() {
    let dir = PrivateDir::new("nodebad").unwrap();
    let (file, _) = cluster(&dir, 1);
    let mut runs = Vec::new();
    for args in [
        vec!["node", "--id", "1", "--tasks", "0"],
        vec!["node", "--id", "1", "--seconds", "-1"],
        vec!["node", "--id", "9"],
        vec!["node", "--id", "x"],
        vec!["node", "--id", "1", "--bogus"],
        vec!["node", "--id", "1", "--workload", "btree"],
        vec!["node", "--id", "1", "--records", "0"],
        vec!["node", "--id", "1", "--key-size", "12"],
        vec!["node", "--id", "1", "--value-size", "1025"],
        // Sizes are the index workloads' only.
        vec![
            "node",
            "--id",
            "1",
            "--workload",
            "verbs",
            "--key-size",
            "16",
        ],
        vec![
            "check",
            "--id",
            "1",
            "--workload",
            "txn",
            "--value-size",
            "64",
        ],
        vec!["check", "--id", "1", "--key-size", "0"],
        vec!["node", "--id", "1", "--tree", "sherman-3rt"],
        // The tree is the tree workload's only.
        vec!["node", "--id", "1", "--workload", "hash", "--tree", "fg"],
        // Once found only after the run, when the file was written.
        vec![
            "node",
            "--id",
            "1",
            "--histogram",
            "/nonexistent/dir/h.json",
        ],
        // `loch check` refuses what `loch node` refuses (it once said a
        // cluster held --records 2^64 - 1).
        vec!["check", "--id", "1", "--records", "18446744073709551615"],
        vec!["check", "--id", "1", "--records", "0"],
        vec!["check", "--id", "1", "--tasks", "0"],
        vec!["check", "--id", "1", "--tree", "sherman-3rt"],
        vec![
            "check",
            "--id",
            "1",
            "--histogram",
            "/nonexistent/dir/h.json",
        ],
    ] {
        // Together: a `loch node` in the file tries for 5 s to tell its
        // coordinator, which never starts here.
        let c = Command::new(LOCH)
            .args([args[0], "--config"])
            .arg(&file)
            .args(&args[1..])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        runs.push((args, c));
    }
    for (args, c) in runs {
        let out = c.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        let prefix = format!("loch {}: ", args[0]);
        let lines: Vec<&str> = stderr.lines().collect();
        assert!(lines[0].starts_with(&prefix), "{args:?}: {stderr}");
        // One line naming it; then, from a node of the file (node 1, named
        // once), the telling that nobody heard.
        let told = args[0] == "node" && args[1..3] == ["--id", "1"];
        let after: &[&str] = if told {
            &[
                "is not listening yet",
                "did not listen within 5 s; not told",
            ]
        } else {
            &[]
        };
        assert_eq!(lines.len(), 1 + after.len(), "{args:?}: {stderr}");
        for (line, says) in lines[1..].iter().zip(after) {
            assert!(
                line.starts_with("loch node 1: ") && line.contains(says),
                "{args:?}: {stderr}"
            );
        }
    }
    let mlx5 = std::fs::read_to_string(&file)
        .unwrap()
        .replace("kind = \"emu\"", "kind = \"mlx5\"\ndevice = \"mlx5_0\"");
    let f = write(&dir, "mlx5.toml", &mlx5);
    // This build has no mlx5 feature (the workspace default): one clear
    // sentence saying how to get one, from `loch check` too (it passed
    // what `loch node` then refused).
    for cmd in ["node", "check"] {
        let out = loch_on(cmd, &f, &["--id", "0"]);
        assert_eq!(out.status.code(), Some(2), "{cmd}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("built without the mlx5 feature"),
            "{cmd}"
        );
    }
}

/// A memory node larger than the file system its memory lives in
/// (`/dev/shm`) is refused as it starts, naming it (exit 2); it was made
/// as a sparse file, so the node started, and the loader's writes died of
/// SIGBUS once the file outgrew `/dev/shm`.
#[test]
fn a_memory_node_larger_than_dev_shm_is_refused() {
    // SAFETY: statvfs fills the zeroed struct for a NUL-terminated path.
    let shm = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(c"/dev/shm".as_ptr(), &mut st), 0);
        st.f_blocks as u64 * st.f_frsize as u64
    };
    let mib = (shm >> 20) + 1024;
    let dir = PrivateDir::new("shmfull").unwrap();
    let (file, _) = cluster(&dir, 1);
    let text = std::fs::read_to_string(&file)
        .unwrap()
        .replace("memory = \"16MiB\"", &format!("memory = \"{mib}MiB\""));
    let file = write(&dir, "big.toml", &text);
    let started = Instant::now();
    let out = loch_on("node", &file, &["--id", "0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot reserve") && stderr.contains("/dev/shm cannot hold"),
        "{stderr}"
    );
    // Refused as it started, not after waiting for the compute node.
    assert!(started.elapsed() < Duration::from_secs(20), "{stderr}");
}

/// Collects a child's stderr lines on a thread; `tx` hears of every line
/// that contains `signal`.
fn collect(
    c: &mut Child,
    signal: &'static str,
    tx: std::sync::mpsc::Sender<()>,
) -> std::thread::JoinHandle<String> {
    let stderr = c.stderr.take().unwrap();
    std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains(signal) {
                let _ = tx.send(());
            }
            all += &line;
            all.push('\n');
        }
        all
    })
}

fn read_all(c: &mut Child) -> std::thread::JoinHandle<String> {
    let mut stdout = c.stdout.take().unwrap();
    std::thread::spawn(move || {
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
        out
    })
}

#[test]
fn a_cluster_of_processes_runs_the_tree_workload_and_checks_itself() {
    let dir = PrivateDir::new("tree").unwrap();
    let (file, ports) = cluster_of(&dir, 2, 2);
    let node_file = |id: u32| node_file(ports[0], id);
    let flags = [
        "--workload",
        "tree",
        "--seconds",
        "2",
        "--tasks",
        "4",
        "--records",
        "20000",
        "--no-pin",
    ];
    let mut r = Reaper(vec![
        spawn_node(&file, 0, &[]),
        spawn_node(&file, 1, &[]),
        spawn_node(&file, 2, &flags),
        spawn_node(&file, 3, &flags),
    ]);
    let (tx, _rx) = std::sync::mpsc::channel();
    let logs: Vec<_> = (2..4)
        .map(|i| collect(&mut r.0[i], "", tx.clone()))
        .collect();
    let outs: Vec<_> = (2..4).map(|i| read_all(&mut r.0[i])).collect();
    let by = Instant::now() + Duration::from_secs(30);
    let status: Vec<_> = (2..4)
        .map(|i| wait_until(&mut r.0[i], by).expect("a compute node hung"))
        .collect();
    let logs: Vec<String> = logs.into_iter().map(|h| h.join().unwrap()).collect();
    let outs: Vec<String> = outs.into_iter().map(|h| h.join().unwrap()).collect();
    for (k, ((s, log), out)) in status.iter().zip(&logs).zip(&outs).enumerate() {
        let id = k + 2;
        assert!(s.success(), "node {id}: {s}\n{log}");
        assert!(log.contains("control channel: joined"), "{log}");
        assert!(
            log.contains("compute role: tree workload"),
            "node {id}: {log}"
        );
        // The per-second line carries every figure.
        let stats = log
            .lines()
            .find(|l| l.contains(": t=1s"))
            .unwrap_or_else(|| panic!("node {id}: no stats line\n{log}"));
        for part in ["ops/s", "p50", "p99", "round trips/op", "cache hit ratio"] {
            assert!(stats.contains(part), "{part}: {stats}");
        }
        let json: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or(""))
            .unwrap_or_else(|e| panic!("node {id}: no result line ({e}): {out}\n{log}"));
        assert_eq!(json["workload"], "tree");
        assert_eq!(json["records"], 20000);
        assert_eq!(json["mismatches"], 0, "{log}");
        assert_eq!(json["failures"], 0, "{log}");
        assert_eq!(json["errors"].as_array().map(Vec::len), Some(0), "{log}");
        assert!(json["ops"].as_u64().unwrap() > 1000, "{json}");
        let ratio = json["cache_hit_ratio"].as_f64().unwrap();
        assert!(ratio > 0.0 && ratio <= 1.0, "{ratio}");
        assert!(json["cache_hits"].as_u64().unwrap() > 0);
        // A tree operation is at least one round trip, and with the
        // cache seldom many.
        let rt = json["round_trips_per_op"].as_f64().unwrap();
        assert!((1.0..10.0).contains(&rt), "{rt}");
        // The result line is a summary: percentiles, not the histogram.
        let lat = &json["latency_ns"];
        let q: Vec<u64> = ["p50", "p90", "p99", "p999", "max"]
            .iter()
            .map(|k| lat[k].as_u64().unwrap())
            .collect();
        assert!(q[0] > 0 && q.windows(2).all(|w| w[0] <= w[1]), "{lat}");
        assert_eq!(lat["count"].as_u64(), json["ops"].as_u64(), "{lat}");
        assert!(json.to_string().len() < 1024, "{json}");
    }
    // Only the lowest-id compute node loaded the tree.
    assert!(logs[0].contains("created the B+tree and loaded 20000 records"));
    assert!(!logs[1].contains("created the"), "{}", logs[1]);
    // Clean shutdown: the memory nodes stop on SIGTERM and remove their files.
    for i in 0..2 {
        // SAFETY: kill(2) on a child we started and have not reaped.
        unsafe { libc::kill(r.0[i].id() as libc::pid_t, libc::SIGTERM) };
        let s = wait_until(&mut r.0[i], Instant::now() + Duration::from_secs(5))
            .expect("a memory node ignored SIGTERM");
        assert!(s.success(), "{s}");
        assert!(!node_file(i as u32).exists());
    }
}

#[test]
fn sigterm_ends_a_node_waiting_for_its_peers_within_a_second() {
    let dir = PrivateDir::new("lone").unwrap();
    let (file, ports) = cluster(&dir, 1);
    let node0 = node_file(ports[0], 0);
    // First the memory node (the coordinator) waiting at accept, then,
    // with the coordinator gone, the compute node redialing it.
    for (id, waiting) in [(0u32, "memory role"), (1, "")] {
        let mut r = Reaper(vec![spawn_node(&file, id, &[])]);
        let (tx, rx) = std::sync::mpsc::channel();
        let log = collect(&mut r.0[0], waiting, tx);
        if id == 0 {
            rx.recv_timeout(Duration::from_secs(10))
                .expect("the memory node never started");
        }
        std::thread::sleep(Duration::from_millis(400));
        assert!(r.0[0].try_wait().unwrap().is_none(), "node {id} quit early");
        let t0 = Instant::now();
        // SAFETY: kill(2) on a child we started and have not reaped.
        unsafe { libc::kill(r.0[0].id() as libc::pid_t, libc::SIGTERM) };
        let s = wait_until(&mut r.0[0], t0 + Duration::from_secs(5))
            .unwrap_or_else(|| panic!("node {id} ignored SIGTERM during the rendezvous"));
        let took = t0.elapsed();
        let log = log.join().unwrap();
        assert!(took < Duration::from_secs(1), "node {id} took {took:?}");
        assert_eq!(s.code(), Some(1), "node {id}: {log}");
        assert!(
            log.contains("rendezvous: stopped by SIGINT/SIGTERM while waiting for the other nodes"),
            "node {id}: {log}"
        );
    }
    assert!(!node0.exists(), "the memory node left its file");
}

#[test]
fn a_waiting_node_says_once_a_second_whom_it_waits_for_and_where() {
    let dir = PrivateDir::new("waitmsg").unwrap();
    let (file, ports) = cluster_of(&dir, 1, 2);
    // The coordinator (node 0) alone waits for nodes 1 and 2; node 1
    // alone waits for the coordinator.
    for (id, want) in [
        (
            0u32,
            format!(
                "waiting for nodes 1 (127.0.0.1:{}), 2 (127.0.0.1:{})",
                ports[1], ports[2]
            ),
        ),
        (1, format!("waiting for node 0 (127.0.0.1:{})", ports[0])),
    ] {
        let mut r = Reaper(vec![spawn_node(&file, id, &[])]);
        let (tx, rx) = std::sync::mpsc::channel();
        let log = collect(&mut r.0[0], "waiting for node", tx);
        let t0 = Instant::now();
        rx.recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("node {id} never said whom it waits for"));
        let first = t0.elapsed();
        rx.recv_timeout(Duration::from_secs(5))
            .expect("a second report");
        let between = t0.elapsed() - first;
        // SAFETY: kill(2) on a child we started and have not reaped.
        unsafe { libc::kill(r.0[0].id() as libc::pid_t, libc::SIGTERM) };
        wait_until(&mut r.0[0], Instant::now() + Duration::from_secs(5)).expect("stops");
        let log = log.join().unwrap();
        assert!(log.contains(&want), "node {id}: want `{want}` in\n{log}");
        assert!(
            between >= Duration::from_millis(800) && between <= Duration::from_secs(4),
            "node {id}: reports {between:?} apart"
        );
    }
}

#[test]
fn check_passes_the_shipped_emu_example() {
    let dir = PrivateDir::new("example").unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/emu.toml");
    let text = std::fs::read_to_string(example).unwrap();
    let file = write(&dir, "emu.toml", &text);
    write(&dir, "secret", "0123456789abcdef0123456789abcdef-test");
    for id in ["0", "2"] {
        let out = loch_on("check", &file, &["--id", id]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        // Exit 0, or 1 where this machine lacks something the file asks
        // for (a CPU of `cores`): never bad input.
        assert!(matches!(out.status.code(), Some(0 | 1)), "{id}: {stdout}");
        assert!(
            stdout.contains(&format!("node {id} ok   workload")),
            "{id}: {stdout}"
        );
    }
}

#[test]
fn memory_nodes_serve_one_compute_run_after_another() {
    // Two memory nodes stay up while a compute node runs the B+tree, the
    // hash table, the verb mix and the B+tree again, each a fresh process
    // joining the same memory nodes; every run checks itself.
    let dir = PrivateDir::new("service").unwrap();
    let (file, ports) = cluster_of(&dir, 2, 1);
    let files: Vec<PathBuf> = (0..2).map(|k| node_file(ports[0], k)).collect();
    let mut memory = Reaper(vec![spawn_node(&file, 0, &[]), spawn_node(&file, 1, &[])]);
    let (tx, _rx) = std::sync::mpsc::channel();
    let mem_log = collect(&mut memory.0[0], "", tx);
    for (run, workload) in ["tree", "hash", "verbs", "tree"].iter().enumerate() {
        if run == 3 {
            // As a run killed with locks held leaves them: every word of
            // both nodes' device memory (the tree's lock table) held by
            // a client that is gone. The next run's loader clears them.
            hold_every_device_word(&files);
        }
        let flags = [
            "--seconds",
            "1",
            "--tasks",
            "2",
            "--workload",
            workload,
            "--records",
            "3000",
            "--no-pin",
        ];
        let mut c = Reaper(vec![spawn_node(&file, 2, &flags)]);
        let out = read_all(&mut c.0[0]);
        let (ctx, _crx) = std::sync::mpsc::channel();
        let log = collect(&mut c.0[0], "", ctx);
        let s = wait_until(&mut c.0[0], Instant::now() + Duration::from_secs(60))
            .unwrap_or_else(|| panic!("run {run} ({workload}) hung"));
        let (out, log) = (out.join().unwrap(), log.join().unwrap());
        assert!(s.success(), "run {run} ({workload}): {s}\n{log}");
        let json: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
        assert_eq!(json["workload"], *workload, "{json}");
        assert!(json["ops"].as_u64().unwrap() > 0, "run {run}: {json}");
        assert_eq!(json["mismatches"], 0, "run {run} ({workload}): {json}");
        assert_eq!(json["failures"], 0, "run {run} ({workload}): {json}");
        // The memory nodes are still up for the next run.
        assert!(memory.0.iter_mut().all(|m| m.try_wait().unwrap().is_none()));
        assert!(files.iter().all(|f| f.exists()));
    }
    for m in &memory.0 {
        // SAFETY: kill(2) on a child we started and have not reaped.
        unsafe { libc::kill(m.id() as libc::pid_t, libc::SIGTERM) };
    }
    for (k, m) in memory.0.iter_mut().enumerate() {
        let s = wait_until(m, Instant::now() + Duration::from_secs(5)).expect("memory node stops");
        assert!(s.success(), "memory node {k}: {s}");
    }
    let log = mem_log.join().unwrap();
    assert!(log.contains("serving compute runs"), "{log}");
    assert!(log.contains("compute run 4 joined"), "{log}");
    assert!(
        files.iter().all(|f| !f.exists()),
        "memory node files left behind"
    );
}

/// Runs the verb mix on compute nodes `ids` of `file` at once, node
/// `ids[k]` for `seconds[k]`; asserts each exits 0 having run its time
/// without a failed or mismatched operation, and returns their logs and
/// when each exited. (Every task's verbs reach every memory node: one
/// that left fails them.)
fn verbs_run_of(
    file: &Path,
    ids: &[u32],
    seconds: &[&str],
    run: usize,
) -> (Vec<String>, Vec<Instant>) {
    let flags = |secs| {
        [
            "--seconds",
            secs,
            "--tasks",
            "2",
            "--workload",
            "verbs",
            "--no-pin",
        ]
    };
    let mut c = Reaper(
        ids.iter()
            .zip(seconds)
            .map(|(&id, s)| spawn_node(file, id, &flags(s)))
            .collect(),
    );
    let outs: Vec<_> = c.0.iter_mut().map(read_all).collect();
    let (tx, _rx) = std::sync::mpsc::channel();
    let logs: Vec<_> = c.0.iter_mut().map(|n| collect(n, "", tx.clone())).collect();
    // Every node polled, so each one's exit is timed to 10 ms.
    let by = Instant::now() + Duration::from_secs(60);
    let mut exits: Vec<Option<(std::process::ExitStatus, Instant)>> = vec![None; ids.len()];
    while exits.iter().any(Option::is_none) && Instant::now() < by {
        for (n, e) in c.0.iter_mut().zip(exits.iter_mut()) {
            if e.is_none() {
                *e = n.try_wait().unwrap().map(|s| (s, Instant::now()));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let hung = exits.iter().any(Option::is_none);
    if hung {
        // The logs end only once the hung ones are gone.
        for n in &mut c.0 {
            let _ = n.kill();
        }
    }
    let logs: Vec<String> = logs.into_iter().map(|h| h.join().unwrap()).collect();
    let outs: Vec<String> = outs.into_iter().map(|h| h.join().unwrap()).collect();
    for (k, (e, log)) in exits.iter().zip(&logs).enumerate() {
        let id = ids[k];
        let (s, _) = e.unwrap_or_else(|| panic!("run {run}: node {id} hung\n{log}"));
        assert!(s.success(), "run {run}: node {id}: {s}\n{log}");
        let json: serde_json::Value = serde_json::from_str(outs[k].lines().last().unwrap_or(""))
            .unwrap_or_else(|e| panic!("run {run}: node {id}: no result line ({e})\n{log}"));
        assert_eq!(json["failures"], 0, "run {run}: node {id}: {json}\n{log}");
        assert_eq!(json["mismatches"], 0, "run {run}: node {id}: {json}");
        let secs: f64 = seconds[k].parse().unwrap();
        let ran = json["elapsed_ns"].as_f64().unwrap() / 1e9;
        assert!(ran >= secs * 0.9, "run {run}: node {id} ran {ran} s\n{log}");
    }
    (logs, exits.into_iter().map(|e| e.unwrap().1).collect())
}

/// What a node that both holds memory and computes says when its run
/// ends before the others'.
const KEEPS_MEMORY: &str = "this node's memory stays until every compute node is done";

/// Nodes that both hold memory and compute keep it until every compute
/// node is done ("compute-done"). Node 1 (both roles) ends its run 6 s
/// before node 2 (both) and keeps its memory, so node 2's verbs to it go
/// on succeeding to the end (they failed as a dead node's once it left);
/// node 0, the coordinator, a compute node only, ends its run with node
/// 1 and stays too (the others meet through it: had it left, node 1
/// would have let its memory go), naming node 2 as the one it waits for
/// once 3 s have passed; node 3, a compute node only, leaves
/// when its run ends, which counts as its arrival. Beside a memory-only
/// coordinator, such nodes are served a second run too, each publishing
/// its memory afresh (the coordinator relayed their first run's records
/// as well, which named memory they no longer had).
#[test]
fn nodes_that_hold_memory_and_compute_keep_it_until_every_run_is_done() {
    let dir = PrivateDir::new("shared").unwrap();
    let (file, ports) = cluster_with(&dir, &["compute", "both", "both", "compute"]);
    let files: Vec<PathBuf> = (1..3).map(|k| node_file(ports[0], k)).collect();
    let _cleanup: Vec<RemoveOnDrop> = files.iter().cloned().map(RemoveOnDrop).collect();
    let (logs, exits) = verbs_run_of(&file, &[0, 1, 2, 3], &["1", "1", "7", "1"], 0);
    assert!(
        logs[0].contains("staying until every compute node is done"),
        "{}",
        logs[0]
    );
    // Past the quiet 3 s, the coordinator names the node it waits for.
    assert!(
        logs[0].contains("compute-done: ") && logs[0].contains("still waiting for node 2 ("),
        "{}",
        logs[0]
    );
    assert!(logs[1].contains(KEEPS_MEMORY), "{}", logs[1]);
    // Node 3 did not wait for node 2's run; nodes 0 and 1 did.
    let before_2 = |k: usize| exits[2].saturating_duration_since(exits[k]);
    assert!(
        before_2(3) >= Duration::from_secs(1),
        "{:?}\n{}",
        before_2(3),
        logs[3]
    );
    for k in [0, 1] {
        assert!(
            before_2(k) < Duration::from_millis(500),
            "node {k}: {:?}",
            before_2(k)
        );
    }
    assert!(!logs[3].contains("compute run done;"), "{}", logs[3]);
    assert!(files.iter().all(|f| !f.exists()), "node files left");

    let dir = PrivateDir::new("shared-served").unwrap();
    let (file, ports) = cluster_with(&dir, &["memory", "both", "both"]);
    let files: Vec<PathBuf> = (0..3).map(|k| node_file(ports[0], k)).collect();
    let _cleanup: Vec<RemoveOnDrop> = files.iter().cloned().map(RemoveOnDrop).collect();
    let mut memory = Reaper(vec![spawn_node(&file, 0, &[])]);
    let (tx, _rx) = std::sync::mpsc::channel();
    let mem_log = collect(&mut memory.0[0], "", tx);
    for run in 0..2 {
        let (logs, _) = verbs_run_of(&file, &[1, 2], &["1", "2"], run);
        assert!(logs[0].contains(KEEPS_MEMORY), "{}", logs[0]);
        assert!(files[1..].iter().all(|f| !f.exists()), "node files left");
        assert!(memory.0[0].try_wait().unwrap().is_none());
    }
    // SAFETY: kill(2) on a child we started and have not reaped.
    unsafe { libc::kill(memory.0[0].id() as libc::pid_t, libc::SIGTERM) };
    let s = wait_until(&mut memory.0[0], Instant::now() + Duration::from_secs(5))
        .expect("the memory node stops");
    assert!(s.success(), "{s}");
    let log = mem_log.join().unwrap();
    assert!(log.contains("compute run 2 joined"), "{log}");
    assert!(!files[0].exists());
}

#[test]
fn compute_nodes_given_different_workloads_are_refused_at_the_barrier() {
    refused_at_the_barrier(
        "mismatch",
        &["--workload", "tree"],
        &["--workload", "hash"],
        [
            "node 1: --workload tree --records 100000",
            "node 2: --workload hash --records 100000",
        ],
    );
    // The same index as another tree, or of other record sizes, is
    // another workload too.
    refused_at_the_barrier(
        "mismatch-tree",
        &["--tree", "sherman"],
        &["--tree", "sherman-2rt"],
        [
            "node 1: --workload tree --records 100000",
            "node 2: --workload tree --records 100000 --tree sherman-2rt",
        ],
    );
    refused_at_the_barrier(
        "mismatch-sizes",
        &["--records", "20000", "--key-size", "8"],
        &["--records", "20000", "--key-size", "64"],
        [
            "node 1: --workload tree --records 20000",
            "node 2: --workload tree --records 20000 --key-size 64 --value-size 8",
        ],
    );
}

/// A memory node and two compute nodes, given `one` and `two`: all three
/// exit 2 before anything is loaded, with one line naming who was given
/// what (`says`).
fn refused_at_the_barrier(name: &str, one: &[&str], two: &[&str], says: [&str; 2]) {
    let dir = PrivateDir::new(name).unwrap();
    let (file, _) = cluster_of(&dir, 1, 2);
    let run = ["--seconds", "5", "--no-pin"];
    let mut r = Reaper(vec![
        spawn_node(&file, 0, &[]),
        spawn_node(&file, 1, &[one, &run].concat()),
        spawn_node(&file, 2, &[two, &run].concat()),
    ]);
    let (tx, _rx) = std::sync::mpsc::channel();
    let logs: Vec<_> = (0..3)
        .map(|i| collect(&mut r.0[i], "", tx.clone()))
        .collect();
    let by = Instant::now() + Duration::from_secs(20);
    let codes: Vec<Option<i32>> = (0..3)
        .map(|i| {
            wait_until(&mut r.0[i], by)
                .expect("refused, not hung")
                .code()
        })
        .collect();
    let logs: Vec<String> = logs.into_iter().map(|h| h.join().unwrap()).collect();
    for (id, (code, log)) in codes.iter().zip(&logs).enumerate() {
        // Bad input, said in one line naming who was given what; nothing
        // was loaded or run.
        assert_eq!(*code, Some(2), "node {id}: {log}");
        let line = log
            .lines()
            .find(|l| l.contains("different workloads"))
            .unwrap_or_else(|| panic!("node {id}: {log}"));
        assert!(
            line.contains(says[0]) && line.contains(says[1]),
            "node {id}: {line}"
        );
        assert!(
            !log.contains("compute role:"),
            "node {id} started anyway: {log}"
        );
    }
}

/// A cluster file of `n` machines (both roles; the k-th on CPU k mod 2).
fn machines(dir: &PrivateDir, n: usize) -> PathBuf {
    write(dir, "secret", "0123456789abcdef0123456789abcdef-test");
    let ports = free_ports(n).unwrap();
    let mut t = String::from(
        "secret_file = \"secret\"\nlock_table_words = 4096\nhuge_pages = false\n[backend]\nkind = \"emu\"\n",
    );
    for (id, port) in ports.iter().enumerate() {
        t += &format!(
            "[[nodes]]\nid = {id}\naddress = \"127.0.0.1:{port}\"\nroles = [\"memory\", \"compute\"]\nmemory = \"16MiB\"\ncores = [{}]\n",
            id % 2
        );
    }
    write(dir, "cluster.toml", &t)
}

/// The tests that kill a machine process time leases on a host whose two
/// CPUs four spinning processes already oversubscribe: one at a time, or
/// each other's load starves leases into false suspicions.
fn one_failure_test() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Three machine processes run the bank with `--txs TXS`; with
/// `interrupt`, each gets SIGINT a second after they all started their
/// role. Checks each machine's result line and exit code (0, or 130 when
/// interrupted), node 0's check of the bank, and that they committed.
fn bank_of_three(name: &str, txs: &str, interrupt: bool) {
    let dir = PrivateDir::new(name).unwrap();
    let file = machines(&dir, 3);
    let flags = ["--workload", "txn", "--txs", txs];
    let mut r = Reaper((0..3).map(|i| spawn_node(&file, i, &flags)).collect());
    let (tx, rx) = std::sync::mpsc::channel();
    let logs: Vec<_> = (0..3)
        .map(|i| collect(&mut r.0[i], "machine role: a bank of", tx.clone()))
        .collect();
    let outs: Vec<_> = (0..3).map(|i| read_all(&mut r.0[i])).collect();
    if interrupt {
        for _ in 0..3 {
            rx.recv_timeout(Duration::from_secs(60))
                .expect("a machine never started its role");
        }
        std::thread::sleep(Duration::from_secs(1));
        for c in &r.0 {
            // SAFETY: kill(2) on a child we started and have not reaped.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGINT) };
        }
    }
    let by = Instant::now() + Duration::from_secs(60);
    let status: Vec<_> = (0..3)
        .map(|i| wait_until(&mut r.0[i], by).expect("a machine hung"))
        .collect();
    let logs: Vec<String> = logs.into_iter().map(|h| h.join().unwrap()).collect();
    let outs: Vec<String> = outs.into_iter().map(|h| h.join().unwrap()).collect();
    let mut committed = 0;
    for (id, ((s, log), out)) in status.iter().zip(&logs).zip(&outs).enumerate() {
        let code = if interrupt { 130 } else { 0 };
        assert_eq!(s.code(), Some(code), "machine {id}: {s}\n{log}");
        assert!(log.contains("machine role: a bank of"), "{log}");
        let json: serde_json::Value = serde_json::from_str(out.lines().last().unwrap_or(""))
            .unwrap_or_else(|e| panic!("machine {id}: no result line ({e}): {out}\n{log}"));
        assert_eq!(json["workload"], "txn");
        assert_eq!(json["machine"], id);
        assert_eq!(json["replicas"], 3);
        assert_eq!(json["ok"], true, "{json}");
        assert_eq!(json["bad_audits"], 0, "{json}");
        committed += json["committed"].as_u64().unwrap();
        if id == 0 {
            let bank = &json["bank"];
            assert_eq!(bank["total"], bank["want"], "{json}");
            assert_eq!(bank["negative"], 0);
            assert_eq!(bank["backups_differ"], 0);
        } else {
            assert!(json["bank"].is_null());
        }
    }
    assert!(committed > 0);
    // Every node removed its memory node file.
    let left: Vec<_> = std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .contains(&format!("-p{}-node", ports_of(&file)[0]))
        })
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn machines_in_processes_run_the_bank_and_node_0_checks_it() {
    bank_of_three("txn", "200", false);
}

/// SIGINT to every machine of a bank asked for more transactions than it
/// could run: each ends its transaction in flight and starts no more,
/// node 0 still checks the bank, and each exits 130 (the run was cut
/// short) with its result line.
#[test]
fn machines_in_processes_stop_the_bank_on_sigint_and_still_check_it() {
    bank_of_three("txn-int", "100000000000", true);
}

/// Attaches to running memory nodes by their files and sets every word of
/// their device memory to a lock holder's id.
fn hold_every_device_word(files: &[PathBuf]) {
    use nicdrv::{ExecutorConfig, GlobalAddr, Space};
    let eps = files
        .iter()
        .map(|f| nicdrv::emu::EmuEndpoint::attach(f).unwrap())
        .collect();
    let c = cluster::emu::EmuCluster::attach(eps, nicdrv::emu::EmuConfig::default());
    let mut ex = c.executor(ExecutorConfig::default()).unwrap();
    let held = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let h = held.clone();
    let nodes: Vec<u16> = (0..files.len() as u16).collect();
    ex.spawn(move |ctx| async move {
        for n in nodes {
            let dm = ctx
                .remote_regions(n)
                .iter()
                .filter(|r| r.space == Space::Device)
                .map(|r| r.len)
                .max()
                .unwrap();
            for off in (0..dm).step_by(8) {
                ctx.write(GlobalAddr::device(n, off), &0xdead_u64.to_le_bytes())
                    .await
                    .unwrap();
                h.set(h.get() + 1);
            }
        }
    })
    .unwrap();
    ex.run();
    assert!(held.get() > 0, "no device memory to hold");
}

/// The emu node file of memory node `id` of the cluster whose coordinator
/// (its first node) listens on `port`, as `loch node` names it.
fn node_file(port: u16, id: u32) -> PathBuf {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/dev/shm/loch-u{uid}-p{port}-node{id}"))
}

/// Removes a file when dropped, the test passed or not: a node killed
/// with SIGKILL cannot remove its node file, and one left behind would be
/// taken for its own by a later run whose coordinator got the same port.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The ports of a cluster file's nodes, in order.
fn ports_of(file: &Path) -> Vec<u16> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("address = \"127.0.0.1:"))
        .map(|p| p.trim_end_matches('"').parse().unwrap())
        .collect()
}

#[test]
fn the_txn_workload_refuses_clusters_it_cannot_run_with_exit_2() {
    let dir = PrivateDir::new("txn-bad").unwrap();
    // Memory-only and compute-only nodes: not machines.
    let (file, _) = cluster(&dir, 2);
    let out = loch_on("node", &file, &["--id", "0", "--workload", "txn"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("both roles"), "{err}");
    let file = machines(&dir, 2);
    let out = loch_on(
        "node",
        &file,
        &["--id", "0", "--workload", "txn", "--txs", "0"],
    );
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `loch node --workload leases` on four machine processes with a real
/// etcd (started here on 127.0.0.1, stopped by its pid): SIGKILL one
/// machine, then (in a second cluster) the CM; the others suspect it,
/// store the next configuration in etcd and install it, and the new CM's
/// leases hold to the end. Skips without an etcd binary unless
/// LOCH_REQUIRE_ETCD is set.
#[test]
fn machines_in_processes_reconfigure_through_etcd_when_one_is_killed() {
    let _one = one_failure_test();
    use bootstrap::etcd::{etcd_binary, LocalEtcd};
    if etcd_binary().is_none() {
        assert!(
            std::env::var_os("LOCH_REQUIRE_ETCD").is_none(),
            "LOCH_REQUIRE_ETCD is set and no etcd binary was found"
        );
        eprintln!("skipped: no etcd binary");
        return;
    }
    for victim in [3u32, 0] {
        let etcd = LocalEtcd::start(Duration::from_secs(20)).expect("etcd starts");
        let dir = PrivateDir::new(&format!("leases{victim}")).unwrap();
        let file = machines(&dir, 4);
        let _killed = RemoveOnDrop(node_file(ports_of(&file)[0], victim));
        // Long leases: four processes of two spinning cores each share two
        // CPUs here, beside the other tests of this binary (300 ms let a
        // starved machine be suspected falsely once in CI).
        let flags = [
            "--workload",
            "leases",
            "--etcd",
            etcd.endpoint(),
            "--lease-ms",
            "600",
            "--seconds",
            "6",
        ];
        let mut r = Reaper((0..4).map(|i| spawn_node(&file, i, &flags)).collect());
        let (tx, rx) = std::sync::mpsc::channel();
        let logs: Vec<_> = (0..4)
            .map(|i| collect(&mut r.0[i], "machine role: leases", tx.clone()))
            .collect();
        let outs: Vec<_> = (0..4).map(|i| read_all(&mut r.0[i])).collect();
        for _ in 0..4 {
            rx.recv_timeout(Duration::from_secs(60))
                .expect("every machine starts");
        }
        std::thread::sleep(Duration::from_millis(1500));
        r.0[victim as usize].kill().unwrap();
        let by = Instant::now() + Duration::from_secs(60);
        let status: Vec<_> = (0..4)
            .map(|i| wait_until(&mut r.0[i], by).expect("a machine hung"))
            .collect();
        let logs: Vec<String> = logs.into_iter().map(|h| h.join().unwrap()).collect();
        let outs: Vec<String> = outs.into_iter().map(|h| h.join().unwrap()).collect();
        let want: Vec<u32> = (0..4).filter(|&m| m != victim).collect();
        // Machine 0 stays CM; without it a backup takes over — the first
        // one as a rule (the simulator checks that), another if this
        // oversubscribed host kept the first from its turn.
        let in_etcd = etcd.store(bootstrap::etcd::DEFAULT_KEY).unwrap();
        let c = txn::config::ConfigStore::read(&in_etcd)
            .unwrap()
            .unwrap()
            .config;
        let cm = c.cm as usize;
        assert_eq!(c.id, 2, "{c:?}");
        if victim != 0 {
            assert_eq!(cm, 0);
        }
        assert_ne!(cm, victim as usize);
        let mut stored = 0;
        for id in want.iter().map(|&m| m as usize) {
            assert!(
                status[id].success(),
                "machine {id}: {}\n{}",
                status[id],
                logs[id]
            );
            let json: serde_json::Value =
                serde_json::from_str(outs[id].lines().last().unwrap_or("")).unwrap_or_else(|e| {
                    panic!(
                        "machine {id}: no result line ({e}): {}\n{}",
                        outs[id], logs[id]
                    )
                });
            assert_eq!(json["workload"], "leases");
            assert_eq!(json["ok"], true, "{json}");
            assert_eq!(json["config"], 2, "machine {id}: {json}\n{}", logs[id]);
            assert_eq!(json["cm"], cm, "{json}");
            assert_eq!(json["machines"], serde_json::json!(want), "{json}");
            assert_eq!(json["removed"], false);
            let events = json["events"].as_array().unwrap();
            let has = |name: &str| events.iter().any(|e| e["event"] == name);
            if id == cm {
                assert!(has("stored") && has("committed"), "{json}");
                stored += 1;
            } else {
                assert!(has("applied") && has("commit-seen"), "{json}");
            }
            // No lease ran out under the new configuration.
            let late: Vec<_> = json["suspicions"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| s["config"] == 2)
                .collect();
            assert!(late.is_empty(), "machine {id}: {json}");
        }
        assert_eq!(stored, 1);
    }
}

/// `loch node --workload txn --etcd`: four machine processes run the bank
/// with FaRM's failure handling; SIGKILL one under load (a machine, then in
/// a second cluster the CM) and the others reconfigure through etcd,
/// recover the transactions it cut off and go on committing: every audit
/// each survivor committed saw the bank's total. In a third cluster, of
/// three machines, every machine holds a replica of every region: the two
/// left run on with two replicas of each.
#[test]
fn machines_in_processes_recover_transactions_when_one_is_killed() {
    let _one = one_failure_test();
    use bootstrap::etcd::{etcd_binary, LocalEtcd};
    if etcd_binary().is_none() {
        assert!(
            std::env::var_os("LOCH_REQUIRE_ETCD").is_none(),
            "LOCH_REQUIRE_ETCD is set and no etcd binary was found"
        );
        eprintln!("skipped: no etcd binary");
        return;
    }
    for (n, victim) in [(4usize, 3u32), (4, 0), (3, 1)] {
        let etcd = LocalEtcd::start(Duration::from_secs(20)).expect("etcd starts");
        let dir = PrivateDir::new(&format!("recover{n}.{victim}")).unwrap();
        let file = machines(&dir, n);
        let _killed = RemoveOnDrop(node_file(ports_of(&file)[0], victim));
        // Long leases: four processes of four spinning threads each share
        // two CPUs here, beside the other tests' processes.
        let flags = [
            "--workload",
            "txn",
            "--etcd",
            etcd.endpoint(),
            "--lease-ms",
            "1000",
            "--seconds",
            "9",
        ];
        let mut r = Reaper(
            (0..n)
                .map(|i| spawn_node(&file, i as u32, &flags))
                .collect(),
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let logs: Vec<_> = (0..n)
            .map(|i| collect(&mut r.0[i], "machine role: a bank", tx.clone()))
            .collect();
        let outs: Vec<_> = (0..n).map(|i| read_all(&mut r.0[i])).collect();
        for _ in 0..n {
            rx.recv_timeout(Duration::from_secs(60))
                .expect("every machine starts");
        }
        std::thread::sleep(Duration::from_millis(2500));
        let killed_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
            * 1e3;
        r.0[victim as usize].kill().unwrap();
        let by = Instant::now() + Duration::from_secs(90);
        let status: Vec<_> = (0..n)
            .map(|i| wait_until(&mut r.0[i], by).expect("a machine hung"))
            .collect();
        let logs: Vec<String> = logs.into_iter().map(|h| h.join().unwrap()).collect();
        let outs: Vec<String> = outs.into_iter().map(|h| h.join().unwrap()).collect();
        let in_etcd = etcd.store(bootstrap::etcd::DEFAULT_KEY).unwrap();
        let c = txn::config::ConfigStore::read(&in_etcd)
            .unwrap()
            .unwrap()
            .config;
        assert_eq!(c.id, 2, "{c:?}");
        assert!(!c.contains(victim as u16), "{c:?}");
        let mut after = 0;
        let mut owned = 0;
        for id in (0..n).filter(|&m| m != victim as usize) {
            let json: serde_json::Value =
                serde_json::from_str(outs[id].lines().last().unwrap_or("")).unwrap_or_else(|e| {
                    panic!(
                        "machine {id}: no result line ({e}): {}\n{}",
                        outs[id], logs[id]
                    )
                });
            assert!(
                status[id].success(),
                "machine {id}: {}\n{json}\n{}",
                status[id],
                logs[id]
            );
            assert_eq!(json["ok"], true, "{json}");
            assert_eq!(json["config"], 2, "machine {id}: {json}");
            assert_eq!(json["bad_audits"], 0, "{json}");
            assert!(json["audits"].as_u64().unwrap() > 0, "{json}");
            // Its accounts' copies on the other survivors agree with it,
            // re-replicated: three copies of each again (of three
            // machines, the two copies left).
            let copies = &json["copies"];
            assert_eq!(copies["differ"], 0, "machine {id}: {json}");
            let primaries = copies["primaries"].as_u64().unwrap();
            let backups = if n == 4 { 2 } else { 1 };
            assert_eq!(
                copies["backups"].as_u64(),
                Some(backups * primaries),
                "{json}"
            );
            let short = if n == 4 { vec![] } else { vec![0, 1, 2] };
            assert_eq!(json["short_of_backups"], serde_json::json!(short), "{json}");
            owned += primaries;
            let t = &json["timeline"];
            let start = t["unix_ms"].as_f64().unwrap();
            let buckets = t["committed"].as_array().unwrap();
            // Commits after the kill, once a lease has run out and the old
            // leases after it (3 s): the cluster went on.
            let from = ((killed_unix_ms - start) / 10.0) as usize + 300;
            after += buckets
                .iter()
                .skip(from)
                .map(|b| b.as_u64().unwrap())
                .sum::<u64>();
        }
        assert!(after > 0, "nothing committed 3 s after the kill");
        // Every account has its primary on exactly one survivor.
        assert_eq!(owned, appliance::demo_txn::ACCOUNTS);
    }
}

/// A node that refuses its flags (clap's refusal or its own) tells the
/// others why, and they fail at once naming it, rather than waiting out
/// their 30 s join timeout: a compute node tells the coordinator, which
/// passes it on; a coordinator tells the nodes that wait for it as they
/// join.
#[test]
fn a_node_that_refuses_its_flags_tells_the_others_why() {
    let dir = PrivateDir::new("refusal").unwrap();
    let (file, _) = cluster_of(&dir, 1, 2);
    let run = ["--seconds", "5", "--no-pin"];
    // (the refusing node, its flag, what it says, whether it starts
    // before the others rather than once they wait for it)
    for (late, bad, says, first) in [
        (2u32, ["--records", "0"], "--records must be 1..=", false),
        // clap's own refusal, before the node's options are read.
        (
            1,
            ["--tasks", "lots"],
            "invalid value 'lots' for '--tasks <N>': invalid digit found in string",
            false,
        ),
        (
            0,
            ["--seconds", "-1"],
            "--seconds must be in (0, 86400], got -1",
            false,
        ),
        // Refused before the coordinator listens: told once it does.
        (2, ["--tasks", "0"], "--tasks must be 1..=64", true),
    ] {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut r = Reaper(Vec::new());
        let mut logs = Vec::new();
        // Each flag once: one given twice is clap's error, before the
        // cluster file is read.
        let flags = if late == 0 {
            bad.to_vec()
        } else {
            [&run[..], &bad[..]].concat()
        };
        let others = |signal: &'static str, r: &mut Reaper, logs: &mut Vec<_>| {
            for id in (0..3u32).filter(|&i| i != late) {
                let extra: &[&str] = if id == 0 { &[] } else { &run };
                let mut c = spawn_node(&file, id, extra);
                logs.push((id, collect(&mut c, signal, tx.clone())));
                r.0.push(c);
            }
        };
        let t0 = if first {
            // The refusing node, then the others once it waits for the
            // coordinator.
            let mut c = spawn_node(&file, late, &flags);
            logs.push((late, collect(&mut c, "is not listening yet", tx.clone())));
            r.0.push(c);
            rx.recv_timeout(Duration::from_secs(10))
                .expect("the refusing node waits for the coordinator");
            let t0 = Instant::now();
            others("", &mut r, &mut logs);
            t0
        } else {
            // Every node but the refusing one, then the refusing one once
            // the others wait for it.
            others("waiting for node", &mut r, &mut logs);
            rx.recv_timeout(Duration::from_secs(10))
                .expect("the others wait for the late node");
            let t0 = Instant::now();
            let mut c = spawn_node(&file, late, &flags);
            logs.push((late, collect(&mut c, "", tx.clone())));
            r.0.push(c);
            t0
        };
        let by = t0 + Duration::from_secs(20);
        let codes: Vec<Option<Option<i32>>> =
            r.0.iter_mut()
                .map(|c| wait_until(c, by).map(|s| s.code()))
                .collect();
        let took = t0.elapsed();
        for c in &mut r.0 {
            let _ = c.kill();
        }
        for ((id, log), code) in logs.into_iter().zip(codes) {
            let log = log.join().unwrap();
            let Some(code) = code else {
                panic!("node {id} still ran after 20 s:\n{log}")
            };
            if id == late {
                assert_eq!(code, Some(2), "node {id}: {log}");
                assert!(log.starts_with(&format!("loch node: {says}")), "{log}");
                let told = if late == 0 {
                    "loch node 0: told every other node"
                } else {
                    "told the coordinator, node 0, why"
                };
                assert!(log.contains(told), "node {id}: {log}");
            } else {
                let want = format!("node {late} withdrew from the run: {says}");
                assert_eq!(code, Some(1), "node {id}: {log}");
                assert!(log.contains(&want), "node {id}: want `{want}` in\n{log}");
            }
        }
        // Well inside the 30 s the others waited before.
        assert!(took < Duration::from_secs(20), "{took:?}");
    }
}
