//! The remote chunk allocator against emu memory nodes: concurrent tasks on
//! one executor, executors on several threads, exhaustion, a dead node and
//! refused requests. Each test checks the whole history (common::check_history)
//! and the cursor words the memory nodes end with.

mod common;

use common::{check_history, chunk_of, cursor, exec_cfg, executor, make_nodes, Alloc, Rng};
use mempool::{first_chunk_off, AllocError, ChunkConfig, RemoteAllocator};
use nicdrv::{GlobalAddr, NodeId, VerbCounters};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::rc::Rc;
use std::sync::{mpsc, Arc, Barrier};

const CHUNK: u64 = 64 << 10;
const ALIGNS: [u64; 6] = [1, 8, 16, 64, 256, 4096];

fn cfg_with(chunks_per_node: u64) -> ChunkConfig {
    ChunkConfig {
        chunk_bytes: CHUNK,
        // A tail smaller than a chunk, to check it is never used.
        node_bytes: first_chunk_off() + chunks_per_node * CHUNK + 4088,
        per_node: vec![],
    }
}

/// The nodes of distinct chunks in the order an allocator first used them.
fn chunk_sequence(cfg: &ChunkConfig, allocs: &[Alloc], allocator: usize) -> Vec<(NodeId, u64)> {
    let mut seen = BTreeSet::new();
    let mut seq = vec![];
    for a in allocs.iter().filter(|a| a.allocator == allocator) {
        let c = chunk_of(cfg, a.addr);
        if seen.insert(c) {
            seq.push(c);
        }
    }
    seq
}

/// Eight tasks on one executor: six with their own allocator, two sharing
/// one through an Rc, interleaving with yields.
#[test]
fn one_executor_many_tasks() {
    let cfg = cfg_with(40);
    let ids = [0, 1, 2];
    let nodes = make_nodes(&ids, &cfg);
    let eps: Vec<_> = nodes.iter().map(|n| n.endpoint()).collect();
    let mut ex = executor(&eps, exec_cfg(8));
    let log: Rc<RefCell<Vec<Alloc>>> = Rc::default();
    let shared = Rc::new(RemoteAllocator::new(cfg.clone()).unwrap());
    let own: Vec<Rc<RemoteAllocator>> = (0..6)
        .map(|_| Rc::new(RemoteAllocator::new(cfg.clone()).unwrap()))
        .collect();
    let faa_by_task: Rc<RefCell<Vec<(usize, u64)>>> = Rc::default();
    // Allocators 0..6 are private; allocator 6 is shared by tasks 6 and 7.
    let allocators = own.iter().chain([&shared, &shared]).enumerate();
    for (task, alloc) in allocators {
        let (id, alloc) = (task.min(6), alloc.clone());
        let (log, faa_by_task) = (log.clone(), faa_by_task.clone());
        ex.spawn(move |ctx| async move {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ task as u64);
            for i in 0..300 {
                let bytes = 1 + rng.below(2048);
                let align = ALIGNS[rng.below(ALIGNS.len() as u64) as usize];
                let addr = alloc.alloc(&ctx, bytes, align).await.unwrap();
                log.borrow_mut().push(Alloc {
                    addr,
                    bytes,
                    align,
                    allocator: id,
                });
                if i % 7 == 0 {
                    ctx.yield_now().await;
                }
            }
            faa_by_task.borrow_mut().push((task, ctx.counters().faa));
        })
        .unwrap();
    }
    ex.run();
    let log = log.borrow();
    assert_eq!(log.len(), 8 * 300);
    let chunks = check_history(&cfg, &log);

    // Each node handed out exactly chunks 0..cursor, each to one allocator.
    let mut total = 0;
    for node in &nodes {
        let used = chunks.get(&node.id()).cloned().unwrap_or_default();
        assert_eq!(used, (0..cursor(node)).collect(), "node {}", node.id());
        total += used.len() as u64;
    }
    let faa: Vec<(usize, u64)> = faa_by_task.borrow().clone();
    let faa_of = |t: usize| faa.iter().find(|&&(x, _)| x == t).unwrap().1;
    assert_eq!((0..8).map(faa_of).sum::<u64>(), total, "one FAA per chunk");
    assert_eq!(ex.counters().faa, total);
    assert_eq!(ex.counters().verbs(), total, "no verb but the FAAs");

    // Private allocators: one FAA per chunk, chunks round-robin 0,1,2,0,...
    for (id, alloc) in own.iter().enumerate() {
        let seq = chunk_sequence(&cfg, &log, id);
        assert!(seq.len() >= 3, "allocator {id} used only {seq:?}");
        assert_eq!(alloc.chunks_taken(), seq.len() as u64);
        assert_eq!(faa_of(id), seq.len() as u64);
        let nodes_seq: Vec<NodeId> = seq.iter().map(|c| c.0).collect();
        let want: Vec<NodeId> = (0..seq.len()).map(|k| ids[k % 3]).collect();
        assert_eq!(nodes_seq, want, "allocator {id} is not round-robin");
    }
    // The shared allocator: its two tasks' FAAs took exactly its chunks,
    // spread over every node.
    let seq = chunk_sequence(&cfg, &log, 6);
    assert_eq!(shared.chunks_taken(), seq.len() as u64);
    assert_eq!(faa_of(6) + faa_of(7), seq.len() as u64);
    let on: BTreeSet<NodeId> = seq.iter().map(|c| c.0).collect();
    assert_eq!(on.len(), 3, "shared allocator used only nodes {on:?}");
}

/// Three OS threads, each with its own EmuNic, executor and four tasks,
/// allocate from the same two memory nodes of different sizes.
#[test]
fn executors_on_several_threads() {
    let mut cfg = cfg_with(96);
    cfg.per_node = vec![(1, first_chunk_off() + 80 * CHUNK)];
    let nodes = make_nodes(&[0, 1], &cfg);
    let (tx, rx) = mpsc::channel::<(Vec<Alloc>, Vec<(usize, u64, u64)>)>();
    let start = Arc::new(Barrier::new(3));
    let threads: Vec<_> = (0..3usize)
        .map(|t| {
            let eps: Vec<_> = nodes.iter().map(|n| n.endpoint()).collect();
            let (cfg, tx, start) = (cfg.clone(), tx.clone(), start.clone());
            std::thread::spawn(move || {
                let mut ex = executor(&eps, exec_cfg(4));
                let log: Rc<RefCell<Vec<Alloc>>> = Rc::default();
                let faas: Rc<RefCell<Vec<(usize, u64, u64)>>> = Rc::default();
                for task in 0..4usize {
                    let id = t * 4 + task;
                    let (log, faas, cfg) = (log.clone(), faas.clone(), cfg.clone());
                    ex.spawn(move |ctx| async move {
                        let alloc = RemoteAllocator::new(cfg).unwrap();
                        let mut rng = Rng(0xD1B5_4A32_D192_ED03 ^ id as u64);
                        for i in 0..250 {
                            let bytes = 1 + rng.below(3000);
                            let align = ALIGNS[rng.below(ALIGNS.len() as u64) as usize];
                            let addr = alloc.alloc(&ctx, bytes, align).await.unwrap();
                            log.borrow_mut().push(Alloc {
                                addr,
                                bytes,
                                align,
                                allocator: id,
                            });
                            if i % 5 == 0 {
                                ctx.yield_now().await;
                            }
                        }
                        faas.borrow_mut()
                            .push((id, ctx.counters().faa, alloc.chunks_taken()));
                    })
                    .unwrap();
                }
                // Start together, so the executors really race.
                start.wait();
                ex.run();
                let out = (log.borrow().clone(), faas.borrow().clone());
                tx.send(out).unwrap();
            })
        })
        .collect();
    drop(tx);
    for t in threads {
        t.join().expect("allocator thread panicked");
    }
    let mut log = vec![];
    let mut faas = vec![];
    for (l, f) in rx {
        log.extend(l);
        faas.extend(f);
    }
    assert_eq!(log.len(), 12 * 250);
    assert_eq!(faas.len(), 12);
    let chunks = check_history(&cfg, &log);
    let mut total = 0;
    for node in &nodes {
        let used = chunks.get(&node.id()).cloned().unwrap_or_default();
        assert!(!used.is_empty(), "node {} got no chunk", node.id());
        assert_eq!(used, (0..cursor(node)).collect(), "node {}", node.id());
        total += used.len() as u64;
    }
    assert_eq!(faas.iter().map(|f| f.1).sum::<u64>(), total);
    for &(id, faa, taken) in &faas {
        let seq = chunk_sequence(&cfg, &log, id);
        assert_eq!(
            (faa, taken),
            (seq.len() as u64, seq.len() as u64),
            "task {id}"
        );
    }
}

/// How an exhausting task ended: (allocator id, the error that stopped it,
/// the error of one more attempt, counters before and after that attempt).
type TaskEnd = (usize, AllocError, AllocError, VerbCounters, VerbCounters);

/// Runs `tasks` tasks on one executor, each taking whole chunks with its own
/// allocator until it gets an error, then trying once more. Returns every
/// allocation and how each task ended.
fn exhaust(
    eps: Vec<nicdrv::emu::EmuEndpoint>,
    cfg: &ChunkConfig,
    tasks: usize,
    first_id: usize,
    start: &Barrier,
) -> (Vec<Alloc>, Vec<TaskEnd>) {
    let mut ex = executor(&eps, exec_cfg(tasks));
    let log: Rc<RefCell<Vec<Alloc>>> = Rc::default();
    let ends: Rc<RefCell<Vec<TaskEnd>>> = Rc::default();
    for task in 0..tasks {
        let id = first_id + task;
        let (log, ends, cfg) = (log.clone(), ends.clone(), cfg.clone());
        ex.spawn(move |ctx| async move {
            let alloc = RemoteAllocator::new(cfg.clone()).unwrap();
            let err = loop {
                match alloc.alloc(&ctx, cfg.chunk_bytes, 4096).await {
                    Ok(addr) => {
                        log.borrow_mut().push(Alloc {
                            addr,
                            bytes: cfg.chunk_bytes,
                            align: 4096,
                            allocator: id,
                        });
                        ctx.yield_now().await;
                    }
                    Err(e) => break e,
                }
            };
            let before = ctx.counters();
            let again = alloc.alloc(&ctx, 8, 8).await.unwrap_err();
            let after = ctx.counters();
            ends.borrow_mut().push((id, err, again, before, after));
        })
        .unwrap();
    }
    start.wait();
    ex.run();
    let out = (log.borrow().clone(), ends.borrow().clone());
    out
}

/// Two threads of three tasks each drain two nodes of 5 and 3 chunks:
/// exactly 8 chunks are handed out, everyone ends with OutOfMemory, and
/// every allocator spent one FAA per chunk plus one per node it found full.
#[test]
fn exhaustion_is_out_of_memory_with_exact_chunk_count() {
    let chunk = 8 << 10;
    let cfg = ChunkConfig {
        chunk_bytes: chunk,
        node_bytes: first_chunk_off() + 5 * chunk,
        per_node: vec![(1, first_chunk_off() + 3 * chunk + 4096)],
    };
    let nodes = make_nodes(&[0, 1], &cfg);
    let start = Arc::new(Barrier::new(2));
    let threads: Vec<_> = (0..2usize)
        .map(|t| {
            let eps: Vec<_> = nodes.iter().map(|n| n.endpoint()).collect();
            let (cfg, start) = (cfg.clone(), start.clone());
            std::thread::spawn(move || exhaust(eps, &cfg, 3, t * 3, &start))
        })
        .collect();
    let mut log = vec![];
    let mut ends = vec![];
    for t in threads {
        let (l, e) = t.join().expect("thread panicked");
        log.extend(l);
        ends.extend(e);
    }
    assert_eq!(log.len(), 8, "chunks handed out must equal capacity");
    let chunks = check_history(&cfg, &log);
    assert_eq!(chunks[&0], (0..5).collect());
    assert_eq!(chunks[&1], (0..3).collect());
    assert_eq!(ends.len(), 6);
    for (id, err, again, before, after) in &ends {
        assert_eq!(
            *err,
            AllocError::OutOfMemory { requested: chunk },
            "task {id}"
        );
        assert_eq!(
            *again,
            AllocError::OutOfMemory { requested: 8 },
            "task {id}"
        );
        assert_eq!(before, after, "task {id} spent verbs on known-full nodes");
        let got = log.iter().filter(|a| a.allocator == *id).count() as u64;
        assert_eq!(
            before.faa,
            got + 2,
            "task {id}: one FAA per chunk + one per full node"
        );
        assert_eq!(before.errors, 0);
    }
    // Each of the 6 allocators did exactly one FAA past each node's end.
    assert_eq!(cursor(&nodes[0]), 5 + 6);
    assert_eq!(cursor(&nodes[1]), 3 + 6);
}

/// A dead memory node is skipped after one failed FAA; when the live nodes
/// are full the error is the dead node's verb error, not OutOfMemory.
#[test]
fn dead_node_is_skipped() {
    let chunk = 8 << 10;
    let cfg = ChunkConfig {
        chunk_bytes: chunk,
        node_bytes: first_chunk_off() + 4 * chunk,
        per_node: vec![],
    };
    let mut nodes = make_nodes(&[0, 1, 2], &cfg);
    let eps: Vec<_> = nodes.iter().map(|n| n.endpoint()).collect();
    // Node 1's owner goes away: verbs to it now fail.
    drop(nodes.remove(1));
    let (log, ends) = exhaust(eps, &cfg, 1, 0, &Barrier::new(1));
    assert_eq!(log.len(), 8);
    let chunks = check_history(&cfg, &log);
    assert_eq!(chunks.keys().copied().collect::<Vec<_>>(), vec![0, 2]);
    let (_, err, again, before, after) = &ends[0];
    match err {
        AllocError::Verb(e) => assert!(e.is_node_dead(), "{e}"),
        e => panic!("expected the dead node's error, got {e}"),
    }
    assert_eq!(err, again);
    assert_eq!(before.faa, after.faa, "no FAA to dead or full nodes");
    assert_eq!(before.faa, 8 + 1 + 2, "chunks + one dead + two full");
    assert_eq!(cursor(&nodes[0]), 4 + 1);
    assert_eq!(cursor(&nodes[1]), 4 + 1);
}

/// Bad requests and configs are errors, cost no verb and panic nowhere.
#[test]
fn refused_requests_cost_nothing() {
    let cfg = cfg_with(4);
    let nodes = make_nodes(&[0], &cfg);
    let eps: Vec<_> = nodes.iter().map(|n| n.endpoint()).collect();
    let mut ex = executor(&eps, exec_cfg(2));
    let too_big = ChunkConfig {
        node_bytes: cfg.node_bytes + 2 * CHUNK,
        ..cfg.clone()
    };
    let results: Rc<RefCell<Vec<AllocError>>> = Rc::default();
    let r = results.clone();
    ex.spawn(move |ctx| async move {
        let a = RemoteAllocator::new(cfg.clone()).unwrap();
        let push = |e: AllocError| r.borrow_mut().push(e);
        push(a.alloc(&ctx, 0, 8).await.unwrap_err());
        push(a.alloc(&ctx, 8, 3).await.unwrap_err());
        push(a.alloc(&ctx, 8, 0).await.unwrap_err());
        push(a.alloc(&ctx, 8, 8192).await.unwrap_err());
        push(a.alloc(&ctx, CHUNK + 1, 8).await.unwrap_err());
        // A config claiming more memory than the node registered.
        let b = RemoteAllocator::new(too_big).unwrap();
        push(b.alloc(&ctx, 8, 8).await.unwrap_err());
        assert_eq!(ctx.counters().verbs(), 0);
        assert_eq!(a.chunks_taken() + b.chunks_taken(), 0);
    })
    .unwrap();
    ex.run();
    let got = results.borrow();
    assert_eq!(got[0], AllocError::ZeroBytes);
    assert_eq!(got[1], AllocError::BadAlign { align: 3 });
    assert_eq!(got[2], AllocError::BadAlign { align: 0 });
    assert_eq!(got[3], AllocError::BadAlign { align: 8192 });
    assert_eq!(
        got[4],
        AllocError::TooLarge {
            requested: CHUNK + 1,
            chunk_bytes: CHUNK
        }
    );
    assert!(
        matches!(&got[5], AllocError::BadConfig(s) if s.contains("node 0")),
        "{}",
        got[5]
    );
    assert_eq!(cursor(&nodes[0]), 0);
    for e in got.iter() {
        assert!(!e.to_string().is_empty());
    }
}

/// A core with no memory node gets NoNodes, not a panic.
#[test]
fn no_nodes_is_an_error() {
    let mut ex = executor(&[], exec_cfg(1));
    let out: Rc<RefCell<Option<AllocError>>> = Rc::default();
    let o = out.clone();
    ex.spawn(move |ctx| async move {
        let a = RemoteAllocator::new(cfg_with(4)).unwrap();
        *o.borrow_mut() = a.alloc(&ctx, 8, 8).await.err();
    })
    .unwrap();
    ex.run();
    assert_eq!(*out.borrow(), Some(AllocError::NoNodes));
}

/// `alloc_on` carves from chunks of the node asked for, beside the
/// round-robin chunk of plain `alloc`, until that node is out of chunks;
/// then (and for a node the core does not reach) it falls back to any
/// node. No byte is handed out twice, and every chunk is counted.
#[test]
fn alloc_on_keeps_to_its_node_until_it_is_full() {
    let cfg = cfg_with(4);
    let ids = [0, 1, 2];
    let nodes = make_nodes(&ids, &cfg);
    let eps: Vec<_> = nodes.iter().map(|n| n.endpoint()).collect();
    let mut ex = executor(&eps, exec_cfg(2));
    // Each allocation with the node it asked for (None: any).
    type Log = Vec<(Alloc, Option<NodeId>)>;
    let log: Rc<RefCell<Log>> = Rc::default();
    let alloc = Rc::new(RemoteAllocator::new(cfg.clone()).unwrap());
    for task in 0..2u64 {
        let (log, alloc) = (log.clone(), alloc.clone());
        ex.spawn(move |ctx| async move {
            let mut rng = Rng(0xA076_1D64_78BD_642F ^ task);
            for i in 0..400 {
                let bytes = 1 + rng.below(4096);
                let align = ALIGNS[rng.below(ALIGNS.len() as u64) as usize];
                // Mostly node 1, sometimes any node, sometimes a node the
                // core has no queue pair to.
                let want = match i % 5 {
                    0 => None,
                    1 => Some(9),
                    _ => Some(1),
                };
                let addr = match want {
                    Some(n) => alloc.alloc_on(&ctx, n, bytes, align).await,
                    None => alloc.alloc(&ctx, bytes, align).await,
                };
                let Ok(addr) = addr else { break };
                let a = Alloc {
                    addr,
                    bytes,
                    align,
                    allocator: 0,
                };
                log.borrow_mut().push((a, want));
                if i % 3 == 0 {
                    ctx.yield_now().await;
                }
            }
        })
        .unwrap();
    }
    ex.run();
    let log = log.borrow();
    let allocs: Vec<Alloc> = log.iter().map(|(a, _)| *a).collect();
    let chunks = check_history(&cfg, &allocs);
    // Node 1 gave out all its chunks; while it had room, every request
    // for it was served there.
    assert_eq!(
        chunks[&1],
        (0..4).collect::<BTreeSet<u64>>(),
        "node 1 was not used up"
    );
    assert!(cursor(&nodes[1]) >= 4);
    let first_elsewhere = log
        .iter()
        .position(|(a, w)| *w == Some(1) && a.addr.node() != 1)
        .expect("requests for node 1 outlived its chunks");
    // It fell back only once all four chunks of node 1 were taken.
    let before: BTreeSet<u64> = log[..first_elsewhere]
        .iter()
        .map(|(a, _)| chunk_of(&cfg, a.addr))
        .filter(|c| c.0 == 1)
        .map(|c| c.1)
        .collect();
    assert_eq!(
        before.len(),
        4,
        "node 1 fell back with chunks left: {before:?}"
    );
    // A node the core does not reach: served elsewhere, never an error.
    assert!(log.iter().any(|(_, w)| *w == Some(9)));
    assert!(log.iter().all(|(a, w)| *w != Some(9) || a.addr.node() != 9));
    let used: u64 = ids
        .iter()
        .map(|&n| chunks.get(&n).map_or(0, |c| c.len() as u64))
        .sum();
    assert_eq!(alloc.chunks_taken(), used, "one FAA per chunk");
}

/// `take_rests` hands over the unused rest of every chunk the allocator
/// carves (its round-robin chunk and node 1's `alloc_on` chunk), each
/// aligned as asked and running to its chunk's end, once: no byte of a
/// rest was handed out before, none is after (the next allocations take
/// fresh chunks), and a second call right after hands over nothing.
#[test]
fn the_rests_of_its_chunks_are_handed_over_once() {
    let cfg = cfg_with(8);
    let ids = [0, 1];
    let nodes = make_nodes(&ids, &cfg);
    let eps: Vec<_> = nodes.iter().map(|n| n.endpoint()).collect();
    let mut ex = executor(&eps, exec_cfg(1));
    let log: Rc<RefCell<Vec<Alloc>>> = Rc::default();
    let rests: Rc<RefCell<Vec<(GlobalAddr, u64)>>> = Rc::default();
    let (l, r, c) = (log.clone(), rests.clone(), cfg.clone());
    ex.spawn(move |ctx| async move {
        let alloc = RemoteAllocator::new(c).unwrap();
        assert!(alloc.take_rests(64).is_empty(), "no chunk yet");
        let push = |addr, bytes, align| {
            l.borrow_mut().push(Alloc {
                addr,
                bytes,
                align,
                allocator: 0,
            })
        };
        for _round in 0..2 {
            for i in 0..10u64 {
                let bytes = 100 + 37 * i;
                let a = if i % 2 == 0 {
                    alloc.alloc(&ctx, bytes, 8).await
                } else {
                    alloc.alloc_on(&ctx, 1, bytes, 8).await
                };
                push(a.unwrap(), bytes, 8);
            }
            let got = alloc.take_rests(64);
            assert_eq!(got.len(), 2, "{got:?}");
            for &(a, n) in &got {
                assert_eq!(a.offset() % 64, 0);
                push(a, n, 64);
                r.borrow_mut().push((a, n));
            }
            assert!(alloc.take_rests(64).is_empty(), "handed over twice");
        }
    })
    .unwrap();
    ex.run();
    let chunks = check_history(&cfg, &log.borrow());
    assert_eq!(chunks.values().map(|c| c.len()).sum::<usize>(), 4);
    let rests = rests.borrow();
    assert_eq!(rests.len(), 4);
    for &(a, n) in rests.iter() {
        assert_eq!(
            (a.offset() + n - first_chunk_off()) % CHUNK,
            0,
            "the rest at {a} of {n} bytes ends before its chunk"
        );
    }
}
