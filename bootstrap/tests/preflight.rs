//! Preflight against fake `/proc` and `/sys` trees: each check's status and
//! the fix its sentence names.

mod common;

use std::path::Path;

use bootstrap::config::ClusterConfig;
use bootstrap::preflight::{run, Host, PreflightOptions, Status};
use common::{scratch, Scratch};

fn config(backend: &str, huge_pages: &str) -> ClusterConfig {
    let text = format!(
        r#"
secret_file = "/unused"
lock_table_words = 4096
huge_pages = {huge_pages}
[backend]
{backend}
[[nodes]]
id = 0
roles = ["memory", "compute"]
address = "127.0.0.1:7000"
cores = [2, 3]
memory = "256MiB"
[[nodes]]
id = 1
roles = ["compute"]
address = "127.0.0.1:7001"
cores = [2, 5]
"#
    );
    ClusterConfig::parse(Path::new("cluster.toml"), &text).unwrap()
}

fn put(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// A 4-CPU machine with core 3 isolated and no huge pages reserved.
fn machine(name: &str) -> Scratch {
    let root = scratch(name);
    put(&root, "proc/meminfo", "MemTotal: 1000 kB\nHugePages_Total:       0\nHugePages_Free:        0\nHugepagesize:       2048 kB\n");
    put(&root, "proc/sys/vm/nr_hugepages", "0\n");
    put(&root, "sys/devices/system/cpu/online", "0-3\n");
    put(&root, "sys/devices/system/cpu/isolated", "3\n");
    root
}

const EMU: &str = "kind = \"emu\"";
const MLX5: &str = "kind = \"mlx5\"\ndevice = \"mlx5_0\"\nport = 1";

#[test]
fn huge_pages_missing_says_the_command() {
    let root = machine("hp");
    let host = Host {
        root: root.to_path_buf(),
        memlock_bytes: None,
    };
    let r = run(&config(EMU, "true"), 0, &host, PreflightOptions::default());
    let c = r.check("hugepages").unwrap();
    assert_eq!(c.status, Status::Fail);
    // 256 MiB + 32 KiB of lock table = 129 pages of 2 MiB.
    assert!(
        c.detail.contains("129 huge pages")
            && c.detail
                .contains("echo 129 | sudo tee /proc/sys/vm/nr_hugepages"),
        "{}",
        c.detail
    );
    assert_eq!(
        std::fs::read_to_string(root.join("proc/sys/vm/nr_hugepages")).unwrap(),
        "0\n",
        "not asked to reserve"
    );
    assert!(!r.passed());

    // Asked to reserve: it writes the target; the fake kernel does not
    // grant it, so the check still fails with the command.
    let r = run(
        &config(EMU, "true"),
        0,
        &host,
        PreflightOptions {
            reserve_huge_pages: true,
        },
    );
    assert_eq!(
        std::fs::read_to_string(root.join("proc/sys/vm/nr_hugepages")).unwrap(),
        "129\n"
    );
    assert_eq!(r.check("hugepages").unwrap().status, Status::Fail);

    // Enough free pages: ok; an explicit count is honoured.
    put(
        &root,
        "proc/meminfo",
        "HugePages_Total:     200\nHugePages_Free:      150\nHugepagesize:       2048 kB\n",
    );
    assert_eq!(
        run(&config(EMU, "true"), 0, &host, PreflightOptions::default())
            .check("hugepages")
            .unwrap()
            .status,
        Status::Ok
    );
    assert_eq!(
        run(&config(EMU, "151"), 0, &host, PreflightOptions::default())
            .check("hugepages")
            .unwrap()
            .status,
        Status::Fail
    );
    assert_eq!(
        run(&config(EMU, "false"), 0, &host, PreflightOptions::default())
            .check("hugepages")
            .unwrap()
            .status,
        Status::Ok
    );
}

#[test]
fn memlock_below_what_is_registered() {
    let root = machine("memlock");
    let host = Host {
        root: root.to_path_buf(),
        memlock_bytes: Some(8 << 20),
    };
    let c = run(
        &config(MLX5, "false"),
        0,
        &host,
        PreflightOptions::default(),
    );
    let m = c.check("memlock").unwrap();
    assert_eq!(m.status, Status::Fail);
    assert!(
        m.detail.contains("ulimit -l unlimited")
            && m.detail.contains(&((256u64 << 20) + 4096 * 8).to_string()),
        "{}",
        m.detail
    );
    // The emu backend pins nothing: a warning only.
    assert_eq!(
        run(&config(EMU, "false"), 0, &host, PreflightOptions::default())
            .check("memlock")
            .unwrap()
            .status,
        Status::Warn
    );
    // A compute-only node registers nothing here.
    assert_eq!(
        run(
            &config(MLX5, "false"),
            1,
            &host,
            PreflightOptions::default()
        )
        .check("memlock")
        .unwrap()
        .status,
        Status::Ok
    );
}

#[test]
fn cores_missing_or_not_isolated() {
    let cores_root = machine("cores");
    let host = Host {
        root: cores_root.to_path_buf(),
        memlock_bytes: None,
    };
    let c = run(&config(EMU, "false"), 0, &host, PreflightOptions::default());
    let k = c.check("cores").unwrap();
    assert_eq!(k.status, Status::Warn, "{}", k.detail);
    assert!(k.detail.contains("isolcpus=2 nohz_full=2"), "{}", k.detail);
    assert!(c.passed(), "a warning does not stop the node");

    let k = run(&config(EMU, "false"), 1, &host, PreflightOptions::default());
    let k = k.check("cores").unwrap();
    assert_eq!(k.status, Status::Fail);
    assert!(
        k.detail.contains("cores 5 are not online") && k.detail.contains("0-3"),
        "{}",
        k.detail
    );
}

#[test]
fn nic_absent_wrong_or_down() {
    let root = machine("nic");
    let host = Host {
        root: root.to_path_buf(),
        memlock_bytes: None,
    };
    let nic = |host: &Host| {
        run(&config(MLX5, "false"), 0, host, PreflightOptions::default())
            .check("nic")
            .unwrap()
            .clone()
    };
    let c = nic(&host);
    assert_eq!(c.status, Status::Fail);
    assert!(c.detail.starts_with("no RDMA device"), "{}", c.detail);

    put(
        &root,
        "sys/class/infiniband/mlx5_1/ports/1/state",
        "4: ACTIVE\n",
    );
    let c = nic(&host);
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.detail.contains("mlx5_0 not found (present: mlx5_1)"),
        "{}",
        c.detail
    );

    put(
        &root,
        "sys/class/infiniband/mlx5_0/ports/1/state",
        "1: DOWN\n",
    );
    let c = nic(&host);
    assert_eq!(c.status, Status::Fail);
    assert!(c.detail.contains("`1: DOWN`, not ACTIVE"), "{}", c.detail);

    put(
        &root,
        "sys/class/infiniband/mlx5_0/ports/1/state",
        "4: ACTIVE\n",
    );
    assert_eq!(nic(&host).status, Status::Ok);

    // A RoCE port: the GID at the file's index (0 here) must be there.
    let port = "sys/class/infiniband/mlx5_0/ports/1";
    put(&root, &format!("{port}/link_layer"), "Ethernet\n");
    put(
        &root,
        &format!("{port}/gids/0"),
        "0000:0000:0000:0000:0000:0000:0000:0000\n",
    );
    put(
        &root,
        &format!("{port}/gids/3"),
        "0000:0000:0000:0000:0000:ffff:0a00:0001\n",
    );
    put(&root, &format!("{port}/gid_attrs/types/3"), "RoCE v2\n");
    let c = nic(&host);
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.detail.contains("no GID at index 0") && c.detail.contains("RoCE v2 entries: 3"),
        "{}",
        c.detail
    );
    put(
        &root,
        &format!("{port}/gids/0"),
        "fe80:0000:0000:0000:0a00:00ff:fe00:0001\n",
    );
    put(&root, &format!("{port}/gid_attrs/types/0"), "IB/RoCE v1\n");
    let c = nic(&host);
    assert_eq!(c.status, Status::Warn);
    assert!(c.detail.contains("RoCE v1"), "{}", c.detail);
    put(&root, &format!("{port}/gid_attrs/types/0"), "RoCE v2\n");
    assert_eq!(nic(&host).status, Status::Ok);
    assert_eq!(
        run(&config(EMU, "false"), 0, &host, PreflightOptions::default())
            .check("nic")
            .unwrap()
            .status,
        Status::Ok
    );
}

#[test]
fn unknown_node_and_garbage_sysfs_do_not_panic() {
    let root = machine("garbage");
    put(&root, "proc/meminfo", "HugePages_Total: lots\n\0\u{ffff}");
    put(&root, "sys/devices/system/cpu/online", "3-1,x");
    let host = Host {
        root: root.to_path_buf(),
        memlock_bytes: Some(0),
    };
    let r = run(&config(EMU, "true"), 0, &host, PreflightOptions::default());
    assert_eq!(r.check("hugepages").unwrap().status, Status::Fail);
    assert_eq!(r.check("cores").unwrap().status, Status::Fail);
    let r = run(&config(EMU, "true"), 9, &host, PreflightOptions::default());
    assert_eq!(r.checks.len(), 1);
    assert!(r.checks[0].detail.contains("node 9 is not in cluster.toml"));
    // This very machine: whatever it has, the report is complete.
    let r = run(
        &config(EMU, "false"),
        0,
        &Host::current(),
        PreflightOptions::default(),
    );
    assert_eq!(r.checks.len(), 4, "{r}");
}
