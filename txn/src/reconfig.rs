//! Reconfiguration (FaRM §5.2), its first three steps: suspect, probe,
//! and commit the new configuration to the store by compare-and-swap; and
//! the region remap of step four as a pure function ([`remap`]).
//!
//! A machine's reconfiguration task watches its [`Suspicions`]. At the CM
//! a suspicion of a machine, elsewhere a suspicion of the CM, starts it:
//!
//! 1. **Suspect.** A machine other than the CM waits its turn first: the
//!    machines after the CM, in order, are its backups, and the k-th
//!    waits k − 1 steps of [`TAKEOVER_STEP_NS`] so that one candidate
//!    usually goes alone; it gives up if the store moved meanwhile.
//! 2. **Probe.** One-sided READs of every other machine of the
//!    configuration; a machine whose READ fails, or that is suspected, is
//!    out. The candidate goes on only if a majority of the configuration
//!    (itself included) answered, so the minority side of a partition
//!    never makes a configuration (no split brain).
//! 3. **Update.** ⟨i + 1, S without the failed, their domains, CM = the
//!    candidate⟩ is compare-and-swapped against the revision of
//!    configuration i in the store. Of concurrent candidates exactly one
//!    wins; the others learn its configuration.
//!
//! Steps 4–7 (remap and NEW-CONFIG to every machine, apply with precise
//! membership, NEW-CONFIG-ACK, NEW-CONFIG-COMMIT) and transaction-state
//! recovery are not built yet; [`remap`] computes step 4's region map.

use crate::config::{ConfigError, ConfigStore, Configuration, Stored, Swap};
use crate::error::TxError;
use crate::layout::Geometry;
use crate::lease::Suspicions;
use crate::regions::{Region, RegionMap, Replica};
use nicdrv::{Ctx, GlobalAddr, Nic, NodeId, Space};
use std::collections::BTreeSet;
use std::sync::Arc;

/// How long each backup CM waits after the one before it.
pub const TAKEOVER_STEP_NS: u64 = 1_000_000;
/// How often the task looks at the suspicions.
pub const WATCH_NS: u64 = 50_000;

/// What a reconfiguration task did, with the times (executor clock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// It started on a suspicion of `machine`.
    Suspected { at_ns: u64, machine: NodeId },
    /// Its probe found `failed` out of the configuration, `answered` of
    /// its machines (itself included) answering.
    Probed {
        at_ns: u64,
        answered: usize,
        failed: Vec<NodeId>,
    },
    /// Too few machines answered: it made no configuration.
    NoMajority { at_ns: u64, answered: usize },
    /// Its configuration is the store's, at this revision.
    Committed {
        at_ns: u64,
        config: Configuration,
        revision: u64,
    },
    /// Another configuration was stored first (or meanwhile): this one.
    Superseded { at_ns: u64, config: Configuration },
    /// The store refused or could not be reached.
    StoreError { at_ns: u64, error: ConfigError },
}

/// One machine's reconfiguration task.
pub struct Reconfig {
    pub geo: Geometry,
    pub me: NodeId,
    /// The configuration this machine is in, with its store revision.
    pub current: Stored,
    pub store: Arc<dyn ConfigStore>,
    pub suspicions: Suspicions,
}

impl Reconfig {
    /// Watches the suspicions until `stop()`; reconfigures at most once
    /// (the configuration it then leads, or learns of, is the next
    /// configuration's business: steps 4–7).
    pub async fn run<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        stop: &dyn Fn() -> bool,
    ) -> Result<Vec<Event>, TxError> {
        let mut events = Vec::new();
        let cm = self.current.config.cm;
        let trigger = loop {
            if stop() {
                return Ok(events);
            }
            let s = self.suspicions.lock().expect("no panics hold it").clone();
            let relevant = s
                .iter()
                .find(|s| if self.me == cm { true } else { s.machine == cm });
            if let Some(s) = relevant {
                break s.machine;
            }
            ctx.sleep(WATCH_NS)?.await;
        };
        events.push(Event::Suspected {
            at_ns: ctx.now_ns(),
            machine: trigger,
        });
        if self.me != cm {
            // Wait for the backup CMs before this one.
            let rank = self.rank();
            if rank > 1 {
                ctx.sleep((rank - 1) * TAKEOVER_STEP_NS)?.await;
            }
            match self.store.read() {
                Ok(Some(s)) if s.revision != self.current.revision => {
                    events.push(Event::Superseded {
                        at_ns: ctx.now_ns(),
                        config: s.config,
                    });
                    return Ok(events);
                }
                Ok(_) => {}
                Err(error) => {
                    events.push(Event::StoreError {
                        at_ns: ctx.now_ns(),
                        error,
                    });
                    return Ok(events);
                }
            }
        }
        let suspected: BTreeSet<NodeId> = self
            .suspicions
            .lock()
            .expect("no panics hold it")
            .iter()
            .map(|s| s.machine)
            .collect();
        let (answered, failed) = self.probe(ctx, &suspected).await?;
        let n = self.current.config.machines.len();
        events.push(Event::Probed {
            at_ns: ctx.now_ns(),
            answered,
            failed: failed.iter().copied().collect(),
        });
        if answered * 2 <= n {
            events.push(Event::NoMajority {
                at_ns: ctx.now_ns(),
                answered,
            });
            return Ok(events);
        }
        let old = &self.current.config;
        let new = Configuration {
            id: old.id + 1,
            machines: old
                .machines
                .iter()
                .copied()
                .filter(|(m, _)| !failed.contains(m))
                .collect(),
            cm: self.me,
        };
        let at_ns = ctx.now_ns();
        match self.store.cas(Some(self.current.revision), &new) {
            Ok(Swap::Done(revision)) => events.push(Event::Committed {
                at_ns,
                config: new,
                revision,
            }),
            Ok(Swap::Lost(Some(s))) => events.push(Event::Superseded {
                at_ns,
                config: s.config,
            }),
            Ok(Swap::Lost(None)) => events.push(Event::StoreError {
                at_ns,
                error: ConfigError::Store("the store lost its configuration".into()),
            }),
            Err(error) => events.push(Event::StoreError { at_ns, error }),
        }
        Ok(events)
    }

    /// This machine's place among the CM's backups: 1 for the machine
    /// after the CM in the configuration (cyclically), and so on.
    fn rank(&self) -> u64 {
        let ms = &self.current.config.machines;
        let at = |x: NodeId| ms.iter().position(|m| m.0 == x).unwrap_or(0);
        let (c, me) = (at(self.current.config.cm), at(self.me));
        ((me + ms.len() - c) % ms.len()) as u64
    }

    /// READs every other machine of the configuration (not those
    /// suspected): how many machines answered, itself included, and which
    /// are out.
    async fn probe<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        suspected: &BTreeSet<NodeId>,
    ) -> Result<(usize, BTreeSet<NodeId>), TxError> {
        let mut failed: BTreeSet<NodeId> = suspected.clone();
        failed.remove(&self.me);
        loop {
            let targets: Vec<NodeId> = self
                .current
                .config
                .machines
                .iter()
                .map(|m| m.0)
                .filter(|&m| m != self.me && !failed.contains(&m))
                .collect();
            if targets.is_empty() {
                break;
            }
            let mut b = ctx.batch();
            for &m in &targets {
                b.read_new(
                    GlobalAddr::new(m, Space::Host, self.geo.lease_word(self.me)),
                    8,
                );
            }
            match b.submit().await {
                Ok(_) => break,
                // One round finds one failure; a dead machine's queue pair
                // fails at once the next round.
                Err(e) => match node_of(&e) {
                    Some(node) if targets.contains(&node) => {
                        failed.insert(node);
                    }
                    _ => return Err(e.into()),
                },
            }
        }
        let n = self.current.config.machines.len();
        let out = failed
            .iter()
            .filter(|m| self.current.config.contains(**m))
            .count();
        Ok((n - out, failed))
    }
}

fn node_of(e: &nicdrv::VerbError) -> Option<NodeId> {
    use nicdrv::VerbError as V;
    match *e {
        V::Failed { node, .. } | V::NodeDead { node } | V::Post { node, .. } => Some(node),
        _ => None,
    }
}

/// Step 4's region map: every region that had a replica on a machine not
/// in `next` loses it. A region whose primary failed gets one of its
/// surviving backups as primary (the first); every region gets new
/// backups, up to f, on machines of `next` that hold none of its replicas
/// and lie, where possible, in failure domains its replicas do not; among
/// those, the machine with the fewest replicas so far (then the lowest
/// id), so load stays spread. `slot(machine, region)` gives a free
/// replica base on a machine for a new backup, or none (the machine is
/// skipped). A region with no surviving replica is lost, and one that
/// cannot get f backups cannot be placed: the error names it.
pub fn remap(
    map: &RegionMap,
    next: &Configuration,
    mut slot: impl FnMut(NodeId, &Region) -> Option<u64>,
) -> Result<RegionMap, TxError> {
    let f = map.backups_per_region();
    let domain = |m: NodeId| next.machines.iter().find(|x| x.0 == m).map(|x| x.1);
    let mut load: std::collections::BTreeMap<NodeId, usize> =
        next.machines.iter().map(|m| (m.0, 0)).collect();
    for r in map.iter() {
        for rep in std::iter::once(&r.primary).chain(&r.backups) {
            if let Some(n) = load.get_mut(&rep.machine) {
                *n += 1;
            }
        }
    }
    let mut out = RegionMap::new(f);
    for r in map.iter() {
        let mut live: Vec<Replica> = std::iter::once(r.primary)
            .chain(r.backups.iter().copied())
            .filter(|rep| next.contains(rep.machine))
            .collect();
        if live.is_empty() {
            return Err(TxError::Protocol(format!(
                "region {}: every replica was on a failed machine",
                r.id
            )));
        }
        while live.len() < f + 1 {
            let held: BTreeSet<NodeId> = live.iter().map(|x| x.machine).collect();
            let domains: BTreeSet<Option<u32>> = live.iter().map(|x| domain(x.machine)).collect();
            let mut candidates: Vec<(bool, usize, NodeId)> = next
                .machines
                .iter()
                .filter(|m| !held.contains(&m.0))
                .map(|m| (domains.contains(&Some(m.1)), load[&m.0], m.0))
                .collect();
            candidates.sort_unstable();
            let Some(base) = candidates
                .iter()
                .find_map(|c| slot(c.2, r).map(|b| (c.2, b)))
            else {
                return Err(TxError::Protocol(format!(
                    "region {}: no machine of configuration {} can take a new backup",
                    r.id, next.id
                )));
            };
            *load.get_mut(&base.0).expect("a machine of next") += 1;
            live.push(Replica {
                machine: base.0,
                base: base.1,
            });
        }
        out.add(Region {
            id: r.id,
            bytes: r.bytes,
            primary: live[0],
            backups: live[1..].to_vec(),
        })
        .map_err(|e| TxError::Protocol(format!("remapping region {}: {e}", r.id)))?;
    }
    Ok(out)
}
