use nicdrv::emu::{Backing, EmuConfig, EmuNic, EmuNode, EmuNodeConfig};
use nicdrv::*;
use std::cell::Cell;
use std::rc::Rc;

/// Memory node 1: 1 MiB of host memory, 4 KiB of device memory.
fn emu_node() -> EmuNode {
    let node = EmuNode::create(&EmuNodeConfig {
        id: 1,
        host_bytes: 1 << 20,
        dm_bytes: 4096,
        backing: Backing::Memfd,
    })
    .unwrap();
    node.register_all().unwrap();
    node
}

/// An executor on an emu device made with `cfg`, with a queue pair to a
/// memory node of its own (node 1, 1 MiB), which the caller keeps alive.
fn emu_executor(cfg: EmuConfig) -> (EmuNode, EmuNic, Executor<EmuNic>) {
    let node = emu_node();
    let nic = EmuNic::new(cfg);
    let ecfg = ExecutorConfig::default();
    let cq = nic.create_cq(1024).unwrap();
    let qp = nic
        .create_qp(&cq, ecfg.qp_depth())
        .unwrap()
        .connect(&node.endpoint());
    let mr = nic
        .register(
            HeapMem::zeroed(ecfg.scratch_bytes()).unwrap(),
            Access::LOCAL_WRITE,
        )
        .unwrap();
    let ex = Executor::new(nic.clone(), cq, vec![qp], mr, ecfg).unwrap();
    (node, nic, ex)
}

#[test]
fn smoke() {
    let (_node, _, mut ex) = emu_executor(EmuConfig::default());
    let out = Rc::new(Cell::new(0u64));
    let o = out.clone();
    ex.spawn(move |ctx| async move {
        let a = GlobalAddr::host(1, 64);
        ctx.write(a, &42u64.to_le_bytes()).await.unwrap();
        let old = ctx.faa(a, 1).await.unwrap();
        assert_eq!(old, 42);
        let b = ctx.read(a, 8).await.unwrap();
        o.set(b.u64_at(0));
    })
    .unwrap();
    ex.run();
    assert_eq!(out.get(), 43);
    assert_eq!(ex.counters().round_trips, 3);
}

#[test]
fn bad_executor_configs_are_errors_not_panics() {
    let nic = EmuNic::new(EmuConfig::default());
    for cfg in [
        ExecutorConfig {
            slots: 0,
            ..Default::default()
        },
        ExecutorConfig {
            slots: 4,
            scratch_bytes_per_slot: 4095,
            ..Default::default()
        },
        ExecutorConfig {
            slots: 4,
            scratch_bytes_per_slot: usize::MAX - 7,
            ..Default::default()
        },
        ExecutorConfig {
            poll_batch: 0,
            ..Default::default()
        },
    ] {
        let cq = nic.create_cq(64).unwrap();
        let mr = nic
            .register(HeapMem::zeroed(1 << 20).unwrap(), Access::LOCAL_WRITE)
            .unwrap();
        match Executor::new(nic.clone(), cq, vec![], mr, cfg) {
            Err(ExecError::BadConfig(_)) => {}
            other => panic!("{cfg:?}: expected BadConfig, got {:?}", other.err()),
        }
    }
}

/// A queue pair made on another completion queue than the executor's is
/// refused: its completions would never reach this executor, which
/// reuses a batch's scratch once they are in.
#[test]
fn a_queue_pair_on_another_completion_queue_is_refused() {
    let node = emu_node();
    let nic = EmuNic::new(EmuConfig::default());
    let cfg = ExecutorConfig::default();
    let (mine, other) = (nic.create_cq(1024).unwrap(), nic.create_cq(1024).unwrap());
    assert_ne!(mine.id(), other.id());
    let qp = nic
        .create_qp(&other, cfg.qp_depth())
        .unwrap()
        .connect(&node.endpoint());
    assert_eq!(qp.cq_id(), other.id());
    let mr = nic
        .register(
            HeapMem::zeroed(cfg.scratch_bytes()).unwrap(),
            Access::LOCAL_WRITE,
        )
        .unwrap();
    match Executor::new(nic.clone(), mine, vec![qp], mr, cfg) {
        Err(ExecError::ForeignQp(1)) => {}
        other => panic!("expected ForeignQp(1), got {:?}", other.err()),
    }
}

/// `tasks` tasks of `each` sequential FAAs on an emu executor: the log of
/// (task, i) in completion order, and the turns run.
fn faa_tasks(cfg: EmuConfig, tasks: u8, each: u64) -> (Vec<(u8, u64)>, u64) {
    let (_node, nic, mut ex) = emu_executor(cfg);
    let log = Rc::new(std::cell::RefCell::new(Vec::new()));
    for t in 0..tasks {
        let (log, nic) = (log.clone(), nic.clone());
        ex.spawn(move |ctx| async move {
            let a = GlobalAddr::host(1, 64 * (t as u64 + 1));
            for i in 0..each {
                let posted = nic.now_ns();
                assert_eq!(ctx.faa(a, 1).await.unwrap(), i, "task {t}");
                // The clock a task stamps with is never before its last
                // completed batch was posted.
                assert!(ctx.now_ns() >= posted, "task {t}, FAA {i}: stale clock");
                log.borrow_mut().push((t, i));
            }
        })
        .unwrap();
    }
    ex.run();
    let turns = ex.turns();
    let log = log.borrow().clone();
    (log, turns)
}

#[test]
fn a_lone_task_sees_batches_complete_at_post_within_a_budget() {
    let each = 320;
    let (log, turns) = faa_tasks(EmuConfig::default(), 1, each);
    assert_eq!(log.len() as u64, each);
    // A poll sees up to INLINE_BUDGET batches complete at their post and
    // leaves the next to the turn: about one turn per budget, not one per
    // batch, and never fewer.
    let budget = exec::INLINE_BUDGET as u64;
    assert!(
        (each / (budget + 1)..=each / budget + 2).contains(&turns),
        "{turns} turns for {each} batches"
    );
}

#[test]
fn batches_wait_for_a_turn_among_tasks_or_when_the_nic_delays() {
    let each = 60;
    let (log, turns) = faa_tasks(EmuConfig::default(), 2, each);
    assert_eq!(log.len() as u64, 2 * each);
    assert!(
        turns >= each,
        "{turns} turns: two tasks' batches went inline"
    );
    let delayed = EmuConfig {
        latency_ns_one_way: 1_000,
        ..EmuConfig::default()
    };
    let (log, turns) = faa_tasks(delayed, 1, each);
    assert_eq!(log.len() as u64, each);
    assert!(
        turns >= each,
        "{turns} turns: a delayed batch completed at its post"
    );
}
