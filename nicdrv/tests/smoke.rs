use nicdrv::emu::{Backing, EmuConfig, EmuNic, EmuNode, EmuNodeConfig};
use nicdrv::*;
use std::cell::Cell;
use std::rc::Rc;

#[test]
fn smoke() {
    let node = EmuNode::create(&EmuNodeConfig {
        id: 1,
        host_bytes: 1 << 20,
        dm_bytes: 4096,
        backing: Backing::Memfd,
    })
    .unwrap();
    node.register_all().unwrap();
    let nic = EmuNic::new(EmuConfig::default());
    let cfg = ExecutorConfig::default();
    let cq = nic.create_cq(1024).unwrap();
    let qp = nic
        .create_qp(&cq, cfg.qp_depth())
        .unwrap()
        .connect(&node.endpoint());
    let mr = nic
        .register(
            HeapMem::zeroed(cfg.scratch_bytes()).unwrap(),
            Access::LOCAL_WRITE,
        )
        .unwrap();
    let mut ex = Executor::new(nic, cq, vec![qp], mr, cfg).unwrap();
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
