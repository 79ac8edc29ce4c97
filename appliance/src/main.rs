//! `loch`: boots Loch. `loch demo` runs a whole cluster on this host.

use appliance::demo::{self, DemoConfig};
use std::process::ExitCode;

const USAGE: &str = "usage: loch <command> [flags]
commands:
  demo    run a whole cluster on this host (emu backend) with a mixed verb workload
          flags: --memory-nodes N (2)  --cores N (2)  --tasks N per core (8)
                 --seconds S (3)  --seed N (1)  --latency-ns N injected one-way (0)  --no-pin";

fn parse<T: std::str::FromStr>(flag: &str, v: Option<&String>) -> Result<T, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    v.parse().map_err(|_| format!("{flag}: cannot parse `{v}`"))
}

fn demo_config(args: &[String]) -> Result<DemoConfig, String> {
    let mut cfg = DemoConfig::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--memory-nodes" => cfg.memory_nodes = parse(a, it.next())?,
            "--cores" => cfg.cores = parse(a, it.next())?,
            "--tasks" => cfg.tasks_per_core = parse(a, it.next())?,
            "--seconds" => cfg.seconds = parse(a, it.next())?,
            "--seed" => cfg.seed = parse(a, it.next())?,
            "--latency-ns" => cfg.latency_ns = parse(a, it.next())?,
            "--no-pin" => cfg.pin = false,
            other => return Err(format!("unknown flag `{other}`")),
        }
    }
    Ok(cfg)
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match argv.first().map(String::as_str) {
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
