//! The chunk allocator on the simulator, under a link cut that heals.

use mempool::{ChunkConfig, RemoteAllocator};
use nicdrv::sim::{Fault, FaultKind, RunEnd, SimConfig, SimModel, World};
use nicdrv::ExecutorConfig;
use std::cell::RefCell;
use std::rc::Rc;

/// A refill that meets a cut link to a memory node takes its chunk from
/// another node; once the link heals, the node is asked again. It was set
/// aside for good, as a crashed one is: a client that met one cut took no
/// chunk from that node for the rest of its life.
#[test]
fn a_cut_link_sets_a_node_aside_only_until_it_heals() {
    let timeout = SimModel::default().transport_timeout_ns;
    let heal_at = 3 * timeout;
    let chunk = 8 << 10;
    let cfg = ChunkConfig {
        chunk_bytes: chunk,
        node_bytes: 1 << 20,
        per_node: vec![],
    };
    let mut w = World::new(SimConfig {
        seed: 1,
        memory_nodes: 2,
        host_bytes: 1 << 20,
        dm_bytes: 64 << 10,
        compute_nodes: 1,
        faults: vec![
            Fault {
                at_ns: 0,
                kind: FaultKind::CutLink {
                    compute: 0,
                    memory: 1,
                },
            },
            Fault {
                at_ns: heal_at,
                kind: FaultKind::HealLink {
                    compute: 0,
                    memory: 1,
                },
            },
        ],
        ..Default::default()
    })
    .unwrap();
    let th = w
        .add_thread(
            0,
            ExecutorConfig {
                slots: 1,
                ..Default::default()
            },
        )
        .unwrap();
    // (node of each chunk-sized allocation, whether it came after the heal).
    let got: Rc<RefCell<Vec<(u16, bool)>>> = Rc::default();
    let out = got.clone();
    w.spawn(th, move |ctx| async move {
        let a = RemoteAllocator::new(cfg).unwrap();
        for _ in 0..6 {
            if out.borrow().len() == 2 {
                // Past the heal: the executor's next post repairs the
                // queue pair to node 1.
                while ctx.now_ns() < heal_at + timeout {
                    ctx.yield_now().await;
                }
            }
            let at = a.alloc(&ctx, chunk, 8).await.expect("a live node has room");
            out.borrow_mut().push((at.node(), ctx.now_ns() > heal_at));
        }
    })
    .unwrap();
    assert_eq!(w.run_until(1_000_000_000), RunEnd::Done);
    let got = got.borrow();
    // The first refill on node 0; the second met the cut on node 1 and
    // went on to node 0.
    assert_eq!(got[..2], [(0, false), (0, false)], "{got:?}");
    // After the heal, the round robin reaches node 1 again.
    assert!(
        got[2..].iter().any(|&(node, healed)| node == 1 && healed),
        "{got:?}"
    );
}
