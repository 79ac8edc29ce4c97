use super::*;
use bootstrap::config::{Backend, ClusterConfig};
use bootstrap::config::{HugePages, NodeConfig, Roles};
use bootstrap::wire::{Endpoint as WireEndpoint, QpInfo, Region, Space as WireSpace};
use bootstrap::Directory;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

fn qp(qpn: u32) -> QpInfo {
    QpInfo {
        qpn,
        lid: 1,
        gid: [0; 16],
        psn: qpn & 0xff_ffff,
        mtu: 5,
        rd_atom: 16,
    }
}

/// Memory nodes 0 and 1; compute node 2 with 2 cores.
fn small() -> Topology {
    Topology::new(vec![1, 0], vec![(2, 2)]).unwrap()
}

fn request(compute: u32, lane: u32, memory: u32, qpn: u32) -> WireEndpoint {
    WireEndpoint {
        node_id: compute,
        peer_id: pack_peer(memory, lane).unwrap(),
        qp: qp(qpn),
    }
}

fn reply(memory: u32, compute: u32, lane: u32, qpn: u32) -> WireEndpoint {
    WireEndpoint {
        node_id: memory,
        peer_id: pack_peer(compute, lane).unwrap(),
        qp: qp(qpn),
    }
}

fn all_requests() -> Vec<WireEndpoint> {
    let mut v = Vec::new();
    for lane in 0..2 {
        for m in 0..2 {
            v.push(request(2, lane, m, 100 + lane * 10 + m));
        }
    }
    v
}

fn all_replies() -> Vec<WireEndpoint> {
    let mut v = Vec::new();
    for lane in 0..2 {
        for m in 0..2 {
            v.push(reply(m, 2, lane, 500 + lane * 10 + m));
        }
    }
    v
}

#[test]
fn peer_ids_pack_node_and_lane() {
    assert_eq!(pack_peer(3, 0), Ok(3));
    assert_eq!(pack_peer(3, 2), Ok(3 | 2 << 16));
    assert_eq!(pack_peer(ID_MAX, ID_MAX), Ok(u32::MAX));
    for (p, l) in [(0, 0), (7, 9), (ID_MAX, 1), (1, ID_MAX)] {
        assert_eq!(unpack_peer(pack_peer(p, l).unwrap()), (p, l));
    }
    assert_eq!(
        pack_peer(ID_MAX + 1, 0),
        Err(PairError::IdTooLarge { node: ID_MAX + 1 })
    );
    assert!(pack_peer(1, ID_MAX + 1).is_err());
}

#[test]
fn topology_sorts_and_bounds_ids_and_records() {
    let t = small();
    assert_eq!(t.memory, vec![0, 1]);
    assert!(t.is_memory(1) && !t.is_memory(2));
    assert_eq!((t.cores_of(2), t.cores_of(0)), (Some(2), None));
    assert_eq!(t.links().count(), 4);
    assert_eq!(
        Topology::new(vec![70_000], vec![]),
        Err(PairError::IdTooLarge { node: 70_000 })
    );
    assert_eq!(
        Topology::new(vec![0], vec![(70_000, 1)]),
        Err(PairError::IdTooLarge { node: 70_000 })
    );
    // 64 cores × 65 memory nodes = 4160 endpoints from one node.
    let err = Topology::new((0..65).collect(), vec![(100, 64)]).unwrap_err();
    assert_eq!(
        err,
        PairError::TooManyRecords {
            node: 100,
            records: 4160
        }
    );
    assert!(err.to_string().contains("4096"), "{err}");
}

#[test]
fn requests_pair_each_core_with_each_memory_node() {
    let t = small();
    let r0 = requests_for(&t, &all_requests(), 0).unwrap();
    let got: Vec<(u32, u32)> = r0.iter().map(|(l, q)| (l.lane, q.qpn)).collect();
    assert_eq!(got, vec![(0, 100), (1, 110)]);
    assert!(r0.iter().all(|(l, _)| l.compute == 2 && l.memory == 0));
    let r1 = requests_for(&t, &all_requests(), 1).unwrap();
    assert_eq!(
        r1.iter().map(|(_, q)| q.qpn).collect::<Vec<_>>(),
        [101, 111]
    );
    // Order of records does not matter (the rendezvous sorts them).
    let mut rev = all_requests();
    rev.reverse();
    assert_eq!(requests_for(&t, &rev, 1).unwrap(), r1);
}

#[test]
fn replies_come_back_per_core_in_memory_order() {
    let t = small();
    let lanes = replies_for(&t, &all_replies(), 2).unwrap();
    assert_eq!(lanes.len(), 2);
    for (lane, v) in lanes.iter().enumerate() {
        let ids: Vec<(u32, u32)> = v.iter().map(|(l, q)| (l.memory, q.qpn)).collect();
        let lane = lane as u32;
        assert_eq!(ids, vec![(0, 500 + lane * 10), (1, 501 + lane * 10)]);
    }
    // A memory-only node asking for its replies is told it has none.
    assert_eq!(
        replies_for(&t, &all_replies(), 0),
        Err(PairError::NotCompute {
            round: Round::Replies,
            node: 0
        })
    );
}

#[test]
fn records_round_trip_through_the_builders() {
    let t = small();
    let lanes: Vec<Vec<(u32, QpInfo)>> = (0..2)
        .map(|lane| (0..2).map(|m| (m, qp(100 + lane * 10 + m))).collect())
        .collect();
    let mut recs = request_records(2, &lanes).unwrap();
    recs.sort();
    let mut want = all_requests();
    want.sort();
    assert_eq!(recs, want);
    let accepted: Vec<(Link, QpInfo)> = requests_for(&t, &recs, 1)
        .unwrap()
        .into_iter()
        .map(|(l, q)| (l, qp(q.qpn + 400)))
        .collect();
    let out = reply_records(1, &accepted).unwrap();
    assert_eq!(out, vec![reply(1, 2, 0, 501), reply(1, 2, 1, 511)]);
}

#[test]
fn bad_request_sets_are_clear_errors() {
    let t = small();
    let round = Round::Requests;
    let with = |extra: WireEndpoint| {
        let mut v = all_requests();
        v.push(extra);
        links_of(&t, &v, round).unwrap_err()
    };
    let link = Link {
        compute: 2,
        lane: 1,
        memory: 0,
    };
    assert_eq!(
        with(request(2, 1, 0, 999)),
        PairError::Duplicate { round, link }
    );
    assert_eq!(
        with(request(9, 0, 0, 1)),
        PairError::UnknownNode { round, node: 9 }
    );
    assert_eq!(
        with(request(2, 0, 9, 1)),
        PairError::UnknownNode { round, node: 9 }
    );
    // A memory node publishing a request, and a request to a compute node.
    assert_eq!(
        with(request(0, 0, 1, 1)),
        PairError::NotCompute { round, node: 0 }
    );
    assert_eq!(
        with(request(2, 0, 2, 1)),
        PairError::NotMemory { round, node: 2 }
    );
    assert_eq!(
        with(request(2, 2, 0, 1)),
        PairError::LaneOutOfRange {
            round,
            node: 2,
            lane: 2,
            cores: 2
        }
    );
    let mut short = all_requests();
    short.retain(|e| e.peer_id != pack_peer(0, 1).unwrap());
    let e = links_of(&t, &short, round).unwrap_err();
    assert_eq!(e, PairError::Missing { round, link });
    assert_eq!(
        e.to_string(),
        "exchange 1 (compute endpoints): no record for compute node 2 core 1 ↔ memory node 0"
    );
    assert!(matches!(
        links_of(&t, &[], round),
        Err(PairError::Missing { .. })
    ));
}

#[test]
fn bad_reply_sets_are_clear_errors() {
    let t = small();
    let round = Round::Replies;
    let with = |extra: WireEndpoint| {
        let mut v = all_replies();
        v.push(extra);
        replies_for(&t, &v, 2).unwrap_err()
    };
    assert!(matches!(
        with(reply(1, 2, 0, 7)),
        PairError::Duplicate { .. }
    ));
    assert_eq!(
        with(reply(2, 2, 0, 7)),
        PairError::NotMemory { round, node: 2 }
    );
    assert_eq!(
        with(reply(0, 1, 0, 7)),
        PairError::NotCompute { round, node: 1 }
    );
    assert_eq!(
        with(reply(0, 40, 0, 7)),
        PairError::UnknownNode { round, node: 40 }
    );
    let mut short = all_replies();
    short.pop();
    assert!(matches!(
        replies_for(&t, &short, 2),
        Err(PairError::Missing { .. })
    ));
}

#[test]
fn arbitrary_records_never_panic() {
    let t = small();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..2000 {
        let mut recs = Vec::new();
        for _ in 0..(x % 7) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            recs.push(WireEndpoint {
                node_id: (x % 5) as u32,
                peer_id: (x >> 8) as u32 & 0x3_0007,
                qp: qp(x as u32 & 0xff_ffff),
            });
        }
        let _ = links_of(&t, &recs, Round::Requests);
        let _ = replies_for(&t, &recs, 2);
        let _ = requests_for(&t, &recs, 0);
    }
}

fn region(node: u32, space: WireSpace, len: u64) -> Region {
    Region {
        node_id: node,
        space,
        base: 0x7f00_0000_0000 + node as u64 * 0x1_0000_0000,
        len,
        rkey: 0x100 + node * 2 + space as u32,
    }
}

#[test]
fn regions_map_to_memory_nodes() {
    let t = small();
    let regs = [
        region(1, WireSpace::Host, 1 << 20),
        region(0, WireSpace::Device, 4096),
        region(0, WireSpace::Host, 2 << 20),
    ];
    let m = regions_by_node(&t, &regs).unwrap();
    assert_eq!(m.len(), 2);
    assert_eq!(
        (m[0].node, m[0].host, m[0].device),
        (0, regs[2], Some(regs[1]))
    );
    assert_eq!((m[1].node, m[1].host, m[1].device), (1, regs[0], None));
}

#[test]
fn bad_regions_are_clear_errors() {
    let t = small();
    let host = |n| region(n, WireSpace::Host, 64);
    assert_eq!(
        regions_by_node(&t, &[host(0)]),
        Err(PairError::MissingRegion { node: 1 })
    );
    assert_eq!(
        regions_by_node(&t, &[host(0), host(1), host(2)]),
        Err(PairError::RegionNotMemory { node: 2 })
    );
    assert_eq!(
        regions_by_node(&t, &[host(0), host(1), host(7)]),
        Err(PairError::RegionNotMemory { node: 7 })
    );
    assert_eq!(
        regions_by_node(&t, &[host(0), host(1), host(1)]),
        Err(PairError::DuplicateRegion {
            node: 1,
            space: WireSpace::Host
        })
    );
    let dm = region(0, WireSpace::Device, 8);
    assert_eq!(
        regions_by_node(&t, &[host(0), host(1), dm, dm]),
        Err(PairError::DuplicateRegion {
            node: 0,
            space: WireSpace::Device
        })
    );
    assert_eq!(
        regions_by_node(&t, &[host(0), region(1, WireSpace::Host, 0)]),
        Err(PairError::EmptyRegion {
            node: 1,
            space: WireSpace::Host
        })
    );
}

#[test]
fn the_index_locks_fit_the_smallest_lock_table() {
    let t = Topology::new(vec![0, 1, 2], vec![(3, 1)]).unwrap();
    let host = |n| region(n, WireSpace::Host, 1 << 20);
    let dm = |n, len| region(n, WireSpace::Device, len);
    let all = [
        host(0),
        host(1),
        host(2),
        dm(0, 4096),
        dm(1, 1024),
        dm(2, 8192),
    ];
    let m = regions_by_node(&t, &all).unwrap();
    assert_eq!(lock_table_bytes(&m), 1024);
    // A node without a lock table leaves the index none.
    let m = regions_by_node(&t, &all[..5]).unwrap();
    assert_eq!(lock_table_bytes(&m), 0);
    assert_eq!(lock_table_bytes(&[]), 0);
}

// ---- the protocol over an in-process control plane and fabric ----

/// Every node's exchanges and barriers, in process: a rendezvous
/// without sockets that, like bootstrap's, returns sorted records.
struct Hub {
    barrier: Barrier,
    rounds: Mutex<Vec<Directory>>,
}

struct HubMember {
    hub: Arc<Hub>,
    me: u32,
    round: usize,
    barriers: Vec<String>,
}

impl ControlPlane for HubMember {
    fn exchange(&mut self, mine: &Directory) -> Result<Directory, String> {
        assert!(mine.endpoints.iter().all(|e| e.node_id == self.me));
        assert!(mine.regions.iter().all(|r| r.node_id == self.me));
        {
            let mut rounds = self.hub.rounds.lock().unwrap();
            if rounds.len() <= self.round {
                rounds.resize_with(self.round + 1, Directory::default);
            }
            let d = &mut rounds[self.round];
            d.endpoints.extend_from_slice(&mine.endpoints);
            d.regions.extend_from_slice(&mine.regions);
        }
        self.hub.barrier.wait();
        let mut all = self.hub.rounds.lock().unwrap()[self.round].clone();
        all.endpoints.sort();
        all.regions.sort();
        self.round += 1;
        Ok(all)
    }
    fn barrier(&mut self, name: &str) -> Result<(), String> {
        self.barriers.push(name.to_string());
        self.hub.barrier.wait();
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Event {
    Made {
        link: Link,
        qpn: u32,
    },
    Accepted {
        link: Link,
        peer: u32,
        qpn: u32,
    },
    Connected {
        link: Link,
        peer: u32,
        node: u16,
    },
    Retired {
        node: u32,
        count: usize,
    },
    /// A compute node joined the rendezvous of run `run`.
    Joined {
        compute: u32,
        run: usize,
    },
}

/// Queue pairs as numbers: node `id`'s n-th queue pair is id·1000 + n.
struct FakeFabric {
    id: u32,
    lanes: u32,
    next: u32,
    log: Arc<Mutex<Vec<Event>>>,
    /// Responders accepted and not yet retired.
    live: usize,
}

impl FakeFabric {
    fn qpn(&mut self) -> u32 {
        self.next += 1;
        self.id * 1000 + self.next
    }
}

impl Fabric for FakeFabric {
    fn prepare_compute(&mut self, memory: &[u32]) -> Result<Vec<Vec<(u32, QpInfo)>>, String> {
        let mut out = Vec::new();
        for lane in 0..self.lanes {
            let mut v = Vec::new();
            for &m in memory {
                let n = self.qpn();
                self.log.lock().unwrap().push(Event::Made {
                    link: Link {
                        compute: self.id,
                        lane,
                        memory: m,
                    },
                    qpn: n,
                });
                v.push((m, qp(n)));
            }
            out.push(v);
        }
        Ok(out)
    }
    fn accept(&mut self, link: Link, peer: &QpInfo) -> Result<QpInfo, String> {
        assert_eq!(link.memory, self.id);
        let n = self.qpn();
        self.log.lock().unwrap().push(Event::Accepted {
            link,
            peer: peer.qpn,
            qpn: n,
        });
        self.live += 1;
        Ok(qp(n))
    }
    fn connect(&mut self, link: Link, peer: &QpInfo, regions: &NodeRegions) -> Result<(), String> {
        assert_eq!(link.compute, self.id);
        self.log.lock().unwrap().push(Event::Connected {
            link,
            peer: peer.qpn,
            node: regions.node,
        });
        Ok(())
    }
    fn retire(&mut self) -> usize {
        let count = std::mem::take(&mut self.live);
        self.log.lock().unwrap().push(Event::Retired {
            node: self.id,
            count,
        });
        count
    }
}

/// Memory nodes 0, 1; compute node 2 (2 cores); node 3 both (3 cores):
/// every link's two queue pairs end up connected to each other, each
/// compute queue pair with its memory node's regions.
#[test]
fn the_protocol_connects_every_link_once() {
    let top = Topology::new(vec![0, 1, 3], vec![(2, 2), (3, 3)]).unwrap();
    assert_eq!(connect_every_link_once(&top, &[0, 1, 2, 3]), 15);
}

/// A bank across processes: three machines (both roles, 2 cores each),
/// node 0 with a lane more for reading the bank; each lane connects to
/// every machine, its own in loopback.
#[test]
fn the_protocol_connects_machines_and_their_extra_lanes() {
    let machines = Topology::new(vec![0, 1, 2], vec![(0, 2), (1, 2), (2, 2)]).unwrap();
    let top = machines
        .clone()
        .with_lanes(&|id, cores| cores + u32::from(id == 0))
        .unwrap();
    assert_eq!(top.cores_of(0), Some(3));
    assert_eq!(top.cores_of(1), Some(2));
    assert_eq!(connect_every_link_once(&top, &[0, 1, 2]), 7 * 3);
    assert!(top
        .links()
        .any(|l| l.compute == 0 && l.lane == 2 && l.memory == 0));
    // With failure handling: three lanes more on every machine.
    let top = machines.clone().with_lanes(&|_, cores| cores + 3).unwrap();
    assert_eq!(connect_every_link_once(&top, &[0, 1, 2]), 15 * 3);
    // Leases alone: two lanes a machine, whatever its cores.
    let top = machines.with_lanes(&|_, _| 2).unwrap();
    assert_eq!(connect_every_link_once(&top, &[0, 1, 2]), 6 * 3);
}

#[test]
fn lanes_go_to_compute_nodes_within_the_limits() {
    let top = Topology::new(vec![0, 1], vec![(2, 2)]).unwrap();
    // A memory-only node has no lanes to count.
    let more = top.clone().with_lanes(&|_, cores| cores + 1).unwrap();
    assert_eq!((more.cores_of(0), more.cores_of(2)), (None, Some(3)));
    let e = top.with_lanes(&|_, _| u32::MAX).unwrap_err();
    assert!(e.contains("cores"), "{e}");
    // At the most records a node may publish, a lane more is refused.
    let full = Topology::new(vec![0], vec![(1, RECORDS_MAX as u32)]).unwrap();
    let e = full.with_lanes(&|_, cores| cores + 1).unwrap_err();
    assert!(e.contains("records"), "{e}");
}

/// Runs the protocol for every node of `ids` on threads and checks that
/// each link of `top` got its two queue pairs connected to each other,
/// each compute queue pair with its memory node's regions; returns the
/// number of links.
fn connect_every_link_once(top: &Topology, ids: &[u32]) -> usize {
    let hub = Arc::new(Hub {
        barrier: Barrier::new(ids.len()),
        rounds: Mutex::new(Vec::new()),
    });
    let log = Arc::new(Mutex::new(Vec::new()));
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = ids
            .iter()
            .map(|&id| {
                let (hub, log) = (hub.clone(), log.clone());
                s.spawn(move || {
                    let mut cp = HubMember {
                        hub,
                        me: id,
                        round: 0,
                        barriers: Vec::new(),
                    };
                    let mut f = FakeFabric {
                        id,
                        lanes: top.cores_of(id).unwrap_or(0),
                        next: 0,
                        log,
                        live: 0,
                    };
                    let regions = if top.is_memory(id) {
                        vec![
                            region(id, WireSpace::Host, 1 << 20),
                            region(id, WireSpace::Device, 4096),
                        ]
                    } else {
                        Vec::new()
                    };
                    let r = connect_cluster(&mut cp, &mut f, top, id, regions);
                    (r, cp.barriers, cp.round)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, barriers, rounds) in results {
        let regions = r.unwrap();
        assert_eq!(
            regions
                .iter()
                .map(|r| u32::from(r.node))
                .collect::<Vec<_>>(),
            top.memory
        );
        assert!(regions.iter().all(|r| r.device.is_some()));
        assert_eq!((barriers, rounds), (vec![QPS_READY.to_string()], 2));
    }
    let log = log.lock().unwrap();
    let links: Vec<Link> = top.links().collect();
    // Each memory node retired once, after exchange 1, before accepting:
    // nothing (a first run).
    let retired: Vec<&Event> = log
        .iter()
        .filter(|e| matches!(e, Event::Retired { .. }))
        .collect();
    assert_eq!(retired.len(), top.memory.len());
    assert!(retired
        .iter()
        .all(|e| matches!(e, Event::Retired { count: 0, .. })));
    let log: Vec<&Event> = log
        .iter()
        .filter(|e| !matches!(e, Event::Retired { .. }))
        .collect();
    assert_eq!(log.len(), 3 * links.len());
    let count = links.len();
    for l in links {
        let made = log
            .iter()
            .filter_map(|e| match e {
                Event::Made { link, qpn } if *link == l => Some(*qpn),
                _ => None,
            })
            .collect::<Vec<_>>();
        let acc = log
            .iter()
            .filter_map(|e| match e {
                Event::Accepted { link, peer, qpn } if *link == l => Some((*peer, *qpn)),
                _ => None,
            })
            .collect::<Vec<_>>();
        let con = log
            .iter()
            .filter_map(|e| match e {
                Event::Connected { link, peer, node } if *link == l => Some((*peer, *node)),
                _ => None,
            })
            .collect::<Vec<_>>();
        assert_eq!((made.len(), acc.len(), con.len()), (1, 1, 1), "{l}");
        assert_eq!(acc[0].0, made[0], "{l}: responder faces the compute QP");
        assert_eq!(con[0], (acc[0].1, l.memory as u16), "{l}");
        assert_eq!(acc[0].1 / 1000, l.memory, "{l}: made by the memory node");
        assert_eq!(made[0] / 1000, l.compute, "{l}: made by the compute node");
    }
    count
}

/// Hands out canned directories; errors when the script runs out.
struct Scripted(Vec<Directory>);

impl ControlPlane for Scripted {
    fn exchange(&mut self, _mine: &Directory) -> Result<Directory, String> {
        if self.0.is_empty() {
            return Err("the peers left".into());
        }
        Ok(self.0.remove(0))
    }
    fn barrier(&mut self, _name: &str) -> Result<(), String> {
        Ok(())
    }
}

fn fake(id: u32, lanes: u32) -> FakeFabric {
    FakeFabric {
        id,
        lanes,
        next: 0,
        log: Arc::new(Mutex::new(Vec::new())),
        live: 0,
    }
}

fn good_regions() -> Vec<Region> {
    vec![
        region(0, WireSpace::Host, 64),
        region(1, WireSpace::Host, 64),
    ]
}

#[test]
fn a_bad_exchange_fails_the_node_with_the_reason() {
    let t = small();
    let mut dup = all_requests();
    dup.push(request(2, 0, 0, 5));
    let mut cp = Scripted(vec![Directory {
        endpoints: dup,
        regions: good_regions(),
    }]);
    let e = connect_cluster(&mut cp, &mut fake(0, 0), &t, 0, Vec::new()).unwrap_err();
    assert!(
        matches!(e, BootError::Pair(PairError::Duplicate { .. })),
        "{e}"
    );
    // A compute node checks the requests too, and then the replies.
    let mut cp = Scripted(vec![
        Directory {
            endpoints: all_requests(),
            regions: good_regions(),
        },
        Directory {
            endpoints: all_replies()[1..].to_vec(),
            regions: Vec::new(),
        },
    ]);
    let e = connect_cluster(&mut cp, &mut fake(2, 2), &t, 2, Vec::new()).unwrap_err();
    assert!(
        matches!(e, BootError::Pair(PairError::Missing { .. })),
        "{e}"
    );
    // Regions are checked before any queue pair is touched.
    let mut cp = Scripted(vec![Directory {
        endpoints: all_requests(),
        regions: good_regions()[..1].to_vec(),
    }]);
    let e = connect_cluster(&mut cp, &mut fake(0, 0), &t, 0, Vec::new()).unwrap_err();
    assert_eq!(e, BootError::Pair(PairError::MissingRegion { node: 1 }));
    // A control channel that fails says at which step.
    let mut cp = Scripted(vec![Directory {
        endpoints: all_requests(),
        regions: good_regions(),
    }]);
    let e = connect_cluster(&mut cp, &mut fake(0, 0), &t, 0, Vec::new()).unwrap_err();
    assert!(e.to_string().contains("exchange 2"), "{e}");
}

/// Memory nodes that outlive compute runs, over the real control channel
/// on loopback: memory nodes 0 (the coordinator) and 1 serve run after
/// run ([`crate::node::serve_runs`] with [`serve_memory_run`]); compute
/// nodes 2 (2 cores) and 3 (1 core) come for three runs, the second
/// refused at "memory-ready" for mismatched workloads. Each run pairs
/// every link afresh, each memory node retires the run before's
/// responders first, the refused run ends no service, and a stop ends
/// both memory nodes' waits.
#[test]
fn memory_nodes_pair_each_later_run_afresh() {
    use crate::node::{serve_runs, Seat, INDEX_READY};
    use bootstrap::channel::Cancel;
    use bootstrap::{ChannelOptions, ClusterSecret, Rendezvous};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    static STOP: AtomicBool = AtomicBool::new(false);
    // Runs the memory nodes finished serving, in all.
    static DONE_RUNS: AtomicU64 = AtomicU64::new(0);
    // Relaxed: a flag polled until set; it publishes no other data.
    let stop = || STOP.load(Ordering::Relaxed);
    let opts = |id: u32| {
        let mut o = ChannelOptions::new(id, ClusterSecret::new(vec![7; 32]));
        o.cancel = Some(Cancel::new(stop));
        o
    };
    let top = Topology::new(vec![0, 1], vec![(2, 2), (3, 1)]).unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let seats = [
        Seat::Coordinator {
            listener,
            members: vec![0, 1, 2, 3],
        },
        Seat::Member {
            addr,
            coordinator: 0,
        },
    ];
    let served: Vec<u64> = std::thread::scope(|s| {
        let memory: Vec<_> = seats
            .iter()
            .enumerate()
            .map(|(id, seat)| {
                let (top, log, o) = (&top, log.clone(), opts(id as u32));
                s.spawn(move || {
                    let id = id as u32;
                    let regions = vec![region(id, WireSpace::Host, 1 << 20)];
                    let mut f = FakeFabric {
                        id,
                        lanes: 0,
                        next: 0,
                        log,
                        live: 0,
                    };
                    serve_runs(&o, seat, "memory", &stop, None, &mut |rv| {
                        let r = serve_memory_run(rv, &mut f, top, id, &regions);
                        if r.is_ok() {
                            // Relaxed: a count the test waits on; it
                            // publishes no other data.
                            DONE_RUNS.fetch_add(1, Ordering::Relaxed);
                        }
                        r
                    })
                })
            })
            .collect();
        for (run, workloads) in [["verbs", "verbs"], ["tree", "verbs"], ["hash", "hash"]]
            .iter()
            .enumerate()
        {
            let outcomes: Vec<Result<(), String>> = [2u32, 3]
                .iter()
                .zip(workloads)
                .map(|(&id, &w)| {
                    let (top, log, o) = (&top, log.clone(), opts(id));
                    s.spawn(move || {
                        let mut rv = Rendezvous::join(addr, 0, &o, Duration::from_secs(30))
                            .map_err(|e| e.to_string())?;
                        log.lock().unwrap().push(Event::Joined { compute: id, run });
                        let mut f = FakeFabric {
                            id,
                            lanes: top.cores_of(id).unwrap(),
                            next: 100 * run as u32,
                            log,
                            live: 0,
                        };
                        let regions = connect_cluster(&mut rv, &mut f, top, id, Vec::new())
                            .map_err(|e| e.to_string())?;
                        assert_eq!(regions.len(), 2);
                        crate::node::memory_ready(&mut rv, Some(format!("--workload {w}")))
                            .map_err(|e| e.to_string())?;
                        rv.barrier(INDEX_READY).map_err(|e| e.to_string())?;
                        rv.close();
                        Ok(())
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect();
            if run == 1 {
                for o in &outcomes {
                    let e = o.as_ref().unwrap_err();
                    assert!(e.contains("different workloads"), "{e}");
                }
            } else {
                assert!(
                    outcomes.iter().all(Result::is_ok),
                    "run {run}: {outcomes:?}"
                );
            }
        }
        // A stop cancels the channel's waits: set it only once both memory
        // nodes are through the last run's final barrier, or a node still
        // waiting for its release would end the run unserved.
        let by = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while DONE_RUNS.load(Ordering::Relaxed) < 4 {
            assert!(
                std::time::Instant::now() < by,
                "the memory nodes never finished their runs"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        STOP.store(true, Ordering::Relaxed);
        memory.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // The refused run is not counted as served.
    assert_eq!(served, [2, 2]);
    let log = log.lock().unwrap();
    // Per memory node: retire, then accept its 3 links (2 + 1 cores), per
    // run; what a run retires is what the run before accepted.
    for m in [0u32, 1] {
        let mine: Vec<&Event> = log
            .iter()
            .filter(|e| match e {
                Event::Retired { node, .. } => *node == m,
                Event::Accepted { link, .. } => link.memory == m,
                _ => false,
            })
            .collect();
        let retired: Vec<usize> = mine
            .iter()
            .filter_map(|e| match e {
                Event::Retired { count, .. } => Some(*count),
                _ => None,
            })
            .collect();
        assert_eq!(retired, [0, 3, 3], "node {m}");
        for run in mine.chunks(4) {
            assert!(matches!(run[0], Event::Retired { .. }), "{run:?}");
            let mut links: Vec<Link> = run[1..]
                .iter()
                .map(|e| match e {
                    Event::Accepted { link, .. } => *link,
                    e => panic!("{e:?}"),
                })
                .collect();
            links.sort();
            let want: Vec<Link> = top.links().filter(|l| l.memory == m).collect();
            assert_eq!(links, want, "node {m}");
        }
    }
    // A run's responders are retired only once the next run's compute
    // nodes have joined: never while the run they serve may still go on.
    for m in [0u32, 1] {
        let retires: Vec<usize> = log
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, Event::Retired { node, .. } if *node == m))
            .map(|(i, _)| i)
            .collect();
        for (run, &at) in retires.iter().enumerate() {
            let joined = log
                .iter()
                .position(|e| matches!(e, Event::Joined { run: r, .. } if *r == run));
            assert!(
                joined.is_some_and(|j| j < at),
                "node {m} retired for run {run} before its compute nodes joined"
            );
        }
    }
    // Every compute queue pair of every run was connected to a responder.
    let connected = log
        .iter()
        .filter(|e| matches!(e, Event::Connected { .. }))
        .count();
    assert_eq!(connected, 3 * top.links().count());
}

// ---- the cluster file and the no-device / no-feature paths ----

fn mlx5_cluster() -> (ClusterConfig, crate::node::NodeOptions) {
    let node = |id: u32, memory: bool, cores: Vec<u32>| NodeConfig {
        id,
        roles: Roles {
            memory,
            compute: !memory,
        },
        address: format!("127.0.0.1:{}", 47_000 + id),
        cores,
        memory_bytes: if memory { 8 << 20 } else { 0 },
    };
    let cfg = ClusterConfig {
        file: "cluster.toml".into(),
        nodes: vec![node(0, true, vec![]), node(1, false, vec![0, 1])],
        backend: Backend::Mlx5 {
            device: "mlx5_0".into(),
            port: 1,
            gid_index: 3,
            traffic_class: 106,
        },
        huge_pages: HugePages::Off,
        lock_table_words: 512,
        secret_file: "/nonexistent/secret".into(),
    };
    let o = crate::node::NodeOptions {
        config: "cluster.toml".into(),
        id: 0,
        seconds: Some(1.0),
        tasks_per_core: 4,
        pin: false,
        seed: 1,
        workload: crate::node::Workload::Verbs,
        records: 1000,
        sizes: crate::index_work::Sizes::default(),
        tree: "sherman".into(),
        histogram: None,
        txs: 2000,
        etcd: None,
        lease_ms: 10.0,
    };
    (cfg, o)
}

#[cfg(feature = "mlx5")]
#[test]
fn the_device_comes_from_the_cluster_file() {
    let (cfg, _) = mlx5_cluster();
    let d = device_config(&cfg.backend).unwrap();
    assert_eq!(
        (d.name.as_deref(), d.port, d.gid_index, d.traffic_class),
        (Some("mlx5_0"), 1, 3, 106)
    );
    assert_eq!(device_config(&Backend::Emu).unwrap_err().exit_code(), 2);
}

#[test]
fn topology_of_a_cluster_file() {
    let (cfg, _) = mlx5_cluster();
    let t = Topology::from_config(&cfg).unwrap();
    assert_eq!(t, Topology::new(vec![0], vec![(1, 2)]).unwrap());
}

/// Booting a memory node on a machine without an RDMA device (or a
/// build without the feature) fails at once with one clear error.
#[test]
fn booting_without_a_device_fails_promptly_and_clearly() {
    if has_rdma_devices() {
        return;
    }
    let (cfg, o) = mlx5_cluster();
    let t = Instant::now();
    let layout = crate::node_work::Layout::new(8 << 20, 128).unwrap();
    let e = run(&o, &cfg, &cfg.nodes[0].clone(), layout).unwrap_err();
    fails_without_a_device(&e, t);
    if cfg!(feature = "mlx5") {
        assert!(supported(&cfg).is_ok());
    } else {
        assert_eq!(supported(&cfg).unwrap_err().to_string(), NO_FEATURE);
    }
}

/// Whether this host has RDMA devices (a no-device test then skips).
fn has_rdma_devices() -> bool {
    let has = std::path::Path::new("/sys/class/infiniband").exists();
    if has {
        eprintln!("skipped: this machine has RDMA devices");
    }
    has
}

/// `e`, begun at `t`, is the prompt, clear failure of a host without an
/// RDMA device: "no RDMA device" (exit 1) in an mlx5 build, the missing
/// feature (exit 2) in others.
fn fails_without_a_device(e: &NodeError, t: Instant) {
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    let msg = e.to_string();
    if cfg!(feature = "mlx5") {
        assert!(msg.starts_with("no RDMA device"), "{msg}");
        assert_eq!(e.exit_code(), 1);
    } else {
        assert_eq!(msg, NO_FEATURE);
        assert_eq!(e.exit_code(), 2);
    }
}

/// Three machines on mlx5 (both roles, 2 cores each), `--workload txn`.
fn mlx5_machines() -> (ClusterConfig, crate::node::NodeOptions) {
    let (mut cfg, mut o) = mlx5_cluster();
    cfg.nodes = (0..3)
        .map(|id| NodeConfig {
            id,
            roles: Roles {
                memory: true,
                compute: true,
            },
            address: format!("127.0.0.1:{}", 47_100 + id),
            cores: vec![0, 1],
            memory_bytes: 256 << 20,
        })
        .collect();
    o.workload = crate::node::Workload::Txn;
    (cfg, o)
}

/// The bank, with and without failure handling, and leases alone run on
/// mlx5 machines: the cluster file's geometry is accepted for each.
#[test]
fn mlx5_machines_take_every_machine_workload() {
    let (cfg, mut o) = mlx5_machines();
    let g = crate::node_txn::geometry(&o, &cfg).unwrap();
    assert_eq!((g.machines, g.threads, g.f), (3, 2, 2));
    assert_eq!(g.spare_regions_per_machine, 0);
    o.etcd = Some("http://127.0.0.1:2379".into());
    let g = crate::node_txn::geometry(&o, &cfg).unwrap();
    assert_eq!(g.spare_regions_per_machine, 1);
    o.workload = crate::node::Workload::Leases;
    assert!(crate::node_txn::geometry(&o, &cfg).is_ok());
}

#[test]
fn the_deepest_config_fits_every_executor_of_a_machine() {
    use txn::harness::{core_config, lease_core_config};
    let d = deepest(&[core_config(), lease_core_config(5), lease_core_config(1)]);
    assert_eq!(d.slots, 5);
    assert_eq!(d.qp_depth(), lease_core_config(5).qp_depth());
    assert!(d.qp_depth() >= core_config().qp_depth());
    let (cfg, mut o) = mlx5_machines();
    let geo = |o: &crate::node::NodeOptions| crate::node_txn::geometry(o, &cfg).unwrap();
    // Three machines: a lease core holds two leases; the cores hold two
    // tasks each, as does the recovery core.
    assert_eq!(MachineWork::Bank.deepest(geo(&o)).slots, 2);
    o.etcd = Some("http://127.0.0.1:1".into());
    let flags = crate::node_leases::store_flags(&o, "txn").unwrap();
    assert_eq!(MachineWork::Recovering(&flags).deepest(geo(&o)).slots, 2);
    assert_eq!(MachineWork::Leases(&flags).deepest(geo(&o)).slots, 2);
    // Six machines: five leases on the lease core.
    let (mut cfg6, o6) = (cfg.clone(), o.clone());
    cfg6.nodes = (0..6)
        .map(|id| NodeConfig {
            id,
            address: format!("127.0.0.1:{}", 47_200 + id),
            ..cfg.nodes[0].clone()
        })
        .collect();
    let g6 = crate::node_txn::geometry(&o6, &cfg6).unwrap();
    assert_eq!(MachineWork::Recovering(&flags).deepest(g6).slots, 5);
    assert_eq!(MachineWork::Leases(&flags).deepest(g6).slots, 5);
}

/// A bank machine on a host without an RDMA device (or a build without
/// the feature) fails at once with one clear error.
#[test]
fn a_bank_machine_without_a_device_fails_promptly_and_clearly() {
    if has_rdma_devices() {
        return;
    }
    let (cfg, mut o) = mlx5_machines();
    let node = cfg.nodes[0].clone();
    let geo = crate::node_txn::geometry(&o, &cfg).unwrap();
    let t = Instant::now();
    let e = run_machine(&o, &cfg, &node, geo, MachineWork::Bank).unwrap_err();
    fails_without_a_device(&e, t);
    // With failure handling, and leases alone: the flags are checked
    // (no etcd is reached before the device is opened).
    o.etcd = Some("http://127.0.0.1:1".into());
    let flags = crate::node_leases::store_flags(&o, "txn").unwrap();
    let geo = crate::node_txn::geometry(&o, &cfg).unwrap();
    for work in [MachineWork::Recovering(&flags), MachineWork::Leases(&flags)] {
        let t = Instant::now();
        fails_without_a_device(&run_machine(&o, &cfg, &node, geo, work).unwrap_err(), t);
    }
}
