//! Property test: random allocation sizes and alignments on emu nodes. Every
//! outcome is compared with a reference model of the documented policy
//! (bump in the current chunk; on a miss take the next chunk round-robin,
//! skipping full nodes, and keep whichever of the two chunks has more room),
//! and the whole history is
//! checked for overlap, alignment and bounds.

mod common;

use common::{check_history, cursor, exec_cfg, executor, make_nodes, Alloc};
use mempool::{first_chunk_off, AllocError, ChunkConfig, RemoteAllocator, CHUNK_ALIGN};
use nicdrv::GlobalAddr;
use proptest::prelude::*;
use std::cell::RefCell;
use std::rc::Rc;

const CHUNK: u64 = 8 << 10;
const NODES: [u16; 2] = [0, 3];

/// The policy chunk.rs documents, for a single allocator.
struct Model {
    cfg: ChunkConfig,
    cur: Option<(u16, u64, u64)>,
    next_node: usize,
    full: [bool; 2],
    cursors: [u64; 2],
}

impl Model {
    fn alloc(&mut self, bytes: u64, align: u64) -> Result<GlobalAddr, AllocError> {
        if !align.is_power_of_two() || align > CHUNK_ALIGN {
            return Err(AllocError::BadAlign { align });
        }
        let len = bytes.div_ceil(8) * 8;
        let align = align.max(8);
        if let Some((node, next, end)) = self.cur {
            let start = next.div_ceil(align) * align;
            if start + len <= end {
                self.cur = Some((node, start + len, end));
                return Ok(GlobalAddr::host(node, start));
            }
        }
        let start = self.next_node;
        self.next_node = (start + 1) % 2;
        for k in 0..2 {
            let i = (start + k) % 2;
            if self.full[i] {
                continue;
            }
            let index = self.cursors[i];
            self.cursors[i] += 1;
            if index < self.cfg.chunks_on(NODES[i]) {
                self.next_node = (i + 1) % 2;
                let off = first_chunk_off() + index * CHUNK;
                // Keep the old chunk if it has more room than the new one.
                let fresh = (NODES[i], off + len, off + CHUNK);
                match self.cur {
                    Some((_, next, end)) if end - next >= CHUNK - len => {}
                    _ => self.cur = Some(fresh),
                }
                return Ok(GlobalAddr::host(NODES[i], off));
            }
            self.full[i] = true;
        }
        Err(AllocError::OutOfMemory { requested: bytes })
    }
}

fn request() -> impl Strategy<Value = (u64, u64)> {
    // Mostly small, sometimes whole chunks; alignments 1..=8192 (8192 is
    // refused).
    let bytes = prop_oneof![4 => 1u64..=512, 2 => 1u64..=CHUNK, 1 => Just(CHUNK)];
    (bytes, (0u32..=13).prop_map(|p| 1u64 << p))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        // Print the failing case; write no regression files into the tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_requests_follow_the_model(
        reqs in prop::collection::vec(request(), 1..120),
        chunks in (3u64..10, 1u64..6),
    ) {
        let cfg = ChunkConfig {
            chunk_bytes: CHUNK,
            node_bytes: first_chunk_off() + chunks.0 * CHUNK,
            per_node: vec![(3, first_chunk_off() + chunks.1 * CHUNK + 8)],
        };
        let nodes = make_nodes(&NODES, &cfg);
        let eps: Vec<_> = nodes.iter().map(|n| n.endpoint()).collect();
        let mut ex = executor(&eps, exec_cfg(1));
        let got: Rc<RefCell<Vec<Result<GlobalAddr, AllocError>>>> = Rc::default();
        let (g, c, r) = (got.clone(), cfg.clone(), reqs.clone());
        ex.spawn(move |ctx| async move {
            let a = RemoteAllocator::new(c).unwrap();
            for (bytes, align) in r {
                let res = a.alloc(&ctx, bytes, align).await;
                g.borrow_mut().push(res);
            }
        })
        .unwrap();
        ex.run();

        let mut model = Model {
            cfg: cfg.clone(),
            cur: None,
            next_node: 0,
            full: [false; 2],
            cursors: [0; 2],
        };
        let got = got.borrow();
        let mut history = vec![];
        for (i, (&(bytes, align), res)) in reqs.iter().zip(got.iter()).enumerate() {
            prop_assert_eq!(res, &model.alloc(bytes, align), "request {}: {} bytes align {}", i, bytes, align);
            if let Ok(addr) = res {
                history.push(Alloc { addr: *addr, bytes, align, allocator: 0 });
            }
        }
        check_history(&cfg, &history);
        prop_assert_eq!(cursor(&nodes[0]), model.cursors[0]);
        prop_assert_eq!(cursor(&nodes[1]), model.cursors[1]);
        prop_assert_eq!(ex.counters().faa, model.cursors[0] + model.cursors[1]);
    }
}
