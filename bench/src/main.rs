//! `loch-bench`: Loch's benchmarks, run from scripts. Exit code 2 on bad
//! input, with one line naming the problem; 1 when the system under test
//! failed (a history violation, a failed operation where none may fail,
//! scratch exhaustion); 130 when SIGINT or SIGTERM stopped it; 0
//! otherwise. A closed stdout (`loch-bench … | head -1`) ends the output
//! quietly.

// serde_json's json! of a whole report nests deeper than the default 128.
#![recursion_limit = "256"]

mod args;
mod hash_grow;
mod hash_load;
mod locks;
mod outfile;
mod plot;
mod progress;
mod ring;
mod run;
mod txn;
mod verbs;
mod workload;
mod ycsb;

use clap::{Parser, Subcommand};
use cmdline::{EXIT_BAD_INPUT, EXIT_DONE, EXIT_FAILED, EXIT_INTERRUPTED};
use std::process::ExitCode;

#[cfg(feature = "mlx5")]
const BACKENDS: &[&str] = &["emu", "sim", "mlx5"];
#[cfg(not(feature = "mlx5"))]
const BACKENDS: &[&str] = &["emu", "sim"];

/// Loch's benchmarks: single verbs perftest-style, and index workloads
/// with systems side by side, on the emu backend (this host, wall clock)
/// or the sim backend (a simulated cluster, virtual time); and, with
/// --backend mlx5 (a --features mlx5 build), on this host's RDMA device in
/// loopback.
/// The exit codes every subcommand shares (each one's --help says what
/// they mean for it).
const BENCH_EXIT_CODES_HELP: &str = "Exit codes: 0 done; 1 the benchmark or the system under \
it failed (the message on stderr); 2 bad input (one line naming it; nothing ran); 130 stopped \
by SIGINT or SIGTERM. Each subcommand's --help says what they mean for it.";

#[derive(Parser, Debug)]
#[command(
    name = "loch-bench",
    version = cmdline::version(BACKENDS),
    propagate_version = true,
    after_help = BENCH_EXIT_CODES_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Single verbs (READ, WRITE, CAS, FAA) through the executor,
    /// perftest-style
    Verbs(verbs::VerbsArgs),
    /// Index workloads (Sherman's mixes, YCSB) on sim or emu, systems side
    /// by side
    Run(Box<run::RunArgs>),
    /// Records through one message/log ring between two machines: records
    /// per second and one-way latency
    Ring(ring::RingArgs),
    /// FaRM transactions (TATP, SmallBank, YCSB-T, list appends, a bank)
    /// on a cluster of machines: throughput, latency, aborts, verbs per
    /// commit
    Txn(Box<txn::TxnArgs>),
    /// Lock acquisitions through the tree's lock code, the lock variants
    /// side by side (host CAS, device-memory CAS, local lock table,
    /// handover): acquisitions per second, latency, remote CAS attempts
    Locks(locks::LocksArgs),
    /// The hash table's round trips against its load factor: one client
    /// inserts until the table is full, updating as it goes (the Nessie
    /// slides' curve)
    HashLoad(hash_load::HashLoadArgs),
    /// YCSB-A on the hash table while it doubles online: throughput before
    /// and during the growth, and the longest operation during it
    HashGrow(hash_grow::HashGrowArgs),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli: Cli = match cmdline::parse("loch-bench") {
        Ok(c) => c,
        Err(code) => return code,
    };
    // SIGINT/SIGTERM end the run early, and what it measured is reported.
    cmdline::signals::install();
    cmdline::raise_open_files_limit();
    let (name, result) = match cli.command {
        Command::Verbs(a) => ("loch-bench verbs", verbs::run(a)),
        Command::Run(a) => ("loch-bench run", run::run(*a)),
        Command::Ring(a) => ("loch-bench ring", ring::run(a)),
        Command::Txn(a) => ("loch-bench txn", txn::run(*a)),
        Command::Locks(a) => ("loch-bench locks", locks::run(a)),
        Command::HashLoad(a) => ("loch-bench hash-load", hash_load::run(a)),
        Command::HashGrow(a) => ("loch-bench hash-grow", hash_grow::run(a)),
    };
    match result {
        Ok(run::Outcome::Done) => ExitCode::from(EXIT_DONE),
        Ok(run::Outcome::Interrupted) => ExitCode::from(EXIT_INTERRUPTED),
        Ok(run::Outcome::HistoryViolation) => ExitCode::from(EXIT_FAILED),
        Ok(run::Outcome::Failed(why)) => {
            cmdline::errln!("{name}: {why}");
            ExitCode::from(EXIT_FAILED)
        }
        Err(e) => {
            cmdline::errln!("{name}: {e}; see `{name} --help`");
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}
