//! Preflight: does this machine fit the node the cluster file describes?
//! (`loch check` prints the report; `loch node` refuses to start on a fail.)
//!
//! Owns the checks of huge pages, the locked-memory limit, the configured
//! cores and the NIC. Promises: every check lands in the [`Report`] as ok,
//! warn or fail with one sentence; a failing sentence says the fix. Nothing
//! here panics on odd `/proc` or `/sys` contents. The only change it ever
//! makes to the machine is reserving huge pages, and only when asked.
//!
//! The machine is read through [`Host`], whose `root` tests point at a fake
//! tree.

use std::fmt;
use std::path::PathBuf;

use crate::config::{Backend, ClusterConfig, HugePages, NodeConfig};
use nicdrv::gids;

/// How we see the machine.
#[derive(Debug, Clone)]
pub struct Host {
    /// Where `proc/` and `sys/` are found: `/` on a real machine.
    pub root: PathBuf,
    /// `RLIMIT_MEMLOCK` soft limit in bytes; `None` when unlimited.
    pub memlock_bytes: Option<u64>,
}

impl Host {
    /// This machine, as the current process sees it.
    pub fn current() -> Host {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit into the valid struct we pass.
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
        let memlock_bytes = if rc != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
            None
        } else {
            #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every target
            Some(lim.rlim_cur as u64)
        };
        Host {
            root: PathBuf::from("/"),
            memlock_bytes,
        }
    }

    fn read(&self, rel: &str) -> std::io::Result<String> {
        std::fs::read_to_string(self.root.join(rel))
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub struct PreflightOptions {
    /// Try to reserve missing huge pages through `/proc/sys/vm/nr_hugepages`.
    pub reserve_huge_pages: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    /// One sentence; for a fail, it ends with the fix.
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub node_id: u32,
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether the node may start (no check failed).
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.checks {
            let s = match c.status {
                Status::Ok => "ok  ",
                Status::Warn => "warn",
                Status::Fail => "FAIL",
            };
            writeln!(f, "node {} {s} {:<10} {}", self.node_id, c.name, c.detail)?;
        }
        Ok(())
    }
}

fn check(name: &'static str, status: Status, detail: String) -> Check {
    Check {
        name,
        status,
        detail,
    }
}

/// Runs every check for node `node_id` of `config` on `host`.
pub fn run(config: &ClusterConfig, node_id: u32, host: &Host, opts: PreflightOptions) -> Report {
    let Some(node) = config.node(node_id) else {
        return Report {
            node_id,
            checks: vec![check(
                "node",
                Status::Fail,
                format!(
                    "node {node_id} is not in {}: pass one of its node ids",
                    config.file.display()
                ),
            )],
        };
    };
    let checks = vec![
        huge_pages(config, node, host, opts),
        memlock(config, node, host),
        cores(node, host),
        nic(config, host),
    ];
    Report { node_id, checks }
}

/// Bytes this node registers with the NIC: its exported memory and, on
/// memory nodes, the host fallback of the lock table.
fn registered_bytes(config: &ClusterConfig, node: &NodeConfig) -> u64 {
    if node.roles.memory {
        node.memory_bytes
            .saturating_add(config.lock_table_words.saturating_mul(8))
    } else {
        0
    }
}

struct MemInfo {
    total: u64,
    free: u64,
    page_bytes: u64,
}

fn meminfo(host: &Host) -> Option<MemInfo> {
    let text = host.read("proc/meminfo").ok()?;
    let field = |key: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        line[key.len()..].split_whitespace().next()?.parse().ok()
    };
    Some(MemInfo {
        total: field("HugePages_Total:")?,
        free: field("HugePages_Free:")?,
        page_bytes: field("Hugepagesize:")?.checked_mul(1024)?,
    })
}

fn huge_pages(
    config: &ClusterConfig,
    node: &NodeConfig,
    host: &Host,
    opts: PreflightOptions,
) -> Check {
    const NAME: &str = "hugepages";
    if config.huge_pages == HugePages::Off {
        return check(
            NAME,
            Status::Ok,
            "not requested (huge_pages = false)".into(),
        );
    }
    let Some(info) = meminfo(host) else {
        return check(
            NAME,
            Status::Fail,
            "cannot read HugePages_Total/Free/Hugepagesize from /proc/meminfo: run on Linux with huge-page support or set huge_pages = false".into(),
        );
    };
    if info.page_bytes == 0 {
        return check(
            NAME,
            Status::Fail,
            "Hugepagesize is 0 in /proc/meminfo: set huge_pages = false".into(),
        );
    }
    let need = match config.huge_pages {
        HugePages::Count(n) => n,
        _ => registered_bytes(config, node).div_ceil(info.page_bytes),
    };
    if need <= info.free {
        return check(
            NAME,
            Status::Ok,
            format!(
                "{need} pages of {} KiB needed, {} free",
                info.page_bytes / 1024,
                info.free
            ),
        );
    }
    let target = info.total.saturating_add(need - info.free);
    if opts.reserve_huge_pages {
        let wrote = std::fs::write(
            host.root.join("proc/sys/vm/nr_hugepages"),
            format!("{target}\n"),
        );
        if let (Ok(()), Some(after)) = (wrote, meminfo(host)) {
            if after.free >= need {
                return check(
                    NAME,
                    Status::Ok,
                    format!(
                        "reserved: nr_hugepages is now {}, {} free, {need} needed",
                        after.total, after.free
                    ),
                );
            }
        }
    }
    check(
        NAME,
        Status::Fail,
        format!(
            "{need} huge pages of {} KiB needed but {} free: run `echo {target} | sudo tee /proc/sys/vm/nr_hugepages` (or boot with hugepages={target})",
            info.page_bytes / 1024,
            info.free
        ),
    )
}

fn memlock(config: &ClusterConfig, node: &NodeConfig, host: &Host) -> Check {
    const NAME: &str = "memlock";
    let need = registered_bytes(config, node);
    match host.memlock_bytes {
        None => check(NAME, Status::Ok, "RLIMIT_MEMLOCK is unlimited".into()),
        Some(limit) if limit >= need => check(
            NAME,
            Status::Ok,
            format!("RLIMIT_MEMLOCK {limit} bytes covers the {need} bytes to register"),
        ),
        Some(limit) => {
            // The emu backend pins nothing; only a real NIC needs the limit.
            let status = if config.backend == Backend::Emu {
                Status::Warn
            } else {
                Status::Fail
            };
            check(
                NAME,
                status,
                format!(
                    "RLIMIT_MEMLOCK is {limit} bytes but node {} registers {need}: run `ulimit -l unlimited` before starting (or set LimitMEMLOCK=infinity / a memlock line in /etc/security/limits.conf)",
                    node.id
                ),
            )
        }
    }
}

/// A Linux cpulist such as `0-3,8,10-11`, kept as ranges so a hostile file
/// cannot make us allocate.
fn parse_cpulist(s: &str) -> Option<Vec<(u32, u32)>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse().ok()?, b.trim().parse().ok()?),
            None => {
                let a = part.trim().parse().ok()?;
                (a, a)
            }
        };
        if a > b {
            return None;
        }
        out.push((a, b));
    }
    Some(out)
}

fn in_list(list: &[(u32, u32)], cpu: u32) -> bool {
    list.iter().any(|&(a, b)| a <= cpu && cpu <= b)
}

fn join(cpus: &[u32]) -> String {
    cpus.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn cores(node: &NodeConfig, host: &Host) -> Check {
    const NAME: &str = "cores";
    if node.cores.is_empty() {
        return check(NAME, Status::Ok, "no cores configured for this node".into());
    }
    let online_text = host
        .read("sys/devices/system/cpu/online")
        .unwrap_or_default();
    let Some(online) = parse_cpulist(&online_text) else {
        return check(
            NAME,
            Status::Fail,
            format!("cannot parse /sys/devices/system/cpu/online (`{}`): run on Linux with sysfs mounted", online_text.trim()),
        );
    };
    let missing: Vec<u32> = node
        .cores
        .iter()
        .copied()
        .filter(|&c| !in_list(&online, c))
        .collect();
    if !missing.is_empty() {
        return check(
            NAME,
            Status::Fail,
            format!(
                "cores {} are not online here (online: {}): change node {}'s cores in the cluster file",
                join(&missing),
                online_text.trim(),
                node.id
            ),
        );
    }
    let isolated = host
        .read("sys/devices/system/cpu/isolated")
        .ok()
        .and_then(|t| parse_cpulist(&t))
        .unwrap_or_default();
    let shared: Vec<u32> = node
        .cores
        .iter()
        .copied()
        .filter(|&c| !in_list(&isolated, c))
        .collect();
    if shared.is_empty() {
        check(
            NAME,
            Status::Ok,
            format!("cores {} exist and are isolated", join(&node.cores)),
        )
    } else {
        let l = join(&shared);
        check(
            NAME,
            Status::Warn,
            format!("cores {l} exist but are not isolated, so the kernel may schedule other work there: boot with `isolcpus={l} nohz_full={l}`"),
        )
    }
}

/// A RoCE port's GID at `index` as sysfs shows it (`ports/<p>/gids/<i>`,
/// all zeros when the entry is empty; `gid_attrs/types/<i>` its RoCE
/// version): a failure for an empty entry (peers could not route to it),
/// a warning for RoCE v1, `None` when it is a RoCE v2 entry or sysfs does
/// not say.
fn roce_gid(host: &Host, ports: &str, device: &str, port: u8, index: u8) -> Option<Check> {
    const NAME: &str = "nic";
    let types = gids::gid_types(&host.root.join("sys/class/infiniband"), device, port);
    let v2: Vec<String> = gids::roce_v2(&types)
        .iter()
        .map(|i| i.to_string())
        .collect();
    let v2 = if v2.is_empty() {
        "none".to_string()
    } else {
        v2.join(", ")
    };
    let gid = host.read(&format!("{ports}/gids/{index}")).ok()?;
    if gid.trim().chars().all(|c| c == '0' || c == ':') {
        return Some(check(
            NAME,
            Status::Fail,
            format!("{device} port {port} has no GID at index {index} (an empty entry: no IP address behind it); its RoCE v2 entries: {v2}: set backend.gid_index to one of them (`show_gids` lists the table)"),
        ));
    }
    gids::is_roce_v1(&types, index).then(|| {
        check(
            NAME,
            Status::Warn,
            format!("{device} port {port} is ACTIVE, but GID index {index} is RoCE v1, which routed fabrics do not carry; its RoCE v2 entries: {v2} (backend.gid_index)"),
        )
    })
}

fn nic(config: &ClusterConfig, host: &Host) -> Check {
    const NAME: &str = "nic";
    let (device, port, gid_index) = match &config.backend {
        Backend::Emu => return check(NAME, Status::Ok, "emu backend: no NIC needed".into()),
        Backend::Mlx5 {
            device,
            port,
            gid_index,
            ..
        } => (device, *port, *gid_index),
    };
    let class = host.root.join("sys/class/infiniband");
    let mut present: Vec<String> = std::fs::read_dir(&class)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    present.sort();
    if present.is_empty() {
        return check(
            NAME,
            Status::Fail,
            "no RDMA device: load the driver (`modprobe mlx5_ib`) and check `ibv_devices`, or use backend kind = \"emu\"".into(),
        );
    }
    if !present.iter().any(|p| p == device) {
        return check(
            NAME,
            Status::Fail,
            format!(
                "RDMA device {device} not found (present: {}): set backend.device to one of them",
                present.join(", ")
            ),
        );
    }
    let state_path = format!("sys/class/infiniband/{device}/ports/{port}/state");
    match host.read(&state_path) {
        Err(_) => check(
            NAME,
            Status::Fail,
            format!("{device} has no port {port}: set backend.port to a port listed under /sys/class/infiniband/{device}/ports"),
        ),
        Ok(state) if state.contains("ACTIVE") => {
            let ports = format!("sys/class/infiniband/{device}/ports/{port}");
            let roce = host
                .read(&format!("{ports}/link_layer"))
                .is_ok_and(|l| l.trim() == "Ethernet");
            if roce {
                if let Some(c) = roce_gid(host, &ports, device, port, gid_index) {
                    return c;
                }
            }
            check(
                NAME,
                Status::Ok,
                // Device-memory size needs verbs (ibv_query_device_ex); the
                // mlx5 backend reports it when it opens the device.
                format!("{device} port {port} is ACTIVE (device-memory size is reported when the backend opens it)"),
            )
        }
        Ok(state) => check(
            NAME,
            Status::Fail,
            format!("{device} port {port} is `{}`, not ACTIVE: check the cable and the subnet manager (`ibstat {device}`)", state.trim()),
        ),
    }
}
