//! The self-checking verb mix `loch demo`'s verb phase and `loch node
//! --workload verbs` both run: one operation at a time on a task's own
//! words (a READ must return what the task last wrote there), a shared FAA
//! counter, and a contended CAS word. What a step found is returned, not
//! counted here: each workload keeps its own tallies.

use nicdrv::rng::Rng;
use nicdrv::{Ctx, GlobalAddr, Nic, VerbError};

/// One operation of the mix.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Verb {
    /// READ one of the task's words and compare it with the last write.
    Read,
    /// WRITE a fresh random value to one of the task's words.
    Write,
    /// FAA 1 on the shared counter.
    Faa,
    /// CAS-increment the contended word, retried until it wins.
    CasIncrement,
    /// One doorbell: READ one of the task's words and FAA the counter.
    ReadAndFaa,
}

impl Verb {
    /// Whether the verb adds 1 to the shared counter when it succeeds.
    pub fn bumps_counter(self) -> bool {
        matches!(self, Verb::Faa | Verb::ReadAndFaa)
    }
}

/// The mix, in percent of operations; what the four named shares leave of
/// 100 goes to [`Verb::ReadAndFaa`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Mix {
    pub read: u64,
    pub write: u64,
    pub faa: u64,
    pub cas: u64,
}

impl Mix {
    /// `loch demo`'s verb phase: every verb, batches included.
    pub const DEMO: Mix = Mix {
        read: 30,
        write: 20,
        faa: 20,
        cas: 15,
    };
    /// `loch node --workload verbs`: READ, WRITE and FAA only (its counter
    /// check is per memory node, and it has no contended word).
    pub const NODE: Mix = Mix {
        read: 40,
        write: 30,
        faa: 30,
        cas: 0,
    };

    /// Draws the next verb (one draw of `rng`).
    pub fn pick(&self, rng: &mut Rng) -> Verb {
        debug_assert!(self.read + self.write + self.faa + self.cas <= 100);
        let p = rng.below(100);
        let write = self.read;
        let faa = write + self.write;
        let cas = faa + self.faa;
        let batch = cas + self.cas;
        match p {
            p if p < write => Verb::Read,
            p if p < faa => Verb::Write,
            p if p < cas => Verb::Faa,
            p if p < batch => Verb::CasIncrement,
            _ => Verb::ReadAndFaa,
        }
    }
}

/// The words a step works on.
#[derive(Copy, Clone, Debug)]
pub struct Target {
    /// One of the task's own words (the first 8 bytes of a 64-byte line);
    /// no other task writes it.
    pub word: GlobalAddr,
    /// The shared FAA counter.
    pub counter: GlobalAddr,
    /// The contended CAS word (unused by a mix without CAS).
    pub cas_word: GlobalAddr,
}

/// What a step that completed found.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// A READ returned something other than the last value written.
    pub mismatch: bool,
    /// The CAS increment won.
    pub cas_increment: bool,
}

/// Runs `verb` on `target`; `shadow` is the last value the task wrote to
/// `target.word` (updated by a successful WRITE). A WRITE draws its value
/// from `rng`. A failed FAA or CAS may still have taken effect (its answer
/// was lost): the caller decides how its check allows for that.
pub async fn step<N: Nic>(
    ctx: &Ctx<N>,
    verb: Verb,
    rng: &mut Rng,
    target: Target,
    shadow: &mut u64,
) -> Result<Found, VerbError> {
    let mut found = Found::default();
    match verb {
        Verb::Read => {
            let b = ctx.read(target.word, 64).await?;
            found.mismatch = b.u64_at(0) != *shadow;
        }
        Verb::Write => {
            let v = rng.next_u64();
            let mut line = [0u8; 64];
            line[..8].copy_from_slice(&v.to_le_bytes());
            ctx.write(target.word, &line).await?;
            *shadow = v;
        }
        Verb::Faa => {
            ctx.faa(target.counter, 1).await?;
        }
        Verb::CasIncrement => {
            let mut cur = 0;
            loop {
                let old = ctx.cas(target.cas_word, cur, cur + 1).await?;
                if old == cur {
                    break;
                }
                cur = old;
            }
            found.cas_increment = true;
        }
        Verb::ReadAndFaa => {
            // One doorbell per node, one round trip.
            let mut b = ctx.batch();
            let rd = b.read_new(target.word, 64);
            b.faa(target.counter, 1);
            let d = b.submit().await?;
            found.mismatch = d.word(rd) != *shadow;
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_mix_draws_as_its_percentages_say() {
        // The demo's verb phase drew `below(100)` and split it 0–29 READ,
        // 30–49 WRITE, 50–69 FAA, 70–84 CAS, 85–99 batch: the same draws
        // must give the same verbs (the sim trace depends on it).
        let mix = Mix::DEMO;
        let expect = |p: u64| match p {
            0..=29 => Verb::Read,
            30..=49 => Verb::Write,
            50..=69 => Verb::Faa,
            70..=84 => Verb::CasIncrement,
            _ => Verb::ReadAndFaa,
        };
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        for _ in 0..10_000 {
            assert_eq!(mix.pick(&mut a), expect(b.below(100)));
        }
    }

    #[test]
    fn a_mix_without_cas_or_batches_never_draws_them() {
        let mut rng = Rng::new(3);
        let mut seen = [0u64; 3];
        for _ in 0..10_000 {
            match Mix::NODE.pick(&mut rng) {
                Verb::Read => seen[0] += 1,
                Verb::Write => seen[1] += 1,
                Verb::Faa => seen[2] += 1,
                v => panic!("drew {v:?}"),
            }
        }
        // 40/30/30 within a few percent.
        assert!((3_700..4_300).contains(&seen[0]), "{seen:?}");
        assert!((2_700..3_300).contains(&seen[1]), "{seen:?}");
        assert!((2_700..3_300).contains(&seen[2]), "{seen:?}");
    }
}
