//! One compute core's links to the memory nodes: a completion queue and
//! one queue pair per memory node on it, made together on one thread while
//! bootstrap exchanges endpoints, connected from the exchanged endpoints,
//! and then handed, as one value, to the core's pinned thread, which turns
//! it into the completion queue and queue pairs an executor runs on.
//!
//! Why a bundle: a CQ and its QPs share reference-counted state (`Rc`, so
//! that the data path takes no lock), which makes each of them `!Send`. The
//! bundle owns every holder of that state, so moving the whole bundle to
//! another thread moves all of it at once, which is sound; pieces come out
//! only through [`Mlx5CoreQps::into_parts`], on the thread that keeps them.

use super::cq::Mlx5Cq;
use super::device::Mlx5Nic;
use super::endpoint::{Endpoint, QpEndpoint};
use super::qp::{Mlx5PreparedQp, Mlx5Qp};
use super::Mlx5Error;
use crate::addr::NodeId;

enum Link {
    Prepared(Mlx5PreparedQp),
    Connected(Mlx5Qp),
    /// A connect that failed consumed its QP.
    Failed,
}

/// A core's CQ and its QPs, one per memory node, in the order of
/// [`prepare`](Self::prepare)'s `peers`.
pub struct Mlx5CoreQps {
    // Field order is drop order: the QPs before the CQ they complete on
    // (each QP also holds the CQ alive, so either order is safe).
    links: Vec<(NodeId, Link)>,
    cq: Mlx5Cq,
}

// SAFETY: the `Rc`s inside (the CQ's shared state, each QP's handle and
// ring) are held only by the CQ and QPs this value owns: `prepare` makes
// them all here, no method hands out a clone or a reference that outlives
// the call, and no re-arm hook (which could hold thread-bound state) is
// installed while bundled. Moving the bundle moves every holder at once,
// so no reference count is ever touched from two threads. The verbs
// objects behind them (device context, PD, CQ, QPs) are usable from any
// thread (libibverbs locks internally).
unsafe impl Send for Mlx5CoreQps {}

impl Mlx5CoreQps {
    /// A CQ with room for every QP's `depth`, and one QP in INIT per peer.
    pub fn prepare(nic: &Mlx5Nic, peers: &[NodeId], depth: u32) -> Result<Self, Mlx5Error> {
        let capacity = (peers.len() as u64).saturating_mul(depth as u64);
        let max = nic.attrs().max_cqe as u64;
        if peers.is_empty() || capacity > max.min(u32::MAX as u64) {
            return Err(Mlx5Error::BadSize {
                what: "completion queue entries for one core (QP depth × memory nodes)",
                got: capacity,
                max,
            });
        }
        for (i, p) in peers.iter().enumerate() {
            if peers[..i].contains(p) {
                return Err(Mlx5Error::BadSize {
                    what: "queue pairs to one memory node from one core",
                    got: 2,
                    max: 1,
                });
            }
        }
        let cq = nic.create_cq(capacity as u32)?;
        let mut links = Vec::with_capacity(peers.len());
        for &p in peers {
            links.push((p, Link::Prepared(nic.create_qp(&cq, depth)?)));
        }
        Ok(Mlx5CoreQps { links, cq })
    }

    /// What each memory node needs to connect its side: (node, endpoint),
    /// for the QPs not yet connected.
    pub fn endpoints(&self) -> Vec<(NodeId, QpEndpoint)> {
        self.links
            .iter()
            .filter_map(|(n, l)| match l {
                Link::Prepared(p) => Some((*n, p.endpoint())),
                _ => None,
            })
            .collect()
    }

    /// Moves the QP to `peer.node` to RTR and RTS towards `peer`, learning
    /// its regions.
    pub fn connect(&mut self, peer: &Endpoint) -> Result<(), Mlx5Error> {
        let Some((_, link)) = self.links.iter_mut().find(|(n, _)| *n == peer.node) else {
            return Err(Mlx5Error::Verbs {
                call: "connect (this core has no queue pair to that node)",
                errno: libc::ENOENT,
            });
        };
        match std::mem::replace(link, Link::Failed) {
            Link::Prepared(p) => {
                *link = Link::Connected(p.connect(peer)?);
                Ok(())
            }
            other => {
                *link = other;
                Err(Mlx5Error::Verbs {
                    call: "connect (queue pair already connected or failed)",
                    errno: libc::EALREADY,
                })
            }
        }
    }

    /// Whether every QP is connected.
    pub fn is_connected(&self) -> bool {
        self.links
            .iter()
            .all(|(_, l)| matches!(l, Link::Connected(_)))
    }

    /// The CQ and the connected QPs, for an executor on this thread; the
    /// nodes whose QP is not connected when some are not.
    pub fn into_parts(self) -> Result<(Mlx5Cq, Vec<Mlx5Qp>), Vec<NodeId>> {
        let missing: Vec<NodeId> = self
            .links
            .iter()
            .filter(|(_, l)| !matches!(l, Link::Connected(_)))
            .map(|(n, _)| *n)
            .collect();
        if !missing.is_empty() {
            return Err(missing);
        }
        let qps = self
            .links
            .into_iter()
            .filter_map(|(_, l)| match l {
                Link::Connected(q) => Some(q),
                _ => None,
            })
            .collect();
        Ok((self.cq, qps))
    }
}
