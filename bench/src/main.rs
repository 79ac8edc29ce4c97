//! `loch-bench`: Loch's benchmarks, run from scripts. Exit code 2 on bad
//! input, with one line naming the problem; 1 when the system under test
//! failed (a history violation, a failed operation where none may fail,
//! scratch exhaustion); 0 otherwise.

mod args;
mod outfile;
mod plot;
mod progress;
mod run;
mod verbs;
mod workload;
mod ycsb;

use std::process::ExitCode;

const USAGE: &str = "usage: loch-bench <command> [flags]
commands:
  verbs   perftest-style microbenchmark of single verbs
  run     index workloads (Sherman's mixes, YCSB) on sim or emu, systems side by side
run `loch-bench <command> --help` for its flags
exit codes: 0 done; 1 the system under test failed (history violation, failed operations
where none were allowed, scratch exhaustion); 2 bad input";

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = argv.first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest = &argv[1..];
    let wants_help = rest.iter().any(|a| a == "--help" || a == "-h");
    let result = match cmd.as_str() {
        "verbs" if wants_help => {
            println!("{}", verbs::USAGE);
            return ExitCode::SUCCESS;
        }
        "verbs" => verbs::run(rest),
        "run" if wants_help => {
            println!("{}", run::USAGE);
            return ExitCode::SUCCESS;
        }
        "run" => run::run(rest),
        "--help" | "-h" | "help" => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        other => Err(args::ArgError(format!(
            "unknown command `{other}`\n{USAGE}"
        ))),
    };
    match result {
        Ok(run::Outcome::Done) => ExitCode::SUCCESS,
        Ok(run::Outcome::HistoryViolation) => ExitCode::from(1),
        Ok(run::Outcome::Failed(why)) => {
            eprintln!("loch-bench: {why}");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("loch-bench: {e}");
            ExitCode::from(2)
        }
    }
}
