//! `loch`: boots Loch. `loch demo` runs a whole cluster on this host,
//! `loch node` boots one node of a cluster file, `loch check` runs its
//! preflight. Exit codes as every `--help` says (cmdline's): 0 done, 1 the
//! system failed, 2 bad input.

use appliance::demo::{self, DemoBackend, DemoConfig};
use appliance::index_work::{check_tree, Sizes, DEFAULT_TREE};
use appliance::node::{self, NodeOptions, Workload};
use appliance::processes::{self, ProcessesConfig};
use clap::{Parser, Subcommand};
use cmdline::{EXIT_BAD_INPUT, EXIT_DONE, EXIT_FAILED, EXIT_INTERRUPTED};
use std::path::PathBuf;
use std::process::ExitCode;

/// Loch, a disaggregated-memory appliance: compute nodes reach memory
/// nodes through one-sided RDMA verbs and run a B+tree (Sherman) and a
/// hash table (Nessie) on them.
#[derive(Parser, Debug)]
#[command(
    name = "loch",
    version = cmdline::version(BACKENDS),
    propagate_version = true,
    after_help = cmdline::EXIT_CODES_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[cfg(feature = "mlx5")]
const BACKENDS: &[&str] = &["emu", "sim", "mlx5"];
#[cfg(not(feature = "mlx5"))]
const BACKENDS: &[&str] = &["emu", "sim"];

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a whole cluster with a self-checking workload: the verb mix,
    /// then the B+tree, then the hash table, then a replicated bank of
    /// FaRM transactions; on this host (emu) or simulated in virtual time
    /// (sim)
    Demo(DemoArgs),
    /// Boot one node of a cluster file: a memory node serves compute runs
    /// (any number, one after another, when the coordinator is a
    /// memory-only node) until SIGINT/SIGTERM, a compute node runs its
    /// workload
    #[command(after_help = NODE_AFTER_HELP)]
    Node(NodeArgs),
    /// Run node N's preflight checks and print each, then whether the
    /// memory nodes can hold the workload `loch node` would run with the
    /// same flags (it takes all of them: flags `loch node` refuses are
    /// refused here too, exit 2; a workload the memory nodes cannot hold
    /// is a FAIL line, exit 1)
    #[command(after_help = CHECK_AFTER_HELP)]
    Check(NodeArgs),
}

/// `loch node`'s exit codes: a signal is how a memory node, and a
/// compute run without `--seconds`, end when all is well.
const NODE_AFTER_HELP: &str = "Exit codes: 0 done, every check passed (also a memory node \
stopped by SIGINT or SIGTERM, and a verbs, tree or hash run they end); 1 the system failed (a \
check, a verb, a node; the message on stderr); 2 bad input (the first line names it; nothing \
ran, and the node tells the others why, for up to 5 s); 130 a --workload txn run cut short by \
SIGINT or SIGTERM (the summary of what ran is still printed).";

/// `loch check`'s exit codes.
const CHECK_AFTER_HELP: &str = "Exit codes: 0 every check passed (warnings allowed); 1 a check \
failed (a FAIL line); 2 bad input (one line naming it: the cluster file, the node, or a flag \
`loch node` would refuse).";

/// Which node of which cluster file.
#[derive(clap::Args, Debug)]
struct NodeId {
    /// The cluster file (docs/cluster-file.md)
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// This node's id in the cluster file
    #[arg(long, value_name = "N")]
    id: u32,
}

/// `loch node`'s and `loch check`'s flags (each its own exit codes:
/// [`NODE_AFTER_HELP`], [`CHECK_AFTER_HELP`]).
#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true)]
struct NodeArgs {
    #[command(flatten)]
    node: NodeId,
    /// Compute role: stop after S seconds, at most 86400 [default: at
    /// SIGINT/SIGTERM;
    /// leases and txn --etcd: 5, and a signal does not cut them short, as
    /// the other machines' leases would take a machine that stopped early
    /// for a failed one]
    #[arg(long, value_name = "S")]
    seconds: Option<f64>,
    /// Compute role: tasks per core, 1 ..= 64 [default: 8]
    #[arg(long, value_name = "N")]
    tasks: Option<usize>,
    /// Compute role: the seed of the tasks' streams
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Do not pin the compute cores
    #[arg(long)]
    no_pin: bool,
    /// Compute role: what to run: verbs, tree, hash, txn (every node a
    /// machine with both roles, running a replicated bank of FaRM
    /// transactions; with --etcd for --seconds, with FaRM's failure
    /// handling: kill a machine and the others go on), or leases (every
    /// node a machine, FaRM's failure detection and reconfiguration
    /// alone, the configuration in etcd: --etcd, --lease-ms, --seconds);
    /// every compute node of a cluster must get the same
    #[arg(long, value_name = "W", value_parser = workload_value, default_value = "tree")]
    workload: Workload,
    /// --workload txn: transactions each core coordinates (without --etcd)
    /// [default: 2000]
    #[arg(long, value_name = "N")]
    txs: Option<u64>,
    /// --workload leases, or txn with failure handling: the etcd endpoint
    /// (http://HOST:PORT) that holds the cluster's configuration
    #[arg(long, value_name = "URL")]
    etcd: Option<String>,
    /// --workload leases or txn --etcd: the lease in milliseconds, at most
    /// 10000 (renewed every fifth) [default: 10]
    #[arg(long, value_name = "MS")]
    lease_ms: Option<f64>,
    /// Compute role: records loaded into the index, 1 ..= 10000000; every
    /// compute node of a cluster must get the same [default: 100000]
    #[arg(long, value_name = "N")]
    records: Option<u64>,
    #[command(flatten)]
    sizes: SizeArgs,
    /// --workload tree: the tree, one of sherman (as the paper builds it),
    /// sherman-2rt (the lock and the leaf read in one doorbell, the page
    /// handed over with the lock: writes in two round trips),
    /// sherman-paper-versions (the paper's front/rear versions, kept as an
    /// ablation: they can take a torn node for a whole one, and an
    /// operation then fails), fg (the FG+ baseline), fg+comb,
    /// fg+comb+onchip, fg+comb+onchip+hier; every compute node of a
    /// cluster must get the same
    #[arg(long, value_name = "NAME", default_value = DEFAULT_TREE)]
    tree: String,
    /// Compute role: also write the raw latency histogram to FILE, as JSON
    /// [[value_ns, count], ...] (the result line on stdout has the
    /// percentiles)
    #[arg(long, value_name = "FILE")]
    histogram: Option<PathBuf>,
}

impl NodeArgs {
    /// The options `loch node` runs with and `loch check` checks;
    /// `--key-size`, `--value-size`, `--tree` and `--etcd` given to a
    /// workload that has no use for them are bad input.
    fn options(self) -> Result<NodeOptions, String> {
        let sizes = self.sizes.for_workload(self.workload)?;
        tree_for_workload(&self.tree, self.workload)?;
        let w = self.workload;
        if self.etcd.is_some() && !w.machines() {
            return Err(format!(
                "--etcd applies to --workload txn and leases, not {}",
                w.name()
            ));
        }
        // Flags a workload would ignore are refused, naming what they
        // apply to.
        let leases = w == Workload::Leases || (w == Workload::Txn && self.etcd.is_some());
        let ignored = [
            (
                "--tasks",
                self.tasks.is_some() && w.machines(),
                "the verbs, tree and hash workloads",
            ),
            (
                "--records",
                self.records.is_some() && w.machines(),
                "the verbs, tree and hash workloads",
            ),
            (
                "--histogram",
                self.histogram.is_some() && w.machines(),
                "the verbs, tree and hash workloads",
            ),
            (
                "--no-pin",
                self.no_pin && w.machines(),
                "the verbs, tree and hash workloads",
            ),
            (
                "--txs",
                self.txs.is_some() && (w != Workload::Txn || leases),
                "--workload txn without --etcd (with it the run lasts --seconds)",
            ),
            (
                "--seconds",
                self.seconds.is_some() && w == Workload::Txn && !leases,
                "--workload txn with --etcd (without it each core runs --txs transactions)",
            ),
            (
                "--lease-ms",
                self.lease_ms.is_some() && !leases,
                "--workload leases and txn --etcd",
            ),
        ];
        if let Some((flag, _, to)) = ignored.iter().find(|i| i.1) {
            return Err(format!("{flag} applies to {to}, not {}", w.name()));
        }
        Ok(NodeOptions {
            config: self.node.config,
            id: self.node.id,
            seconds: self.seconds,
            tasks_per_core: self.tasks.unwrap_or(8),
            pin: !self.no_pin,
            seed: self.seed,
            workload: w,
            records: self.records.unwrap_or(100_000),
            sizes,
            tree: self.tree,
            histogram: self.histogram,
            txs: self.txs.unwrap_or(2000),
            etcd: self.etcd,
            lease_ms: self.lease_ms.unwrap_or(10.0),
        })
    }
}

/// The index workloads' record sizes.
#[derive(clap::Args, Debug)]
struct SizeArgs {
    /// Index workloads: bytes of a key, 8, 16, 32, 64, 128, 256, 512 or
    /// 1024 (record key k becomes its 8 big-endian bytes repeated, so the
    /// order is kept); tree nodes double from 1 KiB until one holds 8
    /// entries. Every compute node of a cluster must get the same
    #[arg(long, value_name = "N", default_value_t = 8)]
    key_size: usize,
    /// Index workloads: bytes of a value, 8 to 1024 (a put stores its u64
    /// repeated to fill them). Every compute node of a cluster must get
    /// the same
    #[arg(long, value_name = "N", default_value_t = 8)]
    value_size: usize,
}

impl SizeArgs {
    fn sizes(&self) -> Result<Sizes, String> {
        Sizes::new(self.key_size, self.value_size)
    }

    /// `loch node`'s and `loch check`'s: sizes other than 8 only with an
    /// index workload.
    fn for_workload(&self, w: Workload) -> Result<Sizes, String> {
        let sizes = self.sizes()?;
        if sizes != Sizes::default() && w.index().is_none() {
            return Err(format!(
                "--key-size and --value-size apply to the index workloads (tree, hash), not {}",
                w.name()
            ));
        }
        Ok(sizes)
    }
}

/// `loch node --tree`: a known tree, named only with `--workload tree`.
fn tree_for_workload(tree: &str, w: Workload) -> Result<(), String> {
    check_tree(tree)?;
    if tree != DEFAULT_TREE && w != Workload::Tree {
        return Err(format!(
            "--tree applies to --workload tree, not {}",
            w.name()
        ));
    }
    Ok(())
}

fn workload_value(s: &str) -> Result<Workload, String> {
    Workload::parse(&s.to_ascii_lowercase())
        .ok_or_else(|| format!("`{s}` is not one of verbs, tree, hash, txn, leases"))
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
enum BackendArg {
    Emu,
    Sim,
}

#[derive(clap::Args, Debug)]
#[command(allow_negative_numbers = true, after_help = DEMO_AFTER_HELP)]
struct DemoArgs {
    /// emu: this host, wall clock; sim: a simulated cluster in virtual time
    #[arg(long, value_enum, ignore_case = true, default_value_t = BackendArg::Emu)]
    backend: BackendArg,
    /// Memory nodes, 1 ..= 64 [default: 2]
    #[arg(long, value_name = "N")]
    memory_nodes: Option<usize>,
    /// Compute cores, 1 ..= 1024: emu pinned threads [default: 2]; sim
    /// threads spread over --compute-nodes [default: 16]; with
    /// --processes, per compute node, up to this host's CPUs [default: 1]
    #[arg(long, value_name = "N")]
    cores: Option<usize>,
    /// Tasks per core, 1 ..= 1024 (with --processes 1 ..= 64)
    #[arg(long, value_name = "N", default_value_t = 8)]
    tasks: usize,
    /// Seconds per phase, at most 60 (with --processes 600): emu wall
    /// [default: 3]; sim virtual [default: 0.005]
    #[arg(long, value_name = "S")]
    seconds: Option<f64>,
    /// The simulation's seed (sim), or the tasks' streams (emu)
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
    /// Compute nodes the simulated cores spread over (sim only) [default:
    /// 4]
    #[arg(long, value_name = "N")]
    compute_nodes: Option<usize>,
    /// One-way link latency of the verb and index phases, at most a second:
    /// emu injected; sim the link's own [default: 0, the model's]
    #[arg(long, value_name = "NS")]
    latency_ns: Option<u64>,
    /// Records bulk-loaded into each index phase, up to 10,000,000 (0
    /// skips them; with --processes at least 1)
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    tree_records: u64,
    #[command(flatten)]
    sizes: SizeArgs,
    /// The tree phase's tree, one of sherman (as the paper builds it),
    /// sherman-2rt (writes in two round trips), sherman-paper-versions (the
    /// paper's front/rear versions, kept as an ablation: they can take a
    /// torn node for a whole one, which the checks then report), fg (the
    /// FG+ baseline), fg+comb, fg+comb+onchip, fg+comb+onchip+hier
    #[arg(long, value_name = "NAME", default_value = DEFAULT_TREE)]
    tree: String,
    /// Transactions each coordinator of the transactions phase runs (a
    /// replicated bank of transfers and audits; 0 skips it, as injected
    /// faults do; refused with --processes) [default: 2000]
    #[arg(long, value_name = "N")]
    txn_txs: Option<u64>,
    /// Do not pin the compute cores
    #[arg(long)]
    no_pin: bool,
    /// Inject a fault (sim only; repeatable), TIME from the start of the
    /// simulation (the verb phase, then each index phase's load and
    /// workload): memory-crash@TIME:NODE, compute-crash@TIME:NODE,
    /// link-cut@TIME:COMPUTE-MEMORY[/DURATION],
    /// link-heal@TIME:COMPUTE-MEMORY, latency-spike@TIME:EXTRA/DURATION,
    /// thread-stall@TIME:THREAD/DURATION; times take ns, us, ms or s. A
    /// task stops at its first failed operation, the others go on, and the
    /// checks allow for operations whose effect is unknown
    #[arg(long, value_name = "KIND@TIME[:TARGET]")]
    fault: Vec<String>,
    /// Six faults drawn from N, crashes included, within 3 × --seconds of
    /// virtual time (sim only)
    #[arg(long, value_name = "N")]
    fault_seed: Option<u64>,
    /// One `loch node` process per node over the control channel (2
    /// memory + 2 compute nodes on 127.0.0.1): the memory nodes serve one
    /// compute run per workload (emu only)
    #[arg(long)]
    processes: bool,
    /// With --processes: the workload to run: verbs, tree, hash or all
    #[arg(long, value_name = "W", requires = "processes")]
    workload: Option<String>,
}

const DEMO_AFTER_HELP: &str = concat!(
    "The summary ends with its checks: every FAA and CAS accounted for, every READ of a task's own \
words returning its last write, every index lookup agreeing with the loaded data and the task's \
own writes, every bank audit seeing the bank's total and every backup equal to its primary.\n\n",
    cmdline::exit_codes_help!()
);

impl DemoArgs {
    /// The in-process demo's configuration, defaults filled in for the
    /// backend.
    fn demo(self) -> Result<DemoConfig, String> {
        let sim = self.backend == BackendArg::Sim;
        let mut cfg = DemoConfig {
            backend: if sim {
                DemoBackend::Sim
            } else {
                DemoBackend::Emu
            },
            tasks_per_core: self.tasks,
            pin: !self.no_pin,
            tree_records: self.tree_records,
            sizes: self.sizes.sizes()?,
            tree: self.tree.clone(),
            ..DemoConfig::default()
        };
        cfg.txn_txs = self.txn_txs.unwrap_or(cfg.txn_txs);
        if let Some(n) = self.memory_nodes {
            cfg.memory_nodes = n;
        }
        cfg.seed = self.seed.unwrap_or(cfg.seed);
        cfg.latency_ns = self.latency_ns.unwrap_or(cfg.latency_ns);
        // The emu cluster is as big as this host; the simulated one
        // defaults to 4 compute nodes × 4 threads.
        cfg.seconds = self.seconds.unwrap_or(if sim { 0.005 } else { 3.0 });
        cfg.cores = self.cores.unwrap_or(if sim { 16 } else { 2 });
        if self.compute_nodes.is_some() && !sim {
            return Err(
                "--compute-nodes applies to --backend sim only (the emu demo's compute cores are one compute node, this host)"
                    .into(),
            );
        }
        cfg.compute_nodes = self.compute_nodes.unwrap_or(if sim { 4 } else { 1 });
        for spec in &self.fault {
            cfg.faults
                .extend(nicdrv::sim::parse_fault(spec).map_err(|e| format!("--fault {e}"))?);
        }
        if let Some(s) = self.fault_seed {
            if !sim {
                return Err("--fault-seed applies to --backend sim only".into());
            }
            // The three phases span about three times --seconds.
            let horizon = (3.0 * cfg.seconds * 1e9) as u64;
            cfg.faults
                .extend(nicdrv::sim::Fault::random_plan_with_crashes(
                    s,
                    6,
                    horizon,
                    (
                        cfg.memory_nodes.min(u16::MAX as usize) as u16,
                        cfg.compute_nodes.min(u16::MAX as usize) as u16,
                        cfg.cores.min(u32::MAX as usize) as u32,
                    ),
                ));
        }
        cfg.faults.sort_by_key(|f| f.at_ns);
        demo::validate(&cfg)?;
        Ok(cfg)
    }

    /// `--processes`' configuration; the flags of the in-process demo
    /// that it has no use for are refused.
    fn processes(self) -> Result<ProcessesConfig, String> {
        let unused = [
            (self.backend == BackendArg::Sim, "--backend sim"),
            (self.memory_nodes.is_some(), "--memory-nodes"),
            (self.seed.is_some(), "--seed"),
            (self.compute_nodes.is_some(), "--compute-nodes"),
            (self.latency_ns.is_some(), "--latency-ns"),
            (!self.fault.is_empty(), "--fault"),
            (self.fault_seed.is_some(), "--fault-seed"),
            (self.txn_txs.is_some(), "--txn-txs"),
        ];
        if let Some((_, flag)) = unused.iter().find(|u| u.0) {
            return Err(format!(
                "{flag} does not apply to --processes (it runs the emu backend, 2 memory + 2 compute nodes)"
            ));
        }
        let mut cfg = ProcessesConfig {
            tasks_per_core: self.tasks,
            pin: !self.no_pin,
            records: self.tree_records,
            sizes: self.sizes.sizes()?,
            tree: self.tree.clone(),
            ..ProcessesConfig::default()
        };
        cfg.seconds = self.seconds.unwrap_or(cfg.seconds);
        cfg.cores_per_compute = self.cores.unwrap_or(cfg.cores_per_compute);
        if let Some(w) = self.workload {
            cfg.workloads = match w.to_ascii_lowercase().as_str() {
                "all" => ProcessesConfig::default().workloads,
                one => vec![Workload::parse(one)
                    .filter(|w| matches!(w, Workload::Verbs | Workload::Tree | Workload::Hash))
                    .ok_or_else(|| {
                        format!("--workload: `{w}` is not one of verbs, tree, hash, all")
                    })?],
            };
        }
        cfg.check()?;
        if cfg.workloads.iter().any(|w| w.index().is_some()) {
            let all = processes::memory_bytes(&cfg).saturating_mul(cfg.memory_nodes as u64);
            demo::fits_this_host(all, cfg.sizes, cfg.records)?;
        }
        Ok(cfg)
    }
}

/// Prints a demo's summary; exit 0 if its checks passed, 1 if one failed,
/// 130 if SIGINT/SIGTERM cut the run short (after the summary of what
/// ran).
fn summary(text: &str, ok: bool) -> ExitCode {
    cmdline::out!("{text}");
    if !ok {
        cmdline::errln!("loch demo: a check FAILED");
        ExitCode::from(EXIT_FAILED)
    } else if cmdline::signals::stop_requested() {
        cmdline::errln!("loch demo: stopped by SIGINT/SIGTERM; the summary covers what ran");
        ExitCode::from(EXIT_INTERRUPTED)
    } else {
        ExitCode::from(EXIT_DONE)
    }
}

fn bad_input(cmd: &str, e: &str) -> ExitCode {
    cmdline::errln!("loch {cmd}: {e}; see `loch {cmd} --help`");
    ExitCode::from(EXIT_BAD_INPUT)
}

fn demo_main(a: DemoArgs) -> ExitCode {
    // SIGINT/SIGTERM end the run early with its summary; --processes
    // passes them on to its nodes.
    cmdline::signals::install();
    let run = if a.processes {
        a.processes().map(|cfg| {
            let threads = cfg.compute_nodes * cfg.cores_per_compute;
            cmdline::warn_if_oversubscribed("loch demo", "compute cores in all", threads);
            processes::run(&cfg).map(|r| (r.text, r.ok))
        })
    } else {
        a.demo().map(|cfg| {
            if cfg.backend == DemoBackend::Emu {
                cmdline::warn_if_oversubscribed("loch demo", "compute cores", cfg.cores);
            }
            demo::run(&cfg).map(|r| (r.text.clone(), r.ok()))
        })
    };
    match run {
        Err(e) => bad_input("demo", &e),
        Ok(Ok((text, ok))) => summary(&text, ok),
        Ok(Err(e)) => {
            cmdline::errln!("loch demo: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

fn node_main(cmd: &str, o: &NodeOptions, check_only: bool) -> ExitCode {
    let r = if check_only {
        node::check(o).map(|passed| u8::from(!passed))
    } else {
        node::run(o)
    };
    match r {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            cmdline::errln!("loch {cmd}: {e}");
            if !check_only {
                // The other nodes hear why this one does not start.
                node::tell_refusal_if_unjoined(&o.config, o.id, &e.to_string());
            }
            ExitCode::from(e.exit_code())
        }
    }
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    cmdline::raise_open_files_limit();
    // A `loch node` whose command line clap refuses tells the other nodes
    // why, as one refusing its flags' values does below.
    let refused = |args: &[std::ffi::OsString], why: &str| {
        if let Some((config, id)) = node::node_named_by(args) {
            node::tell_refusal_by_file(&config, id, why);
        }
    };
    let cli: Cli = match cmdline::parse_telling("loch", std::env::args_os(), refused) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match cli.command {
        Command::Demo(a) => demo_main(a),
        Command::Node(a) => {
            let (config, id) = (a.node.config.clone(), a.node.id);
            match a.options() {
                Ok(o) => node_main("node", &o, false),
                Err(e) => {
                    let code = bad_input("node", &e);
                    // The other nodes hear why this one does not start.
                    node::tell_refusal_by_file(&config, id, &e);
                    code
                }
            }
        }
        Command::Check(a) => match a.options() {
            Ok(o) => node_main("check", &o, true),
            Err(e) => bad_input("check", &e),
        },
    }
}
