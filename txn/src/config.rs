//! FaRM's configuration (§5.2): ⟨i, S, F, CM⟩ — its number, the machines
//! in it, the failure domain of each, and the configuration manager —
//! kept in a store behind a small trait: read the configuration with the
//! store's revision of it, or compare-and-swap a new one against that
//! revision. A machine that takes over as CM (or removes failed machines)
//! commits its configuration by one successful compare-and-swap; every
//! other writer of the same revision loses.
//!
//! [`EmbeddedStore`] is the in-process store (the simulator's too); an
//! external store (etcd) implements the same trait. What a store holds is
//! the configuration's bytes ([`Configuration::encode`]); bytes that are
//! not one are an error, never a configuration.

use std::fmt;
use std::sync::Mutex;

/// One configuration of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Configuration {
    /// Its number: each new configuration's is the last one's plus one.
    pub id: u64,
    /// The machines in it, ascending, each with its failure domain.
    pub machines: Vec<(u16, u32)>,
    /// The configuration manager, one of `machines`.
    pub cm: u16,
}

/// Why a configuration or a store operation was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// Bytes that are not a configuration.
    Corrupt(String),
    /// A configuration that breaks a rule (no machines, a CM outside it,
    /// machines out of order or twice).
    Invalid(String),
    /// A new configuration whose number does not follow the stored one's.
    Stale { stored: u64, offered: u64 },
    /// The store could not be reached or answered nonsense.
    Store(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Corrupt(s) => write!(f, "a stored configuration is corrupt: {s}"),
            ConfigError::Invalid(s) => write!(f, "invalid configuration: {s}"),
            ConfigError::Stale { stored, offered } => write!(
                f,
                "configuration {offered} does not follow the stored configuration {stored}"
            ),
            ConfigError::Store(s) => write!(f, "configuration store: {s}"),
        }
    }
}

impl std::error::Error for ConfigError {}

const MAGIC: u32 = 0x4c43_4647; // "LCFG"
/// Most machines a configuration names.
pub const MAX_MACHINES: usize = 4096;

impl Configuration {
    /// Checks the rules every configuration keeps.
    pub fn check(&self) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Invalid(s));
        if self.machines.is_empty() || self.machines.len() > MAX_MACHINES {
            return bad(format!(
                "{} machines (1 ..= {MAX_MACHINES})",
                self.machines.len()
            ));
        }
        if self.machines.windows(2).any(|w| w[0].0 >= w[1].0) {
            return bad("machines out of order or named twice".into());
        }
        if !self.machines.iter().any(|m| m.0 == self.cm) {
            return bad(format!("the CM, machine {}, is not in it", self.cm));
        }
        Ok(())
    }

    pub fn contains(&self, machine: u16) -> bool {
        self.machines.iter().any(|m| m.0 == machine)
    }

    /// The configuration as bytes: magic, id, CM, count, then each
    /// machine and domain, all little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(18 + 6 * self.machines.len());
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&self.id.to_le_bytes());
        b.extend_from_slice(&self.cm.to_le_bytes());
        b.extend_from_slice(&(self.machines.len() as u32).to_le_bytes());
        for (m, d) in &self.machines {
            b.extend_from_slice(&m.to_le_bytes());
            b.extend_from_slice(&d.to_le_bytes());
        }
        b
    }

    /// Bytes as a configuration, every length and rule checked.
    pub fn decode(b: &[u8]) -> Result<Configuration, ConfigError> {
        let corrupt = |s: &str| ConfigError::Corrupt(s.to_string());
        let word = |at: usize, n: usize| b.get(at..at + n).ok_or_else(|| corrupt("cut short"));
        let u32_at = |at| word(at, 4).map(|w| u32::from_le_bytes(w.try_into().expect("4")));
        if u32_at(0)? != MAGIC {
            return Err(corrupt("not a configuration (bad magic)"));
        }
        let id = u64::from_le_bytes(word(4, 8)?.try_into().expect("8"));
        let cm = u16::from_le_bytes(word(12, 2)?.try_into().expect("2"));
        let n = u32_at(14)? as usize;
        if n > MAX_MACHINES || b.len() != 18 + 6 * n {
            return Err(corrupt(&format!("{n} machines in {} bytes", b.len())));
        }
        let machines = (0..n)
            .map(|i| {
                let at = 18 + 6 * i;
                let m = u16::from_le_bytes(b[at..at + 2].try_into().expect("2"));
                let d = u32::from_le_bytes(b[at + 2..at + 6].try_into().expect("4"));
                (m, d)
            })
            .collect();
        let c = Configuration { id, machines, cm };
        c.check().map_err(|e| ConfigError::Corrupt(e.to_string()))?;
        Ok(c)
    }
}

/// The stored configuration with the store's revision of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub revision: u64,
    pub config: Configuration,
}

/// What a compare-and-swap did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Swap {
    /// The new configuration is stored, at this revision.
    Done(u64),
    /// Another was stored since the revision compared: this one.
    Lost(Option<Stored>),
}

/// Where the configuration is kept.
pub trait ConfigStore: Send + Sync {
    /// The stored configuration, or none before the first.
    fn read(&self) -> Result<Option<Stored>, ConfigError>;

    /// Stores `new` if the store still holds revision `expected` (`None`:
    /// nothing stored yet). `new` must be valid and, after a stored one,
    /// numbered one more than it.
    fn cas(&self, expected: Option<u64>, new: &Configuration) -> Result<Swap, ConfigError>;
}

/// Checks `new` against what is stored before a swap: a valid
/// configuration numbered one past the stored one (any number for the
/// first).
pub fn check_successor(
    stored: Option<&Configuration>,
    new: &Configuration,
) -> Result<(), ConfigError> {
    new.check()?;
    match stored {
        Some(s) if new.id != s.id.wrapping_add(1) => Err(ConfigError::Stale {
            stored: s.id,
            offered: new.id,
        }),
        _ => Ok(()),
    }
}

/// The configuration a cluster starts in: `first`, stored unless the
/// store holds a configuration already — then that one, for the caller to
/// judge (machines booting together all offer the same `first`; exactly
/// one stores it).
pub fn establish(store: &dyn ConfigStore, first: &Configuration) -> Result<Stored, ConfigError> {
    match store.cas(None, first)? {
        Swap::Done(revision) => Ok(Stored {
            revision,
            config: first.clone(),
        }),
        Swap::Lost(Some(s)) => Ok(s),
        Swap::Lost(None) => Err(ConfigError::Store(
            "the store refused the first configuration and holds none".into(),
        )),
    }
}

/// The in-process store: bytes and a revision under a lock.
#[derive(Default)]
pub struct EmbeddedStore {
    state: Mutex<Option<(u64, Vec<u8>)>>,
}

impl EmbeddedStore {
    pub fn new() -> EmbeddedStore {
        EmbeddedStore::default()
    }

    /// Overwrites what the store holds with raw bytes (tests of what a
    /// corrupt store gives).
    pub fn put_raw(&self, bytes: Vec<u8>) {
        let mut s = self.state.lock().expect("no panics hold it");
        let rev = s.as_ref().map_or(1, |(r, _)| r + 1);
        *s = Some((rev, bytes));
    }
}

impl ConfigStore for EmbeddedStore {
    fn read(&self) -> Result<Option<Stored>, ConfigError> {
        let s = self.state.lock().expect("no panics hold it");
        match &*s {
            None => Ok(None),
            Some((revision, b)) => Ok(Some(Stored {
                revision: *revision,
                config: Configuration::decode(b)?,
            })),
        }
    }

    fn cas(&self, expected: Option<u64>, new: &Configuration) -> Result<Swap, ConfigError> {
        let mut s = self.state.lock().expect("no panics hold it");
        let current = s.as_ref().map(|(r, _)| *r);
        if current != expected {
            let stored = match &*s {
                None => None,
                Some((revision, b)) => Some(Stored {
                    revision: *revision,
                    config: Configuration::decode(b)?,
                }),
            };
            return Ok(Swap::Lost(stored));
        }
        let old = match &*s {
            None => None,
            Some((_, b)) => Some(Configuration::decode(b)?),
        };
        check_successor(old.as_ref(), new)?;
        let revision = current.map_or(1, |r| r + 1);
        *s = Some((revision, new.encode()));
        Ok(Swap::Done(revision))
    }
}

/// Checks any [`ConfigStore`] must pass, for each store's tests to run
/// on a fresh, empty store (they panic on the first failure).
pub mod conformance {
    use super::*;

    /// A configuration of `machines`, domains `m mod 3`.
    pub fn conf(id: u64, machines: &[u16], cm: u16) -> Configuration {
        Configuration {
            id,
            machines: machines.iter().map(|&m| (m, m as u32 % 3)).collect(),
            cm,
        }
    }

    /// Swaps win only at the stored revision and with the next number.
    pub fn swaps_follow_revisions_and_numbers(s: &dyn ConfigStore) {
        assert_eq!(s.read().unwrap(), None, "a fresh store is empty");
        let c1 = conf(1, &[0, 1, 2], 0);
        let Swap::Done(r1) = s.cas(None, &c1).unwrap() else {
            panic!("the first configuration was not stored")
        };
        // A second first configuration loses to the stored one.
        let lost = s.cas(None, &conf(1, &[0, 1], 1)).unwrap();
        assert_eq!(
            lost,
            Swap::Lost(Some(Stored {
                revision: r1,
                config: c1.clone()
            }))
        );
        // A stale number is refused, even at the right revision.
        assert_eq!(
            s.cas(Some(r1), &conf(5, &[0, 1], 0)),
            Err(ConfigError::Stale {
                stored: 1,
                offered: 5
            })
        );
        assert_eq!(
            s.cas(Some(r1), &conf(1, &[0, 1], 0)),
            Err(ConfigError::Stale {
                stored: 1,
                offered: 1
            }),
            "a replayed configuration is refused"
        );
        let c2 = conf(2, &[0, 2], 2);
        let Swap::Done(r2) = s.cas(Some(r1), &c2).unwrap() else {
            panic!("the successor was not stored")
        };
        assert!(r2 > r1, "revisions grow");
        assert_eq!(
            s.read().unwrap(),
            Some(Stored {
                revision: r2,
                config: c2
            })
        );
        // An old revision loses, whatever it offers.
        assert!(matches!(
            s.cas(Some(r1), &conf(3, &[0], 0)).unwrap(),
            Swap::Lost(Some(Stored { revision, .. })) if revision == r2
        ));
    }

    /// Invalid configurations are refused and nothing refused is stored.
    pub fn invalid_configurations_are_refused(s: &dyn ConfigStore) {
        for bad in [
            conf(1, &[], 0),
            conf(1, &[0, 1], 7),
            conf(1, &[1, 0], 0),
            conf(1, &[1, 1], 1),
        ] {
            assert!(
                matches!(s.cas(None, &bad), Err(ConfigError::Invalid(_))),
                "{bad:?}"
            );
        }
        assert_eq!(s.read().unwrap(), None, "nothing refused was stored");
    }

    /// Of many concurrent swaps of one revision, exactly one wins.
    pub fn one_of_many_concurrent_swaps_of_a_revision_wins(s: &dyn ConfigStore) {
        let Swap::Done(r1) = s.cas(None, &conf(1, &[0, 1, 2, 3], 0)).unwrap() else {
            panic!("the first configuration was not stored")
        };
        let wins: usize = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4u16)
                .map(|m| {
                    sc.spawn(move || {
                        matches!(
                            s.cas(Some(r1), &conf(2, &[0, 1, 2, 3], m)).unwrap(),
                            Swap::Done(_)
                        )
                    })
                })
                .collect();
            hs.into_iter().map(|h| usize::from(h.join().unwrap())).sum()
        });
        assert_eq!(wins, 1, "exactly one new CM");
        assert_eq!(s.read().unwrap().unwrap().config.id, 2);
    }
}

#[cfg(test)]
mod tests {
    use super::conformance::*;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn swaps_follow_revisions_and_numbers() {
        conformance::swaps_follow_revisions_and_numbers(&EmbeddedStore::new());
    }

    #[test]
    fn invalid_and_corrupt_configurations_are_refused() {
        let s = EmbeddedStore::new();
        invalid_configurations_are_refused(&s);
        s.put_raw(b"not a configuration".to_vec());
        assert!(matches!(s.read(), Err(ConfigError::Corrupt(_))));
        assert!(matches!(
            s.cas(Some(1), &conf(1, &[0], 0)),
            Err(ConfigError::Corrupt(_))
        ));
    }

    #[test]
    fn one_of_many_concurrent_swaps_of_a_revision_wins() {
        conformance::one_of_many_concurrent_swaps_of_a_revision_wins(&EmbeddedStore::new());
    }

    proptest! {
        /// Configurations round-trip; arbitrary bytes are one or an error,
        /// never a panic; every cut of a configuration is an error.
        #[test]
        fn configurations_round_trip(
            id in any::<u64>(), mut ms in proptest::collection::vec(any::<u16>(), 1..20),
            junk in proptest::collection::vec(any::<u8>(), 0..80), cut in any::<usize>(),
        ) {
            ms.sort_unstable();
            ms.dedup();
            let c = conf(id, &ms, ms[0]);
            let b = c.encode();
            prop_assert_eq!(Configuration::decode(&b).unwrap(), c);
            prop_assert!(Configuration::decode(&b[..cut % b.len()]).is_err());
            let _ = Configuration::decode(&junk);
        }
    }
}
