//! A small, fast, seedable random number generator (SplitMix64), and the one
//! place where random streams are derived: every random choice — workload
//! clients, simulated threads, the simulator's own draws, fault plans, tests
//! — comes from a stream named by `(seed, domain, index)` through
//! [`Rng::stream`], so a run replays from its seed and no two streams are
//! shifted copies of each other.
//!
//! Why the derivation matters: SplitMix64's state advances by a fixed odd
//! constant γ, so two generators whose starting states differ by a multiple
//! of γ produce the same sequence at an offset. Seeding client `i` with
//! `seed ^ i·γ`, or `seed + i`, makes such pairs (clients 1 and 3 repeated
//! each other's operations one step apart). [`Rng::stream`] instead puts each
//! stream's start through a bijective 64-bit mixer twice, so starting states
//! are spread over the whole 2⁶⁴ cycle: two streams overlap within a window
//! of `w` draws with probability about `2w / 2⁶⁴`.

/// SplitMix64 (Steele, Lea, Flood 2014): passes BigCrush, one add and
/// three multiply-xorshift steps per value.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

/// SplitMix64's increment γ (the golden ratio as a 64-bit fraction).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// What a stream is for: streams of different domains never coincide even
/// where their indices do (client 3 and simulated thread 3).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Domain {
    /// A workload client (task) of a benchmark, demo or node; index: the
    /// client's id, unique across the run.
    Client = 1,
    /// Per-core seeds that a core forks its tasks' streams from; index: the
    /// core's id, unique across the run.
    Core = 2,
    /// The simulator's own draws (line timing, jitter); index 0.
    Simulator = 3,
    /// A fault plan drawn from a seed; index 0.
    Faults = 4,
    /// Tests: index as the test chooses.
    Test = 5,
}

/// A bijective mixer of 64-bit words (SplitMix64's output function, with
/// Stafford's "Mix13" constants): every input bit affects every output bit.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// The stream of one seed alone ([`Rng::stream`] with domain
    /// [`Domain::Test`], index 0): for a single generator, such as a test's.
    pub fn new(seed: u64) -> Rng {
        Rng::stream(seed, Domain::Test, 0)
    }

    /// Stream `index` of `domain` under `seed`. The starting state mixes the
    /// seed and the stream name separately and then together, so neither
    /// nearby seeds nor nearby indices give related starting states.
    pub fn stream(seed: u64, domain: Domain, index: u64) -> Rng {
        let name = mix64(((domain as u64) << 56) ^ index ^ 0x6A09_E667_F3BC_C909);
        Rng {
            state: mix64(mix64(seed).wrapping_add(name).wrapping_add(GAMMA)),
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix64(self.state)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; `n` must be positive).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "Rng::below(0)");
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An independent stream for a sub-component (e.g. one per task): the
    /// next value, put through the mixer again as a new starting state.
    pub fn fork(&mut self) -> Rng {
        let s = self.next_u64();
        Rng {
            state: mix64(s ^ 0xBB67_AE85_84CA_A73B),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_roughly_uniform() {
        let mut a = Rng::new(42);
        let mut b = Rng::new(42);
        let xs: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        let mut counts = [0u32; 10];
        let mut r = Rng::new(7);
        for _ in 0..100_000 {
            counts[r.below(10) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
        assert!((0..1000).map(|_| r.unit()).all(|u| (0.0..1.0).contains(&u)));
    }

    /// The first `n` outputs of `r`.
    fn take(mut r: Rng, n: usize) -> Vec<u64> {
        (0..n).map(|_| r.next_u64()).collect()
    }

    /// How many outputs of `a` reappear anywhere in `b`.
    fn shared(a: &[u64], b: &[u64]) -> usize {
        let b: std::collections::HashSet<_> = b.iter().collect();
        a.iter().filter(|x| b.contains(x)).count()
    }

    #[test]
    fn streams_of_nearby_seeds_and_indices_share_nothing() {
        // The derivations that used to collide: index i·γ and i+1, and
        // seeds one apart. Any shift of one stream into another within 500
        // draws would show up as shared outputs.
        let mut all = Vec::new();
        for seed in [0u64, 1, 2, 3, 123_456_789] {
            for i in 0..64 {
                all.push(take(Rng::stream(seed, Domain::Client, i), 500));
            }
            all.push(take(Rng::stream(seed, Domain::Simulator, 0), 500));
            all.push(take(Rng::stream(seed, Domain::Faults, 0), 500));
            all.push(take(Rng::new(seed), 500));
        }
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_eq!(shared(a, b), 0, "two streams share outputs");
            }
        }
    }

    #[test]
    fn forks_are_unrelated_to_their_parent_and_each_other() {
        let mut p = Rng::new(5);
        let forks: Vec<_> = (0..32).map(|_| take(p.fork(), 500)).collect();
        let parent = take(p, 500);
        for (i, a) in forks.iter().enumerate() {
            assert_eq!(shared(a, &parent), 0);
            for b in &forks[i + 1..] {
                assert_eq!(shared(a, b), 0);
            }
        }
    }
}
