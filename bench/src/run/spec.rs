//! What a run is: the operation kinds and their mix, the systems, how long
//! clients measure, and the whole run's description ([`RunSpec`]).

use super::*;

pub use crate::args::Backend;

/// Operation kinds, in report order (and in `ycsb::PROPORTION_KEYS` order).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
}

pub const KINDS: [Kind; 5] = [
    Kind::Read,
    Kind::Update,
    Kind::Insert,
    Kind::Scan,
    Kind::ReadModifyWrite,
];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Read => "read",
            Kind::Update => "update",
            Kind::Insert => "insert",
            Kind::Scan => "scan",
            Kind::ReadModifyWrite => "rmw",
        }
    }
    pub(crate) fn ix(self) -> usize {
        self as usize
    }
    pub(crate) fn is_write(self) -> bool {
        matches!(self, Kind::Update | Kind::Insert | Kind::ReadModifyWrite)
    }
}

/// How scan lengths are drawn, over `1..=max_scan`.
#[derive(Clone, Debug)]
pub enum ScanLen {
    Uniform,
    /// YCSB's `ZipfianGenerator(1, maxscanlength)`: unscrambled, constant 0.99.
    Zipfian(Zipfian),
    /// Always `max_scan`.
    Constant,
}

/// Proportions of each kind (sum 1) and the scan lengths.
#[derive(Clone, Debug)]
pub struct Mix {
    pub name: String,
    pub props: [f64; 5],
    pub max_scan: u64,
    pub scan_len: ScanLen,
    /// How records are chosen, after `--zipf`: YCSB-D's `Latest` favours
    /// recently inserted records.
    pub request: RequestDist,
    /// Carried into the report only.
    pub field_count: u64,
    pub field_length: u64,
}

impl Mix {
    /// The file's mix, with the request distribution `zipf` (the file's or
    /// `--zipf`) makes of it: 0 is uniform, except that "latest" stays.
    pub fn from_file(name: &str, w: &WorkloadFile, zipf: f64) -> Mix {
        Mix {
            name: name.to_string(),
            props: w.proportions,
            max_scan: w.max_scan_length,
            scan_len: match w.scan_length_dist {
                ScanLengthDist::Uniform => ScanLen::Uniform,
                // The parser guarantees max_scan_length >= 1.
                ScanLengthDist::Zipfian => ScanLen::Zipfian(Zipfian::new(w.max_scan_length, 0.99)),
                ScanLengthDist::Constant => ScanLen::Constant,
            },
            request: match w.request_dist {
                RequestDist::Latest => RequestDist::Latest,
                _ if zipf == 0.0 => RequestDist::Uniform,
                _ => RequestDist::Zipfian,
            },
            field_count: w.field_count,
            field_length: w.field_length,
        }
    }

    pub(crate) fn scan_len(&self, rng: &mut Rng) -> usize {
        let n = match &self.scan_len {
            ScanLen::Uniform => 1 + rng.below(self.max_scan),
            ScanLen::Zipfian(z) => 1 + z.next(rng),
            ScanLen::Constant => self.max_scan,
        };
        n as usize
    }
}

/// A system: a tree configuration under a name ([`TreeConfig::named`]),
/// or `cuckoo`, the hash table, which takes only its chunk size from the
/// tree configuration.
pub(crate) fn system_named(name: &str, host_bytes: u64) -> Option<TreeConfig> {
    match name {
        "cuckoo" => Some(TreeConfig::sherman(host_bytes)),
        _ => TreeConfig::named(name, host_bytes),
    }
}

/// Every system `--systems` takes.
pub(crate) fn systems_known() -> String {
    format!("{}, cuckoo", TreeConfig::NAMES)
}

/// How long clients measure.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Length {
    /// Operations per client.
    Ops(u64),
    /// Until this long after the first measured operation began (virtual
    /// ns on sim, wall ns on emu).
    Nanos(u64),
}

#[derive(Clone, Debug)]
pub struct RunSpec {
    pub backend: Backend,
    /// The RDMA device of `--backend mlx5` (read by mlx5 builds only).
    #[cfg_attr(not(feature = "mlx5"), allow(dead_code))]
    pub device: crate::args::DeviceArgs,
    pub mix: Mix,
    /// The mix of the odd-numbered client threads (cores 1, 3, ... over
    /// the run), when it differs (`--half-workload`).
    pub half_mix: Option<Mix>,
    pub zipf: f64,
    pub system: String,
    pub tree: TreeConfig,
    /// Bytes of a tree key (`--key-size`): 8, or a width
    /// `index::any::WIDE_KEY_BYTES` lists.
    pub key_bytes: usize,
    pub memory_nodes: usize,
    pub compute_nodes: usize,
    pub threads: usize,
    pub coroutines: usize,
    pub records: u64,
    pub length: Length,
    pub warmup: u64,
    pub seed: u64,
    pub host_bytes: u64,
    pub cache_bytes: usize,
    /// The hash table's grace period G (`--hash-grace-ms`), if not the
    /// default.
    pub hash_grace_ns: Option<u64>,
    /// Record every operation into a history.
    pub record_history: bool,
    /// Events the run's history may hold in all (what this machine's
    /// available memory holds beside the records); a run that reaches it
    /// fails, its history kept.
    pub history_cap: u64,
    /// Run the Nessie hash table instead of a tree (`--systems cuckoo`).
    pub cuckoo: bool,
    /// The simulator's model (`--sim-model`).
    pub model: SimModel,
    /// Faults to inject (sim only), `at_ns` counted from the start of the
    /// workload (after the load). With any, failed operations are counted
    /// rather than failing the run.
    pub faults: Vec<Fault>,
}

impl RunSpec {
    /// The trees' node layout: the spec's key and value sizes, which the
    /// command line checked (`Cli::parse`).
    pub(crate) fn layout(&self) -> Layout {
        Layout::new(self.key_bytes, self.tree.value_bytes)
            .expect("key and value sizes are checked when the command line is read")
    }
    /// The injected faults as text, for the report, the table and the
    /// history header.
    pub(crate) fn fault_names(&self) -> Vec<String> {
        self.faults.iter().map(|f| f.to_string()).collect()
    }

    /// The workload's name for tables and plots: with `--half-workload`,
    /// both halves.
    pub(crate) fn workload_label(&self) -> String {
        match &self.half_mix {
            Some(h) => format!(
                "{} (even threads) + {} (odd threads)",
                self.mix.name, h.name
            ),
            None => self.mix.name.clone(),
        }
    }

    pub(crate) fn clients(&self) -> u64 {
        (self.compute_nodes * self.threads * self.coroutines) as u64
    }

    /// Operations per client, for sizing the hash table (a guess for
    /// timed runs: inserts beyond it can fill the table).
    pub(crate) fn ops_hint(&self) -> u64 {
        match self.length {
            Length::Ops(n) => n + self.warmup,
            Length::Nanos(_) => 10_000 + self.warmup,
        }
    }
}
