//! What `loch-bench`'s command lines share: the error of bad input, the
//! backend choice, sizes with units and suggestions.
//! Malformed input is an error value (exit code 2 in `main`), never a
//! panic.

use std::fmt;

#[derive(Debug)]
pub struct ArgError(pub String);

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which backend a benchmark runs on (case-insensitive on the command
/// line).
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    // This host: memory nodes as shared mappings, pinned threads, the wall
    // clock.
    Emu,
    // The deterministic cluster simulator, in virtual time.
    Sim,
    // This host's RDMA device in loopback (a `--features mlx5` build):
    // memory nodes registered here, pinned threads, the wall clock.
    Mlx5,
}

/// What `--backend mlx5` builds need to run it.
pub const NO_MLX5: &str = "--backend mlx5: this loch-bench was built without the mlx5 feature (cargo build --release -p bench --features mlx5)";

impl Backend {
    /// As the command line and the JSON reports name it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Emu => "emu",
            Backend::Sim => "sim",
            Backend::Mlx5 => "mlx5",
        }
    }

    /// `--compute-nodes` other than the one compute node the emu and mlx5
    /// backends run (this process), when `given`: bad input.
    pub fn check_one_compute_node(self, given: bool) -> Result<(), ArgError> {
        if given && self != Backend::Sim {
            return Err(ArgError(
                "--compute-nodes: the emu and mlx5 backends run one compute node (this process)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The clock its figures are in.
    pub fn clock(self) -> &'static str {
        match self {
            Backend::Sim => "virtual time",
            Backend::Emu | Backend::Mlx5 => "wall clock",
        }
    }

    /// The cluster backend this choice boots: emu threads (pinned with
    /// `pin`), a simulated world of `compute_nodes` compute nodes with
    /// `seed`, the default model and no faults, or threads on the RDMA
    /// device `device` names (an error in a build without the `mlx5`
    /// feature).
    pub fn cluster(
        self,
        pin: bool,
        seed: u64,
        compute_nodes: usize,
        device: &DeviceArgs,
    ) -> Result<cluster::Backend, String> {
        Ok(match self {
            Backend::Emu => cluster::Backend::Emu { pin },
            Backend::Sim => cluster::Backend::Sim {
                seed,
                compute_nodes,
                model: nicdrv::sim::SimModel::default(),
                faults: Vec::new(),
            },
            #[cfg(feature = "mlx5")]
            Backend::Mlx5 => cluster::Backend::Mlx5 {
                device: device.config(),
                pin,
            },
            #[cfg(not(feature = "mlx5"))]
            Backend::Mlx5 => {
                let _ = device;
                return Err(NO_MLX5.into());
            }
        })
    }
}

/// Which RDMA device, port, GID and traffic class `--backend mlx5` uses.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct DeviceArgs {
    /// --backend mlx5: the RDMA device, as ibv_devices lists it (default:
    /// the first)
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// --backend mlx5: the device's port (default 1)
    #[arg(long, value_name = "N")]
    pub port: Option<u8>,
    /// --backend mlx5: the port's GID table entry RoCE routes by (default
    /// 0; show_gids lists them)
    #[arg(long, value_name = "N")]
    pub gid_index: Option<u8>,
    /// --backend mlx5: every packet's traffic class (RoCE v2: DSCP << 2,
    /// for the fabric's lossless class; default 0)
    #[arg(long, value_name = "N")]
    pub traffic_class: Option<u8>,
}

impl DeviceArgs {
    /// Whether this build runs `backend` (mlx5 needs the `mlx5` feature),
    /// and the device flags belong to `--backend mlx5`: every command with
    /// a backend asks once.
    pub fn check(&self, backend: Backend) -> Result<(), ArgError> {
        if backend == Backend::Mlx5 && !cfg!(feature = "mlx5") {
            return Err(ArgError(NO_MLX5.into()));
        }
        let given = [
            ("--device", self.device.is_some()),
            ("--port", self.port.is_some()),
            ("--gid-index", self.gid_index.is_some()),
            ("--traffic-class", self.traffic_class.is_some()),
        ];
        match given.iter().find(|g| g.1) {
            Some((flag, _)) if backend != Backend::Mlx5 => Err(ArgError(format!(
                "{flag} is for --backend mlx5, not {}",
                backend.name()
            ))),
            _ => Ok(()),
        }
    }

    #[cfg(feature = "mlx5")]
    pub fn config(&self) -> nicdrv::mlx5::DeviceConfig {
        let d = nicdrv::mlx5::DeviceConfig::default();
        nicdrv::mlx5::DeviceConfig {
            name: self.device.clone(),
            port: self.port.unwrap_or(d.port),
            gid_index: self.gid_index.unwrap_or(d.gid_index),
            traffic_class: self.traffic_class.unwrap_or(d.traffic_class),
        }
    }
}

/// Parses sizes like `8`, `1k`, `1KiB`, `4m`, `8MiB`.
pub fn parse_size(s: &str) -> Option<usize> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = if let Some(n) = t.strip_suffix("kib").or_else(|| t.strip_suffix('k')) {
        (n, 1usize << 10)
    } else if let Some(n) = t.strip_suffix("mib").or_else(|| t.strip_suffix('m')) {
        (n, 1 << 20)
    } else if let Some(n) = t.strip_suffix("gib").or_else(|| t.strip_suffix('g')) {
        // `--span` goes to 16 GiB.
        (n, 1 << 30)
    } else {
        (t.as_str(), 1)
    };
    num.trim().parse::<usize>().ok()?.checked_mul(mult)
}

/// A size flag's value parser: bytes, with an optional k/KiB, m/MiB or
/// g/GiB.
pub fn size_value(s: &str) -> Result<usize, String> {
    parse_size(s).ok_or_else(|| format!("cannot parse `{s}` as a size (such as 64, 4k, 1MiB)"))
}

/// Levenshtein distance, for suggestions.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// Most queue pairs a simulated cluster may hold (compute threads × memory
/// nodes): a paper-scale run holds about 1,400, and past this the
/// simulator's records alone outgrow a host's memory.
pub const SIM_QPS_MAX: u64 = 1 << 20;
/// Most tasks a simulated cluster may run at once.
pub const SIM_TASKS_MAX: u64 = 1 << 20;

/// Refuses a simulated cluster past what one host holds, before anything
/// is built (it was killed for memory, with no word why): `threads`
/// compute threads in all, each with a queue pair to each of
/// `memory_nodes`, running `tasks` tasks; `flags` names the flags whose
/// product it is.
pub fn check_sim_size(
    flags: &str,
    threads: u64,
    memory_nodes: u64,
    tasks: u64,
) -> Result<(), ArgError> {
    let qps = threads.saturating_mul(memory_nodes);
    if qps > SIM_QPS_MAX {
        return Err(ArgError(format!(
            "{flags}: {threads} simulated compute threads, each with a queue pair to each of \
             {memory_nodes} memory nodes, make {qps} queue pairs; at most {SIM_QPS_MAX} on sim"
        )));
    }
    if tasks > SIM_TASKS_MAX {
        return Err(ArgError(format!(
            "{flags}: {tasks} simulated tasks; at most {SIM_TASKS_MAX} on sim"
        )));
    }
    Ok(())
}

/// Refuses a run whose memory — `what`, `bytes` of it, allocated in this
/// process and touched as it runs — is more than this machine has
/// available (it was killed for memory part-way, with no word why). Runs
/// when the available memory cannot be read.
pub fn check_memory(what: impl FnOnce() -> String, bytes: u64) -> Result<(), ArgError> {
    match available_bytes() {
        Some(avail) if bytes > avail => Err(ArgError(format!(
            "{}: {} MiB, more than this machine's {} MiB of available memory",
            what(),
            bytes >> 20,
            avail >> 20
        ))),
        _ => Ok(()),
    }
}

/// How many items of `each` bytes half of `available` memory holds beside
/// `beside` bytes already taken (unbounded where the available memory is
/// not known): what a run may keep as it goes, the other half left for
/// the work at its end.
pub fn half_memory_holds(available: Option<u64>, beside: u64, each: u64) -> u64 {
    available.map_or(u64::MAX, |a| a.saturating_sub(beside) / 2 / each.max(1))
}

/// This machine's available memory (`MemAvailable` in /proc/meminfo), if
/// it can be read.
pub fn available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Refuses, on emu, executors of `slots` task slots whose completion
/// queue could not serve a queue pair to each of `memory_nodes`, each as
/// deep as its tasks' doorbells can fill (the boot failed, exit 1, as if
/// the benchmark had); `what` names the flags that set them.
pub fn check_emu_cq(what: &str, slots: usize, memory_nodes: usize) -> Result<(), ArgError> {
    let cqe = nicdrv::ExecutorConfig {
        slots,
        ..Default::default()
    }
    .qp_depth() as u64
        * memory_nodes as u64;
    let max = nicdrv::emu::EmuConfig::default().max_cqe as u64;
    if cqe > max {
        return Err(ArgError(format!(
            "{what} needs a completion queue of {cqe} entries a core; emu holds {max}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse_size("1KiB"), Some(1024));
        assert_eq!(parse_size("4m"), Some(4 << 20));
        assert_eq!(parse_size("16g"), Some(16 << 30));
        assert_eq!(parse_size("2GiB"), Some(2 << 30));
        assert_eq!(parse_size(" 8 "), Some(8));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("99999999999999999999m"), None);
        assert!(size_value("lots").unwrap_err().contains("`lots`"));
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
