//! Cluster-file validation: accepted files parse to what they say; each
//! rejected file gives the promised file, field and problem; the fields
//! the parser takes are those `docs/cluster-file.md` names.

mod common;

use std::path::{Path, PathBuf};

use bootstrap::config::{parse_size, Backend, ClusterConfig, HugePages};
use common::{scratch, write_mode, Scratch};

const GOOD: &str = r#"
secret_file = "secret"
lock_table_words = 4096
huge_pages = 512

[backend]
kind = "mlx5"
device = "mlx5_0"
port = 1

[[nodes]]
id = 2
roles = ["compute"]
address = "127.0.0.1:7002"
cores = [4, 5]

[[nodes]]
id = 0
roles = ["memory", "compute"]
address = "127.0.0.1:7000"
cores = [2, 3]
memory = "256MiB"

[[nodes]]
id = 1
roles = ["memory"]
address = "127.0.0.1:7001"
memory = "1 GiB"
"#;

/// Writes `text` as `cluster.toml` beside a good secret (mode 0600); the
/// directory lives as long as the returned guard.
fn setup(name: &str, text: &str) -> (Scratch, PathBuf) {
    let dir = scratch(name);
    write_mode(&dir.join("secret"), &[7u8; 32], 0o600);
    let file = dir.join("cluster.toml");
    std::fs::write(&file, text).unwrap();
    (dir, file)
}

/// Loads `text` and returns the error, which must name the file.
fn reject(name: &str, text: &str) -> (String, String) {
    let (_dir, file) = setup(name, text);
    let e = ClusterConfig::load(&file).expect_err("config must be rejected");
    assert_eq!(e.file, file);
    let shown = e.to_string();
    assert!(
        shown.contains("cluster.toml"),
        "message names the file: {shown}"
    );
    (e.field, e.problem)
}

#[test]
fn good_file_parses_to_what_it_says() {
    let (_dir, file) = setup("good", GOOD);
    let c = ClusterConfig::load(&file).unwrap();
    assert_eq!(
        c.nodes.iter().map(|n| n.id).collect::<Vec<_>>(),
        vec![0, 1, 2],
        "sorted by id"
    );
    assert_eq!(c.nodes[0].memory_bytes, 256 << 20);
    assert_eq!(c.nodes[1].memory_bytes, 1 << 30);
    assert_eq!(c.nodes[2].memory_bytes, 0);
    assert!(c.nodes[0].roles.memory && c.nodes[0].roles.compute);
    assert!(!c.nodes[1].roles.compute);
    assert_eq!(c.nodes[0].cores, vec![2, 3]);
    assert_eq!(
        c.backend,
        Backend::Mlx5 {
            device: "mlx5_0".into(),
            port: 1,
            gid_index: 0,
            traffic_class: 0
        },
        "gid_index and traffic_class are 0 when left out"
    );
    assert_eq!(c.huge_pages, HugePages::Count(512));
    assert_eq!(c.lock_table_words, 4096);
    assert_eq!(c.secret_file, file.parent().unwrap().join("secret"));
    assert_eq!(c.coordinator().id, 0);
    let s = c.secret().unwrap();
    assert_eq!(
        format!("{s:?}"),
        "ClusterSecret(<32 bytes>)",
        "Debug never shows the secret"
    );
}

#[test]
fn emu_backend_and_boolean_huge_pages() {
    let text = GOOD
        .replace(
            "kind = \"mlx5\"\ndevice = \"mlx5_0\"\nport = 1",
            "kind = \"emu\"",
        )
        .replace("huge_pages = 512", "huge_pages = true");
    let (_dir, file) = setup("emu", &text);
    let c = ClusterConfig::load(file).unwrap();
    assert_eq!(c.backend, Backend::Emu);
    assert_eq!(c.huge_pages, HugePages::On);
}

#[test]
fn unknown_top_level_key_is_named() {
    let (field, problem) = reject("unknown-top", &format!("colour = \"blue\"\n{GOOD}"));
    assert_eq!(field, "colour (line 1 column 1)");
    assert!(problem.contains("unknown field `colour`"), "{problem}");
}

#[test]
fn unknown_node_key_is_named() {
    let text = GOOD.replace("cores = [4, 5]", "cores = [4, 5]\nspeed = 9");
    let (field, problem) = reject("unknown-node", &text);
    assert_eq!(field, "nodes[0].speed (line 16 column 1)");
    assert!(problem.contains("unknown field `speed`"), "{problem}");
}

#[test]
fn duplicate_id() {
    let text = GOOD.replace("id = 1\n", "id = 2\n");
    let (field, problem) = reject("dup-id", &text);
    assert_eq!(field, "nodes[2].id");
    assert_eq!(problem, "duplicate node id 2");
}

/// More nodes than a rendezvous holds is refused by the file, not by a
/// panic of the coordinator once it boots; the limit itself parses.
#[test]
fn more_nodes_than_the_rendezvous_holds() {
    let nodes = |n: usize| {
        let mut t = String::from(
            "secret_file = \"secret\"\nlock_table_words = 4096\nhuge_pages = false\n[backend]\nkind = \"emu\"\n[[nodes]]\nid = 0\nroles = [\"memory\"]\naddress = \"127.0.0.1:7000\"\nmemory = \"16MiB\"\n",
        );
        for id in 1..n {
            t += &format!(
                "[[nodes]]\nid = {id}\nroles = [\"compute\"]\naddress = \"127.0.0.1:{}\"\ncores = [0]\n",
                7000 + id
            );
        }
        t
    };
    let max = bootstrap::channel::NODES_MAX;
    let (_dir, file) = setup("at-max", &nodes(max));
    assert_eq!(ClusterConfig::load(&file).unwrap().nodes.len(), max);
    let (field, problem) = reject("past-max", &nodes(max + 1));
    assert_eq!(field, "nodes");
    assert_eq!(
        problem,
        format!(
            "{} nodes; a cluster has at most {max} (the control channel's rendezvous)",
            max + 1
        )
    );
}

#[test]
fn duplicate_address() {
    let text = GOOD.replace("127.0.0.1:7001", "127.0.0.1:7000");
    let (field, problem) = reject("dup-addr", &text);
    assert_eq!(field, "nodes[2].address");
    assert_eq!(problem, "duplicate address 127.0.0.1:7000");
}

#[test]
fn bad_address() {
    for (bad, why) in [
        ("127.0.0.1", "no port"),
        ("127.0.0.1:0", "port must be"),
        (":7000", "no host"),
        ("::1:7000", "brackets"),
        ("host:http", "port must be"),
    ] {
        let text = GOOD.replace("127.0.0.1:7001", bad);
        let (field, problem) = reject("bad-addr", &text);
        assert_eq!(field, "nodes[2].address");
        assert!(problem.contains(why), "{bad}: {problem}");
    }
}

#[test]
fn unknown_role() {
    let text = GOOD.replace(
        "roles = [\"memory\", \"compute\"]",
        "roles = [\"memory\", \"storage\"]",
    );
    let (field, problem) = reject("role", &text);
    assert_eq!(field, "nodes[1].roles[1]");
    assert!(problem.contains("unknown role `storage`"), "{problem}");
}

#[test]
fn zero_memory() {
    let text = GOOD.replace("\"256MiB\"", "\"0MiB\"");
    let (field, problem) = reject("zero", &text);
    assert_eq!(field, "nodes[1].memory");
    assert!(problem.contains("zero"), "{problem}");
}

#[test]
fn unparsable_size() {
    for bad in [
        "\"256MB\"",
        "\"MiB\"",
        "\"-1GiB\"",
        "\"99999999999TiB\"",
        "1.5",
    ] {
        let text = GOOD.replace("\"256MiB\"", bad);
        let (field, problem) = reject("size", &text);
        assert_eq!(field, "nodes[1].memory", "{bad}");
        assert!(
            problem.contains("not a size") || problem.contains("too large"),
            "{bad}: {problem}"
        );
    }
}

#[test]
fn memory_node_without_memory_and_compute_node_with_it() {
    let (field, problem) = reject("no-mem", &GOOD.replace("memory = \"1 GiB\"", ""));
    assert_eq!(field, "nodes[2].memory");
    assert!(problem.starts_with("missing"), "{problem}");
    let (field, problem) = reject(
        "cpu-mem",
        &GOOD.replace("cores = [4, 5]", "cores = [4, 5]\nmemory = \"1MiB\""),
    );
    assert_eq!(field, "nodes[0].memory");
    assert!(problem.contains("only memory nodes"), "{problem}");
}

/// Sizes a memory node cannot export are the file's errors, naming the
/// field (they passed, and the node failed to boot, exit 1).
#[test]
fn memory_and_lock_table_sizes_a_node_cannot_serve() {
    for (bad, says) in [
        ("100000001B", "not a multiple of 8"),
        ("200TiB", "47-bit offset"),
    ] {
        let (field, problem) = reject(
            "odd-mem",
            &GOOD.replace("memory = \"1 GiB\"", &format!("memory = \"{bad}\"")),
        );
        assert_eq!(field, "nodes[2].memory", "{bad}");
        assert!(problem.contains(says), "{bad}: {problem}");
    }
    let (field, problem) = reject(
        "ltw-huge",
        &GOOD.replace(
            "lock_table_words = 4096",
            "lock_table_words = 20000000000000",
        ),
    );
    assert_eq!(field, "lock_table_words");
    assert!(problem.contains("47-bit offset"), "{problem}");
}

#[test]
fn missing_secret_path() {
    let (field, problem) = reject("no-secret", &GOOD.replace("secret_file = \"secret\"", ""));
    assert_eq!(field, "secret_file");
    assert!(problem.starts_with("missing"), "{problem}");
}

#[test]
fn secret_file_missing_short_or_readable_by_others() {
    let (_dir, file) = setup("secret-missing", &GOOD.replace("\"secret\"", "\"nope\""));
    let e = ClusterConfig::load(&file).unwrap_err();
    assert_eq!(e.field, "secret_file");
    assert!(
        e.problem.contains("cannot read") && e.problem.contains("nope"),
        "{}",
        e.problem
    );

    let (_dir, file) = setup("secret-short", GOOD);
    write_mode(&file.parent().unwrap().join("secret"), &[1u8; 31], 0o600);
    let e = ClusterConfig::load(&file).unwrap_err();
    assert_eq!(e.field, "secret_file");
    assert!(
        e.problem.contains("31 bytes") && e.problem.contains("at least 32"),
        "{}",
        e.problem
    );

    // A file far longer than a key (the wrong path given): refused;
    // the longest secret is taken.
    let (_dir, file) = setup("secret-long", GOOD);
    let secret = file.parent().unwrap().join("secret");
    write_mode(&secret, &vec![1u8; 1 << 20], 0o600);
    let e = ClusterConfig::load(&file).unwrap_err();
    assert_eq!(e.field, "secret_file");
    assert!(
        e.problem.contains("more than 4096 bytes") && e.problem.contains("right file"),
        "{}",
        e.problem
    );
    write_mode(&secret, &[1u8; 4096], 0o600);
    assert!(ClusterConfig::load(&file).is_ok());

    for mode in [0o640, 0o604, 0o644] {
        let (_dir, file) = setup("secret-mode", GOOD);
        write_mode(&file.parent().unwrap().join("secret"), &[1u8; 64], mode);
        let e = ClusterConfig::load(&file).unwrap_err();
        assert_eq!(e.field, "secret_file");
        assert!(
            e.problem.contains("group or others") && e.problem.contains("chmod 600"),
            "{}",
            e.problem
        );
    }
}

#[test]
fn backend_errors() {
    let (field, problem) = reject(
        "backend-kind",
        &GOOD.replace("kind = \"mlx5\"", "kind = \"ib\""),
    );
    assert_eq!(field, "backend.kind");
    assert!(problem.contains("unknown backend `ib`"), "{problem}");
    let (field, _) = reject("backend-dev", &GOOD.replace("device = \"mlx5_0\"\n", ""));
    assert_eq!(field, "backend.device");
    let (field, _) = reject("backend-port", &GOOD.replace("port = 1", "port = 300"));
    assert_eq!(field, "backend.port");
    let (field, _) = reject(
        "backend-missing",
        &GOOD.replace(
            "[backend]\nkind = \"mlx5\"\ndevice = \"mlx5_0\"\nport = 1",
            "",
        ),
    );
    assert_eq!(field, "backend");
}

#[test]
fn gid_index_and_traffic_class_are_read_and_malformed_values_are_named() {
    // (field, a good value, the backend it gives, bad values, the words
    // naming a bad one)
    let cases = [
        (
            "gid_index",
            3,
            (3, 0),
            ["256", "-1", "\"three\"", "1.5"],
            "is not a GID table index (0..=255)",
        ),
        (
            "traffic_class",
            106,
            (0, 106),
            ["256", "-1", "\"af31\"", "2.5"],
            "is not a traffic class (0..=255; DSCP << 2)",
        ),
    ];
    for (name, good, (gid_index, traffic_class), bads, says) in cases {
        let (_dir, file) = setup(
            name,
            &GOOD.replace("port = 1", &format!("port = 1\n{name} = {good}")),
        );
        let c = ClusterConfig::load(file).unwrap();
        assert_eq!(
            c.backend,
            Backend::Mlx5 {
                device: "mlx5_0".into(),
                port: 1,
                gid_index,
                traffic_class
            }
        );
        for (i, bad) in bads.into_iter().enumerate() {
            let (field, problem) = reject(
                &format!("{name}-bad-{i}"),
                &GOOD.replace("port = 1", &format!("port = 1\n{name} = {bad}")),
            );
            assert_eq!(field, format!("backend.{name}"), "{bad}");
            assert!(
                problem.contains(&format!("{bad} {says}")),
                "{bad}: {problem}"
            );
        }
        // The emu backend has no GID table and no traffic classes.
        let (field, problem) = reject(
            &format!("{name}-emu"),
            &GOOD.replace(
                "kind = \"mlx5\"\ndevice = \"mlx5_0\"\nport = 1",
                &format!("kind = \"emu\"\n{name} = 1"),
            ),
        );
        assert_eq!(field, "backend");
        assert!(
            problem.contains("gid_index and traffic_class apply only"),
            "{problem}"
        );
    }
}

#[test]
fn other_field_errors() {
    let (field, _) = reject(
        "ltw",
        &GOOD.replace("lock_table_words = 4096", "lock_table_words = 0"),
    );
    assert_eq!(field, "lock_table_words");
    let (field, _) = reject(
        "hp",
        &GOOD.replace("huge_pages = 512", "huge_pages = \"lots\""),
    );
    assert_eq!(field, "huge_pages");
    let (field, problem) = reject(
        "core-dup",
        &GOOD.replace("cores = [4, 5]", "cores = [4, 4]"),
    );
    assert_eq!(field, "nodes[0].cores[1]");
    assert!(problem.contains("twice"), "{problem}");
    let (field, _) = reject("core-neg", &GOOD.replace("cores = [4, 5]", "cores = [-1]"));
    assert_eq!(field, "nodes[0].cores[0]");
    let (field, _) = reject("no-cores", &GOOD.replace("cores = [4, 5]", ""));
    assert_eq!(field, "nodes[0].cores");
}

#[test]
fn syntax_error_gives_the_line() {
    let (field, _) = reject(
        "syntax",
        "secret_file = \"secret\"\nlock_table_words = = 3\n",
    );
    assert!(field.starts_with("line 2"), "{field}");
    let text = GOOD.replace("port = 1", "port = 1\nspeed = 100");
    let (field, _) = reject("backend-key", &text);
    assert_eq!(field, "backend.speed (line 10 column 1)");
}

#[test]
fn missing_file_is_named() {
    let e = ClusterConfig::load("/nonexistent/loch/cluster.toml").unwrap_err();
    assert_eq!(e.file, Path::new("/nonexistent/loch/cluster.toml"));
    assert!(e.problem.contains("cannot read"));
}

#[test]
fn sizes() {
    assert_eq!(parse_size("4096B"), Ok(4096));
    let e = parse_size("4096").unwrap_err();
    assert!(e.contains("no unit") && e.contains("\"4096B\""), "{e}");
    assert_eq!(parse_size("2KiB"), Ok(2048));
    assert_eq!(parse_size(" 3 TiB "), Ok(3 << 40));
    assert!(parse_size("").is_err());
    assert!(parse_size("1e3").is_err());
    assert!(parse_size("18446744073709551615KiB").is_err());
}

#[test]
fn a_size_without_a_unit_is_refused_not_read_as_bytes() {
    for bare in ["memory = 64", "memory = \"64\""] {
        let (field, problem) = reject("unitless", &GOOD.replace("memory = \"1 GiB\"", bare));
        assert_eq!(field, "nodes[2].memory", "{bare}");
        assert!(
            problem.contains("no unit") && problem.contains("\"64MiB\""),
            "{bare}: {problem}"
        );
    }
}

#[test]
fn every_problem_of_a_file_is_reported_in_one_run() {
    let text = GOOD
        .replace("lock_table_words = 4096", "lock_table_words = 0")
        .replace("port = 1", "port = 999")
        .replace("address = \"127.0.0.1:7002\"", "address = \"nowhere\"")
        .replace("roles = [\"memory\"]", "roles = [\"gpu\"]")
        .replace("memory = \"256MiB\"", "memory = 256");
    let (_dir, file) = setup("many", &text);
    let e = ClusterConfig::load(&file).expect_err("five problems");
    let fields: Vec<&str> = std::iter::once(&e)
        .chain(&e.more)
        .map(|e| e.field.as_str())
        .collect();
    assert_eq!(
        fields,
        [
            "lock_table_words",
            "backend.port",
            "nodes[0].address",
            "nodes[1].memory",
            "nodes[2].roles[0]",
        ]
    );
    assert_eq!(e.count(), 5);
    // One line each, every one naming the file.
    let shown = e.to_string();
    assert_eq!(shown.lines().count(), 5, "{shown}");
    assert!(shown.lines().all(|l| l.contains("cluster.toml")), "{shown}");
    // A compute node without cores is one problem; its memory key, which
    // only memory nodes may have, is another.
    let (_dir, file) = setup(
        "two-in-a-node",
        &GOOD.replace("cores = [4, 5]", "cores = []\nmemory = \"1MiB\""),
    );
    let e = ClusterConfig::load(&file).unwrap_err();
    let fields: Vec<&str> = std::iter::once(&e)
        .chain(&e.more)
        .map(|e| e.field.as_str())
        .collect();
    assert_eq!(fields, ["nodes[0].cores", "nodes[0].memory"]);
    // A file with one problem still reports exactly one.
    let (_dir, file) = setup("one", &GOOD.replace("port = 1", "port = 999"));
    assert_eq!(ClusterConfig::load(&file).unwrap_err().count(), 1);
}

#[test]
fn the_shipped_example_files_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for (name, nodes) in [("emu.toml", 4), ("mlx5.toml", 4)] {
        let path = dir.join(name);
        let text = std::fs::read_to_string(&path).unwrap();
        let c = ClusterConfig::parse(&path, &text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.nodes.len(), nodes, "{name}");
        assert!(
            c.nodes.iter().any(|n| n.id == 0 && n.roles.memory),
            "{name}"
        );
    }
}

/// `read_input_at_most` reads a pipe to its end (what a shell's
/// `<(command)` or a piped `/dev/stdin` gives), bounded as a file is; a
/// pipe with nothing in it, a FIFO no writer opened among them, is an
/// error, never a wait; a device is refused. `read_file_at_most` refuses
/// pipes.
#[test]
fn inputs_may_be_pipes_and_files_may_not() {
    use bootstrap::config::{read_file_at_most, read_input_at_most};
    use std::io::Write;
    use std::os::unix::io::FromRawFd;
    // A pipe by its path under /proc/self/fd, its writer closed after
    // `text` (at most a pipe's buffer, so the write never waits).
    let pipe_of = |text: &[u8]| {
        let mut fds = [0i32; 2];
        // SAFETY: `fds` is two writable ints, as pipe(2) needs.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: pipe(2) just opened both; each is owned once, here.
        let (reader, mut writer) = unsafe {
            (
                std::fs::File::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        };
        writer.write_all(text).unwrap();
        drop(writer);
        let path = PathBuf::from(format!("/proc/self/fd/{}", fds[0]));
        (reader, path)
    };
    let (_held, path) = pipe_of(b"twelve bytes");
    assert_eq!(read_input_at_most(&path, 100).unwrap(), b"twelve bytes");
    let (_held, path) = pipe_of(b"twelve bytes");
    // One byte past the bound, for the caller to refuse.
    assert_eq!(read_input_at_most(&path, 5).unwrap(), b"twelve");
    let (_held, path) = pipe_of(b"");
    let e = read_input_at_most(&path, 100).unwrap_err();
    assert!(e.to_string().contains("a pipe with nothing in it"), "{e}");
    let (_held, path) = pipe_of(b"twelve bytes");
    let e = read_file_at_most(&path, 100).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");

    let dir = scratch("pipes");
    let fifo = dir.join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let e = read_input_at_most(&fifo, 100).unwrap_err();
    assert!(e.to_string().contains("a pipe with nothing in it"), "{e}");
    let e = read_input_at_most(Path::new("/dev/zero"), 100).unwrap_err();
    assert!(
        e.to_string().contains("not a regular file or a pipe"),
        "{e}"
    );
    let file = dir.join("file");
    std::fs::write(&file, b"").unwrap();
    assert_eq!(read_input_at_most(&file, 100).unwrap(), b"");
}

/// A path that names no cluster file is an error, not memory read without
/// end (`/dev/zero`) nor a wait without end (a FIFO nobody writes), and
/// neither is a regular file too large; a file of bytes that are not text
/// says so.
#[test]
fn an_endless_or_binary_file_is_not_a_cluster_file() {
    let e = ClusterConfig::load("/dev/zero").unwrap_err();
    assert_eq!(e.field, "(file)");
    assert!(e.problem.contains("not a regular file"), "{}", e.problem);
    let (dir, file) = setup("fifo", GOOD);
    let fifo = dir.join("fifo.toml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let e = ClusterConfig::load(&fifo).unwrap_err();
    assert!(e.problem.contains("not a regular file"), "{}", e.problem);
    let big = dir.join("big.toml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(5 << 20)
        .unwrap();
    let e = ClusterConfig::load(&big).unwrap_err();
    assert!(e.problem.contains("larger than 4096 KiB"), "{}", e.problem);
    drop((dir, file));
    let (_dir, file) = setup("binary", GOOD);
    std::fs::write(&file, [0xffu8, 0xfe, 0x00, 0x80]).unwrap();
    let e = ClusterConfig::load(&file).unwrap_err();
    assert!(e.problem.contains("not UTF-8"), "{}", e.problem);
}

/// `docs/cluster-file.md` names exactly the fields the parser takes, in
/// each of its three tables (the top level, `[backend]`, `[[nodes]]`): an
/// unknown key in each is refused naming the fields expected, and those
/// are the document's, in its table's first column.
#[test]
fn the_document_names_every_field_the_parser_takes() {
    const DOC: &str = include_str!("../../docs/cluster-file.md");
    let mut documented: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    let mut section = None;
    for line in DOC.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            section = match h {
                "Top level" => Some("top"),
                "`[backend]`" => Some("backend"),
                "`[[nodes]]`" => Some("nodes"),
                _ => None,
            };
            continue;
        }
        if let (Some(s), Some(row)) = (section, line.strip_prefix("| `")) {
            let name = row.split('`').next().unwrap();
            // A table names itself as `[backend]`, `[[nodes]]`.
            let name = name.trim_matches(|c| c == '[' || c == ']');
            documented.entry(s).or_default().push(name.to_string());
        }
    }
    for (table, text) in [
        ("top", format!("colour = 1\n{GOOD}")),
        ("backend", GOOD.replace("port = 1", "port = 1\ncolour = 1")),
        (
            "nodes",
            GOOD.replace("cores = [4, 5]", "cores = [4, 5]\ncolour = 1"),
        ),
    ] {
        let (_, problem) = reject(&format!("doc-{table}"), &text);
        let expected = problem
            .split("expected one of ")
            .nth(1)
            .unwrap_or_else(|| panic!("{table}: no fields named: {problem}"));
        let mut taken: Vec<String> = expected
            .split(", ")
            .map(|f| f.trim_matches('`').to_string())
            .collect();
        let mut named = documented.get(table).cloned().unwrap_or_default();
        taken.sort();
        named.sort();
        assert_eq!(
            taken, named,
            "{table}: the parser's fields against docs/cluster-file.md's"
        );
    }
}
