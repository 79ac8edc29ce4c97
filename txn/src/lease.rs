//! Failure detection by leases (FaRM §5.1).
//!
//! Every machine holds a lease at the configuration manager (CM), and the
//! CM holds one at every machine, set up by a three-way handshake that is
//! also how a lease is renewed: the machine sends REQUEST(s); the CM, on
//! reading it, extends the machine's lease to now + L and answers
//! GRANT(s), which also asks for its own lease at the machine; the
//! machine, on reading the grant, holds its lease until the time it sent
//! REQUEST(s) plus L (the CM granted later than that, so the machine never
//! thinks it holds a lease the CM thinks expired), grants the CM's lease
//! until now + L, and answers ACK(s). A machine renews every `renew_ns`
//! (FaRM: a fifth of the lease).
//!
//! The CM suspects a machine whose lease expired: no REQUEST in L. A
//! machine suspects the CM when the CM's lease at it expired: no GRANT in
//! L. Suspicions go to the machine's [`Suspicions`], for reconfiguration.
//!
//! Messages are one word, written by one RDMA WRITE into the receiver's
//! lease line for the sender ([`Geometry::lease_word`]), so a receiver
//! polls its own memory and a sender owns its line: `kind:4 | config:20 |
//! seq:40`. An aligned word never tears. A word whose kind is unknown is
//! malformed; one of another configuration is stale (a machine of an old
//! configuration, or a replay): both are refused and counted, never acted
//! on.
//!
//! Load cannot starve these tasks: they run on a core of their own on
//! every machine (FaRM used a dedicated high-priority thread), one task
//! for the CM's lease at a machine, and at the CM one task per machine,
//! so a peer that stops answering (its WRITEs wait out the transport
//! timeout) delays no other peer's grants.

use crate::error::TxError;
use crate::layout::Geometry;
use nicdrv::{Ctx, GlobalAddr, Nic, NodeId, Space};
use std::sync::{Arc, Mutex};

/// Lease timing.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The lease (FaRM: 10 ms).
    pub lease_ns: u64,
    /// How often a machine renews (FaRM: a fifth of the lease).
    pub renew_ns: u64,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        LeaseConfig::of(10_000_000)
    }
}

impl LeaseConfig {
    /// A lease of `lease_ns`, renewed every fifth of it.
    pub fn of(lease_ns: u64) -> LeaseConfig {
        LeaseConfig {
            lease_ns,
            renew_ns: lease_ns / 5,
        }
    }

    pub fn check(&self) -> Result<(), TxError> {
        if self.renew_ns == 0 || self.renew_ns >= self.lease_ns || self.lease_ns > 10_000_000_000 {
            return Err(TxError::Usage(format!(
                "a lease of {} ns renewed every {} ns: renewals must come within the lease (and a lease of at most 10 s)",
                self.lease_ns, self.renew_ns
            )));
        }
        Ok(())
    }
}

/// What a lease message says.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A machine asks for (or renews) its lease at the CM.
    Request = 1,
    /// The CM grants it, and asks for its own lease at the machine.
    Grant = 2,
    /// The machine grants the CM's lease.
    Ack = 3,
    /// The sender stops (the run is over): no suspicion when it goes
    /// silent.
    Leave = 4,
}

/// One lease message.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Msg {
    pub kind: Kind,
    /// The low 20 bits of the sender's configuration number.
    pub config: u32,
    /// The handshake's number (40 bits; 0 is never sent).
    pub seq: u64,
}

const CONFIG_BITS: u32 = 20;
const SEQ_BITS: u32 = 40;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
const CONFIG_MASK: u64 = (1 << CONFIG_BITS) - 1;

/// The low bits of configuration `id` that lease messages carry.
pub fn config_tag(id: u64) -> u32 {
    (id & CONFIG_MASK) as u32
}

impl Msg {
    pub fn encode(&self) -> u64 {
        ((self.kind as u64) << (CONFIG_BITS + SEQ_BITS))
            | ((self.config as u64 & CONFIG_MASK) << SEQ_BITS)
            | (self.seq & SEQ_MASK)
    }

    /// A word as a message: `Ok(None)` for the zero word (nothing sent
    /// yet), an error for a word that is no message.
    pub fn decode(w: u64) -> Result<Option<Msg>, TxError> {
        if w == 0 {
            return Ok(None);
        }
        let kind = match w >> (CONFIG_BITS + SEQ_BITS) {
            1 => Kind::Request,
            2 => Kind::Grant,
            3 => Kind::Ack,
            4 => Kind::Leave,
            k => return Err(TxError::Protocol(format!("lease word {w:#x}: kind {k}"))),
        };
        let seq = w & SEQ_MASK;
        if seq == 0 {
            return Err(TxError::Protocol(format!("lease word {w:#x}: seq 0")));
        }
        Ok(Some(Msg {
            kind,
            config: ((w >> SEQ_BITS) & CONFIG_MASK) as u32,
            seq,
        }))
    }
}

/// One machine's suspicion of another.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Suspicion {
    /// The suspecting machine.
    pub by: NodeId,
    pub machine: NodeId,
    /// When it suspected (executor time).
    pub at_ns: u64,
    /// When its lease was last renewed (or the watch began).
    pub renewed_ns: u64,
}

/// A machine's suspicions, shared by its lease tasks and whoever acts on
/// them.
pub type Suspicions = Arc<Mutex<Vec<Suspicion>>>;

/// What a lease task did.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseStats {
    pub requests: u64,
    pub grants: u64,
    pub acks: u64,
    /// Messages refused: malformed, of another configuration, or out of
    /// turn.
    pub refused: u64,
    /// At the CM: the longest time between two renewals of one machine's
    /// lease (the margin a lease of L leaves is L minus this).
    pub max_renew_gap_ns: u64,
    /// Suspicions this task raised.
    pub suspicions: u64,
    /// WRITEs that failed (the peer unreachable).
    pub failed_writes: u64,
}

impl std::ops::AddAssign for LeaseStats {
    fn add_assign(&mut self, o: Self) {
        self.requests += o.requests;
        self.grants += o.grants;
        self.acks += o.acks;
        self.refused += o.refused;
        self.max_renew_gap_ns = self.max_renew_gap_ns.max(o.max_renew_gap_ns);
        self.suspicions += o.suspicions;
        self.failed_writes += o.failed_writes;
    }
}

/// One side of one lease: this machine `me` and its peer, in configuration
/// `config` whose CM is `cm`.
pub struct Lease {
    pub geo: Geometry,
    pub me: NodeId,
    pub peer: NodeId,
    pub cm: NodeId,
    pub config: u64,
    pub timing: LeaseConfig,
    pub suspicions: Suspicions,
}

impl Lease {
    fn tag(&self) -> u32 {
        config_tag(self.config)
    }

    /// Sends `kind(seq)` to the peer; false if the WRITE failed (the peer
    /// is unreachable; its lease will expire).
    async fn send<N: Nic>(&self, ctx: &Ctx<N>, kind: Kind, seq: u64) -> bool {
        let w = Msg {
            kind,
            config: self.tag(),
            seq,
        }
        .encode();
        let at = GlobalAddr::new(self.peer, Space::Host, self.geo.lease_word(self.me));
        let mut b = ctx.batch();
        b.write_u64(at, w);
        b.submit().await.is_ok()
    }

    /// The peer's newest message here, if it changed since `last`.
    fn incoming<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        last: &mut u64,
        st: &mut LeaseStats,
    ) -> Result<Option<Msg>, TxError> {
        let w = ctx.local().load(self.geo.lease_word(self.peer))?;
        if w == *last {
            return Ok(None);
        }
        *last = w;
        match Msg::decode(w) {
            Ok(Some(m)) if m.config == self.tag() => Ok(Some(m)),
            Ok(_) | Err(_) => {
                st.refused += 1;
                log::warn!(
                    "machine {}: refused lease word {w:#x} from machine {} (configuration {})",
                    self.me,
                    self.peer,
                    self.config
                );
                Ok(None)
            }
        }
    }

    fn suspect(&self, at_ns: u64, renewed_ns: u64, st: &mut LeaseStats) {
        st.suspicions += 1;
        log::warn!(
            "machine {} suspects machine {}: its lease ran out at {} ns (renewed at {renewed_ns} ns)",
            self.me,
            self.peer,
            renewed_ns + self.timing.lease_ns
        );
        self.suspicions
            .lock()
            .expect("no panics hold it")
            .push(Suspicion {
                by: self.me,
                machine: self.peer,
                at_ns,
                renewed_ns,
            });
    }

    /// Waits for the peer's next word or `until`, whichever is first.
    async fn wait<N: Nic>(&self, ctx: &Ctx<N>, until: u64) -> Result<(), TxError> {
        let until = until.max(ctx.now_ns() + 1);
        ctx.wait_for_write(self.geo.lease_word(self.peer), 8, Some(until))?
            .await;
        Ok(())
    }

    /// A machine's side of its lease at the CM (`peer` is the CM): renews
    /// every `renew_ns`, answers grants, suspects the CM when it stops
    /// granting. Ends when `stop()` says so, with a LEAVE, or when the CM
    /// leaves.
    pub async fn hold<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        stop: &dyn Fn() -> bool,
    ) -> Result<LeaseStats, TxError> {
        let l = self.timing.lease_ns;
        let mut st = LeaseStats::default();
        let mut seq = 0u64;
        let mut next_renew = ctx.now_ns();
        // The CM's lease here, granted at the start for one period.
        let mut cm_until = ctx.now_ns() + l;
        let mut granted_at = ctx.now_ns();
        let mut suspected = false;
        let mut last = ctx.local().load(self.geo.lease_word(self.peer))?;
        loop {
            if stop() {
                self.send(ctx, Kind::Leave, seq + 1).await;
                return Ok(st);
            }
            if ctx.now_ns() >= next_renew && !suspected {
                seq += 1;
                next_renew = ctx.now_ns() + self.timing.renew_ns;
                st.requests += 1;
                if !self.send(ctx, Kind::Request, seq).await {
                    st.failed_writes += 1;
                }
            }
            if let Some(m) = self.incoming(ctx, &mut last, &mut st)? {
                match m.kind {
                    // A grant of the request just sent: the CM's lease here
                    // runs from now.
                    Kind::Grant if m.seq == seq => {
                        granted_at = ctx.now_ns();
                        cm_until = granted_at + l;
                        st.acks += 1;
                        if !self.send(ctx, Kind::Ack, seq).await {
                            st.failed_writes += 1;
                        }
                    }
                    Kind::Leave => return Ok(st),
                    _ => st.refused += 1,
                }
            }
            let now = ctx.now_ns();
            if !suspected && now > cm_until {
                suspected = true;
                self.suspect(now, granted_at, &mut st);
            }
            let until = if suspected {
                now + self.timing.renew_ns
            } else {
                next_renew.min(cm_until + 1)
            };
            self.wait(ctx, until).await?;
        }
    }

    /// The CM's side of one machine's lease (`peer` is the machine):
    /// grants each request, suspects the machine when its lease runs out.
    /// Ends when `stop()` says so (with a LEAVE) or when the machine
    /// leaves.
    pub async fn grant<N: Nic>(
        &self,
        ctx: &Ctx<N>,
        stop: &dyn Fn() -> bool,
    ) -> Result<LeaseStats, TxError> {
        let l = self.timing.lease_ns;
        let mut st = LeaseStats::default();
        let mut renewed = ctx.now_ns();
        let mut first = true;
        let mut suspected = false;
        let mut granted = 0u64;
        let mut last = ctx.local().load(self.geo.lease_word(self.peer))?;
        loop {
            if stop() {
                self.send(ctx, Kind::Leave, granted + 1).await;
                return Ok(st);
            }
            if let Some(m) = self.incoming(ctx, &mut last, &mut st)? {
                match m.kind {
                    // A machine suspected is out until reconfiguration says
                    // otherwise: its requests are not granted.
                    Kind::Request if !suspected && m.seq > granted => {
                        let now = ctx.now_ns();
                        if !first {
                            st.max_renew_gap_ns = st.max_renew_gap_ns.max(now - renewed);
                        }
                        first = false;
                        renewed = now;
                        granted = m.seq;
                        st.grants += 1;
                        if !self.send(ctx, Kind::Grant, m.seq).await {
                            st.failed_writes += 1;
                        }
                    }
                    Kind::Ack if m.seq == granted => {}
                    Kind::Leave => return Ok(st),
                    _ => st.refused += 1,
                }
            }
            let now = ctx.now_ns();
            if !suspected && now > renewed + l {
                suspected = true;
                self.suspect(now, renewed, &mut st);
            }
            let until = if suspected {
                now + self.timing.renew_ns
            } else {
                (renewed + l + 1).min(now + self.timing.renew_ns)
            };
            self.wait(ctx, until).await?;
        }
    }
}

/// The lease tasks of machine `me` in a configuration with CM `cm`: at
/// the CM one [`Lease::grant`] per other machine, elsewhere one
/// [`Lease::hold`].
pub fn leases_of(
    geo: Geometry,
    me: NodeId,
    cm: NodeId,
    config: u64,
    timing: LeaseConfig,
    suspicions: &Suspicions,
) -> Vec<Lease> {
    let lease = |peer| Lease {
        geo,
        me,
        peer,
        cm,
        config,
        timing,
        suspicions: suspicions.clone(),
    };
    if me == cm {
        (0..geo.machines).filter(|&p| p != cm).map(lease).collect()
    } else {
        vec![lease(cm)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_junk_is_refused() {
        for kind in [Kind::Request, Kind::Grant, Kind::Ack, Kind::Leave] {
            for (config, seq) in [(0, 1), (CONFIG_MASK as u32, SEQ_MASK), (7, 12345)] {
                let m = Msg { kind, config, seq };
                assert_eq!(Msg::decode(m.encode()).unwrap(), Some(m));
            }
        }
        assert_eq!(Msg::decode(0).unwrap(), None);
        assert!(Msg::decode(5 << 60 | 1).is_err(), "unknown kind");
        assert!(Msg::decode(1 << 60).is_err(), "seq 0");
        assert!(Msg::decode(u64::MAX).is_err());
        assert_eq!(config_tag(1 << 20 | 3), 3);
    }

    #[test]
    fn timings_are_checked() {
        LeaseConfig::default().check().unwrap();
        assert_eq!(LeaseConfig::default().renew_ns, 2_000_000);
        for bad in [
            LeaseConfig {
                lease_ns: 10,
                renew_ns: 10,
            },
            LeaseConfig {
                lease_ns: 10,
                renew_ns: 0,
            },
            LeaseConfig::of(u64::MAX),
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
