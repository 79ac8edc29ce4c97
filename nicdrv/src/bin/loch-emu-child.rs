//! A second process for emu tests and experiments.
//!
//! `loch-emu-child own PATH ID HOST_BYTES DM_BYTES` creates a memory node at
//! PATH, registers all of it, prints `READY` and holds the node until its
//! standard input closes (or it is killed).
//!
//! `loch-emu-child faa PATH OFFSET THREADS TASKS PER_TASK` attaches to the
//! node at PATH and runs THREADS pinned executors × TASKS tasks, each doing
//! PER_TASK FAAs of 1 on the word at OFFSET; it prints every old value it
//! saw, one per line, then `DONE`.

use nicdrv::emu::{Backing, EmuConfig, EmuEndpoint, EmuNic, EmuNode, EmuNodeConfig};
use nicdrv::{Access, Executor, ExecutorConfig, GlobalAddr, HeapMem, Nic};
use std::io::{BufRead, Write};
use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!("usage: loch-emu-child own PATH ID HOST_BYTES DM_BYTES | faa PATH OFFSET THREADS TASKS PER_TASK");
    ExitCode::from(2)
}

fn num(s: &str) -> Option<u64> {
    s.parse().ok()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("own") if args.len() == 5 => {
            let (Some(id), Some(host), Some(dm)) = (num(&args[2]), num(&args[3]), num(&args[4]))
            else {
                return usage();
            };
            let cfg = EmuNodeConfig {
                id: id as u16,
                host_bytes: host,
                dm_bytes: dm,
                backing: Backing::File(args[1].clone().into()),
            };
            let node = match EmuNode::create(&cfg) {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("loch-emu-child: {e}");
                    return ExitCode::FAILURE;
                }
            };
            if let Err(e) = node.register_all() {
                eprintln!("loch-emu-child: {e}");
                return ExitCode::FAILURE;
            }
            println!("READY");
            let _ = std::io::stdout().flush();
            for _ in std::io::stdin().lock().lines() {}
            drop(node);
            ExitCode::SUCCESS
        }
        Some("faa") if args.len() == 6 => {
            let nums: Option<Vec<u64>> = args[2..].iter().map(|s| num(s)).collect();
            let Some(n) = nums else { return usage() };
            let (offset, threads, tasks, per_task) = (n[0], n[1] as usize, n[2] as usize, n[3]);
            let ep = match EmuEndpoint::attach(&args[1]) {
                Ok(e) => e,
                Err(e) => {
                    eprintln!("loch-emu-child: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let nic = EmuNic::new(EmuConfig::default());
            let olds = std::sync::Mutex::new(Vec::new());
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        let cfg = ExecutorConfig {
                            slots: tasks.max(1),
                            ..Default::default()
                        };
                        let cq = nic.create_cq(cfg.qp_depth()).expect("cq");
                        let qp = nic.create_qp(&cq, cfg.qp_depth()).expect("qp").connect(&ep);
                        let mr = nic
                            .register(
                                HeapMem::zeroed(cfg.scratch_bytes()).expect("mem"),
                                Access::LOCAL_WRITE,
                            )
                            .expect("mr");
                        let mut ex =
                            Executor::new(nic.clone(), cq, vec![qp], mr, cfg).expect("executor");
                        let mine = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
                        for _ in 0..tasks {
                            let m = mine.clone();
                            let word = GlobalAddr::host(ep.node(), offset);
                            ex.spawn(move |ctx| async move {
                                for _ in 0..per_task {
                                    let v = ctx.faa(word, 1).await.expect("faa");
                                    m.borrow_mut().push(v);
                                }
                            })
                            .expect("slot");
                        }
                        ex.run();
                        olds.lock().unwrap().extend(mine.borrow().iter().copied());
                    });
                }
            });
            let mut out = std::io::stdout().lock();
            for v in olds.into_inner().unwrap() {
                let _ = writeln!(out, "{v}");
            }
            let _ = writeln!(out, "DONE");
            ExitCode::SUCCESS
        }
        _ => usage(),
    }
}
