//! `loch`: boots Loch. `loch demo` runs a whole cluster on this host,
//! `loch node` boots one node of a cluster file, `loch check` runs its
//! preflight.

use appliance::demo::{self, DemoBackend, DemoConfig};
use appliance::node::{self, NodeOptions};
use appliance::processes::{self, ProcessesConfig};
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: loch <command> [flags]
commands:
  demo    run a whole cluster with a mixed verb workload: on this host (--backend emu,
          the default) or simulated in virtual time (--backend sim)
          flags: --backend emu|sim  --memory-nodes N (2)  --cores N (emu 2, sim 16)  --tasks N per core (8)
                 --seconds S (emu: wall, 3; sim: virtual, 0.005)  --seed N (1)
                 --compute-nodes N (sim only, 4)  --latency-ns N one-way (emu: injected; sim: link)
                 --tree-records N (records bulk-loaded into the B+tree phase; 0 skips it; 100000)
                 --no-pin
                 --fault KIND@TIME[:TARGET] (sim only, repeatable; TIME from the start of the
                 simulation: the verb phase, then each index phase's load and workload):
                 memory-crash@TIME:NODE, compute-crash@TIME:NODE,
                 link-cut@TIME:COMPUTE-MEMORY[/DURATION], link-heal@TIME:COMPUTE-MEMORY,
                 latency-spike@TIME:EXTRA/DURATION, thread-stall@TIME:THREAD/DURATION;
                 times take ns, us, ms or s. A task stops at its first failed operation, the
                 others go on, and the checks allow for operations whose effect is unknown
                 --fault-seed N (sim only: six faults drawn from N, crashes included, within
                 3 × --seconds of virtual time)
          --processes: one `loch node` process per node over the control channel
                 (2 memory + 2 compute nodes on 127.0.0.1), a fresh cluster per workload;
                 flags: --seconds S per workload (3)  --cores N per compute node (1)
                 --tasks N per core (8)  --workload verbs|tree|hash|all (all)
                 --tree-records N (records loaded into each index; 100000)  --no-pin
  node    boot one node of a cluster file (emu backend)
          flags: --config FILE  --id N  [--seconds S] [--tasks N per core (8)] [--seed N] [--no-pin]
                 [--workload verbs|tree|hash (tree)]  [--records N loaded into the index (100000)]
                 every compute node of a cluster must get the same --workload and --records
  check   run node N's preflight checks
          flags: --config FILE  --id N
exit codes: 0 done (every check passed); 1 the system failed (a check FAILED, a node
could not run); 2 bad input (a flag, a value, a cluster file, an id not in it)";

fn parse<T: std::str::FromStr>(flag: &str, v: Option<&String>) -> Result<T, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    v.parse().map_err(|_| format!("{flag}: cannot parse `{v}`"))
}

fn demo_config(args: &[String]) -> Result<DemoConfig, String> {
    let mut cfg = DemoConfig::default();
    let mut seconds = None;
    let (mut cores, mut compute_nodes) = (None, None);
    let mut fault_seed = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--backend" => {
                cfg.backend = match it.next().map(String::as_str) {
                    Some("emu") => DemoBackend::Emu,
                    Some("sim") => DemoBackend::Sim,
                    Some(other) => {
                        return Err(format!("--backend: `{other}` is not available (emu, sim)"))
                    }
                    None => return Err("--backend needs a value".into()),
                }
            }
            "--compute-nodes" => compute_nodes = Some(parse(a, it.next())?),
            "--memory-nodes" => cfg.memory_nodes = parse(a, it.next())?,
            "--cores" => cores = Some(parse(a, it.next())?),
            "--tasks" => cfg.tasks_per_core = parse(a, it.next())?,
            "--seconds" => seconds = Some(parse(a, it.next())?),
            "--seed" => cfg.seed = parse(a, it.next())?,
            "--latency-ns" => cfg.latency_ns = parse(a, it.next())?,
            "--no-pin" => cfg.pin = false,
            "--tree-records" => cfg.tree_records = parse(a, it.next())?,
            "--fault" => {
                let spec: String = parse(a, it.next())?;
                cfg.faults
                    .extend(nicdrv::sim::parse_fault(&spec).map_err(|e| format!("--fault {e}"))?);
            }
            "--fault-seed" => fault_seed = Some(parse::<u64>(a, it.next())?),
            other => return Err(format!("unknown flag `{other}`")),
        }
    }
    // The emu cluster is as big as this host; the simulated one defaults
    // to 4 compute nodes × 4 threads.
    let sim = cfg.backend == DemoBackend::Sim;
    cfg.seconds = seconds.unwrap_or(if sim { 0.005 } else { 3.0 });
    cfg.cores = cores.unwrap_or(if sim { 16 } else { 2 });
    cfg.compute_nodes = compute_nodes.unwrap_or(if sim { 4 } else { 1 });
    if let Some(s) = fault_seed {
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

fn processes_config(args: &[String]) -> Result<ProcessesConfig, String> {
    let mut cfg = ProcessesConfig::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--processes" => {}
            "--backend" => match it.next().map(String::as_str) {
                Some("emu") => {}
                _ => return Err("--processes runs the emu backend only".into()),
            },
            "--seconds" => cfg.seconds = parse(a, it.next())?,
            "--cores" => cfg.cores_per_compute = parse(a, it.next())?,
            "--tasks" => cfg.tasks_per_core = parse(a, it.next())?,
            "--no-pin" => cfg.pin = false,
            "--tree-records" => cfg.records = parse(a, it.next())?,
            "--workload" => {
                let v: String = parse(a, it.next())?;
                cfg.workloads = match v.as_str() {
                    "all" => ProcessesConfig::default().workloads,
                    w => vec![node::Workload::parse(w).ok_or_else(|| {
                        format!("--workload: `{w}` is not one of verbs, tree, hash, all")
                    })?],
                };
            }
            other => return Err(format!("unknown flag `{other}` with --processes")),
        }
    }
    if cfg.cores_per_compute == 0 || cfg.tasks_per_core == 0 {
        return Err("--cores and --tasks must be at least 1".into());
    }
    Ok(cfg)
}

/// `--config F --id N` plus the node flags.
fn node_options(args: &[String], node_flags: bool) -> Result<NodeOptions, String> {
    let (mut config, mut id) = (None, None);
    let mut o = NodeOptions {
        config: PathBuf::new(),
        id: 0,
        seconds: None,
        tasks_per_core: 8,
        pin: true,
        seed: 1,
        workload: node::Workload::Tree,
        records: 100_000,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--config" => config = Some(PathBuf::from(parse::<String>(a, it.next())?)),
            "--id" => id = Some(parse(a, it.next())?),
            "--seconds" if node_flags => o.seconds = Some(parse(a, it.next())?),
            "--tasks" if node_flags => o.tasks_per_core = parse(a, it.next())?,
            "--seed" if node_flags => o.seed = parse(a, it.next())?,
            "--no-pin" if node_flags => o.pin = false,
            "--workload" if node_flags => {
                let v: String = parse(a, it.next())?;
                o.workload = node::Workload::parse(&v)
                    .ok_or_else(|| format!("--workload: `{v}` is not one of verbs, tree, hash"))?;
            }
            "--records" if node_flags => o.records = parse(a, it.next())?,
            other => return Err(format!("unknown flag `{other}`")),
        }
    }
    o.config = config.ok_or("--config FILE is required")?;
    o.id = id.ok_or("--id N is required")?;
    Ok(o)
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match argv.first().map(String::as_str) {
        Some("demo") if argv.iter().any(|a| a == "--processes") => {
            let cfg = match processes_config(&argv[1..]) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("loch demo: {e}\n{USAGE}");
                    return ExitCode::from(2);
                }
            };
            match processes::run(&cfg) {
                Ok(report) => {
                    print!("{}", report.text);
                    if report.ok {
                        ExitCode::SUCCESS
                    } else {
                        eprintln!("loch demo: a check FAILED");
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("loch demo: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some(cmd @ ("node" | "check")) => {
            let o = match node_options(&argv[1..], cmd == "node") {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("loch {cmd}: {e}\n{USAGE}");
                    return ExitCode::from(2);
                }
            };
            let r = if cmd == "node" {
                node::run(&o)
            } else {
                node::check(&o.config, o.id).map(|passed| u8::from(!passed))
            };
            match r {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    eprintln!("loch {cmd}: {e}");
                    ExitCode::from(e.exit_code())
                }
            }
        }
        Some("demo") => {
            let cfg = match demo_config(&argv[1..]) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("loch demo: {e}\n{USAGE}");
                    return ExitCode::from(2);
                }
            };
            match demo::run(&cfg) {
                Ok(report) => {
                    print!("{}", report.text);
                    if report.ok() {
                        ExitCode::SUCCESS
                    } else {
                        eprintln!("loch demo: a check FAILED");
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("loch demo: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some("--help") | Some("-h") | Some("help") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}
