//! Workload generators: YCSB's zipfian distribution (Gray et al.'s
//! algorithm, as in YCSB's `ZipfianGenerator`), scrambled so hot keys spread
//! over the key space exactly as YCSB's `ScrambledZipfianGenerator` does
//! (ranks drawn over ten billion items, hashed with FNV-1a, reduced modulo
//! the record count), and uniform. The operation mixes are files: see
//! `ycsb.rs`.

use nicdrv::rng::Rng;

/// Draws item ranks in `0..n` with P(rank i) ∝ 1 / (i+1)^theta.
#[derive(Clone, Debug)]
pub struct Zipfian {
    n: u64,
    alpha: f64,
    zetan: f64,
    eta: f64,
    half_pow_theta: f64,
}

/// Terms summed directly before the Euler–Maclaurin tail takes over.
const ZETA_DIRECT: u64 = 1000;

/// `sum_{i=1..=n} i^-theta`. Summed directly for small `n`; above that the
/// first `ZETA_DIRECT - 1` terms are summed and the rest is the
/// Euler–Maclaurin formula (integral, end-point terms, and the B2 and B4
/// corrections), accurate to ~1e-11 relative, so ten billion items cost
/// microseconds instead of minutes.
fn zeta(n: u64, theta: f64) -> f64 {
    if n <= 4 * ZETA_DIRECT {
        return (1..=n).map(|i| (i as f64).powf(-theta)).sum();
    }
    let s = theta;
    let head: f64 = (1..ZETA_DIRECT).map(|i| (i as f64).powf(-s)).sum();
    let (m, x) = (ZETA_DIRECT as f64, n as f64);
    let integral = (x.powf(1.0 - s) - m.powf(1.0 - s)) / (1.0 - s);
    let ends = (m.powf(-s) + x.powf(-s)) / 2.0;
    // The first and third derivatives of t^-s.
    let d1 = |t: f64| -s * t.powf(-s - 1.0);
    let d3 = |t: f64| -s * (s + 1.0) * (s + 2.0) * t.powf(-s - 3.0);
    head + integral + ends + (d1(x) - d1(m)) / 12.0 - (d3(x) - d3(m)) / 720.0
}

impl Zipfian {
    /// `theta` in (0, 1) ∪ (1, ∞); YCSB's default is 0.99. Computing zeta
    /// costs at most a few thousand terms, done once.
    pub fn new(n: u64, theta: f64) -> Zipfian {
        assert!(
            n >= 1 && theta > 0.0 && theta != 1.0,
            "zipfian needs n >= 1 and theta > 0, != 1"
        );
        let zetan = zeta(n, theta);
        let zeta2 = zeta(2.min(n), theta);
        let alpha = 1.0 / (1.0 - theta);
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        Zipfian {
            n,
            alpha,
            zetan,
            eta,
            half_pow_theta: 1.0 + 0.5f64.powf(theta),
        }
    }

    pub fn next(&self, rng: &mut Rng) -> u64 {
        let u = rng.unit();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < self.half_pow_theta {
            return 1.min(self.n - 1);
        }
        let r = (self.n as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.n - 1)
    }
}

/// Items YCSB's `ScrambledZipfianGenerator` draws ranks over
/// (`ITEM_COUNT`), whatever the record count: the hottest record's share is
/// then 1/zeta(10^10, theta) (3.8% at 0.99) at every scale, not the larger
/// 1/zeta(records) a zipfian over the records alone would give.
pub const YCSB_ITEM_COUNT: u64 = 10_000_000_000;

/// YCSB's `Utils.fnvhash64`: FNV-1a over the eight bytes, low first, then
/// `Math.abs` of the signed result.
pub fn fnv64_ycsb(v: u64) -> u64 {
    (fnv64(v) as i64).unsigned_abs()
}

/// FNV-1a 64 of a u64 (the byte loop of YCSB's `Utils.fnvhash64`).
pub fn fnv64(v: u64) -> u64 {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for i in 0..8 {
        h ^= (v >> (8 * i)) & 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

/// How keys are chosen.
#[derive(Clone, Debug)]
pub enum KeyDist {
    Uniform {
        n: u64,
    },
    /// Zipfian, as YCSB's `ScrambledZipfianGenerator`: `scrambled` draws
    /// ranks over [`YCSB_ITEM_COUNT`] items, hashed onto the `n` records;
    /// `ranks` is the plain zipfian over the records (YCSB's "latest").
    Zipfian {
        n: u64,
        scrambled: Zipfian,
        ranks: Zipfian,
    },
}

impl KeyDist {
    pub fn new(n: u64, theta: f64) -> KeyDist {
        if theta == 0.0 {
            KeyDist::Uniform { n }
        } else {
            KeyDist::Zipfian {
                n,
                // YCSB: ZipfianGenerator(0, ITEM_COUNT), i.e. ITEM_COUNT + 1
                // items.
                scrambled: Zipfian::new(YCSB_ITEM_COUNT + 1, theta),
                ranks: Zipfian::new(n, theta),
            }
        }
    }

    /// A record index in `0..n`.
    pub fn next(&self, rng: &mut Rng) -> u64 {
        match self {
            KeyDist::Uniform { n } => rng.below(*n),
            KeyDist::Zipfian { n, scrambled, .. } => fnv64_ycsb(scrambled.next(rng)) % n,
        }
    }

    /// A rank in `0..n`, unscrambled: rank 0 is the hottest. YCSB's
    /// "latest" counts ranks back from the newest record.
    pub fn rank(&self, rng: &mut Rng) -> u64 {
        match self {
            KeyDist::Uniform { n } => rng.below(*n),
            KeyDist::Zipfian { ranks, .. } => ranks.next(rng),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipfian_is_skewed_like_ycsb() {
        let z = Zipfian::new(1000, 0.99);
        let mut rng = Rng::new(3);
        let mut counts = vec![0u32; 1000];
        for _ in 0..200_000 {
            counts[z.next(&mut rng) as usize] += 1;
        }
        // Rank 0 takes ~1/zeta(1000) ≈ 13% of draws; ranks fall off ~1/i.
        let p0 = counts[0] as f64 / 200_000.0;
        assert!((0.11..0.16).contains(&p0), "p(rank 0) = {p0}");
        assert!(counts[0] > counts[1] && counts[1] > counts[9] && counts[9] > counts[99]);
        let top10: u32 = counts[..10].iter().sum();
        assert!(top10 as f64 / 200_000.0 > 0.35);
    }

    #[test]
    fn zeta_tail_matches_the_direct_sum_and_ycsb_constant() {
        for &(n, theta) in &[(5_000u64, 0.99), (123_457, 0.5), (200_000, 1.2)] {
            let direct: f64 = (1..=n).map(|i| (i as f64).powf(-theta)).sum();
            let fast = zeta(n, theta);
            assert!(
                ((fast - direct) / direct).abs() < 1e-10,
                "{n} {theta}: {fast} vs {direct}"
            );
        }
        // YCSB's ScrambledZipfianGenerator.ZETAN, precomputed there for 0.99.
        let z = zeta(YCSB_ITEM_COUNT, 0.99);
        assert!((z - 26.46902820178302).abs() < 1e-8, "{z}");
    }

    #[test]
    fn scrambled_zipfian_hot_key_share_is_ycsbs_at_any_scale() {
        // The hottest record takes ~1/ZETAN = 3.78% at 0.99, plus the small
        // share of the ranks that hash onto it.
        for &records in &[1_000_000u64, 50_000_000] {
            let d = KeyDist::new(records, 0.99);
            let mut rng = Rng::new(7);
            let mut counts = std::collections::HashMap::new();
            let draws = 400_000;
            for _ in 0..draws {
                *counts.entry(d.next(&mut rng)).or_insert(0u32) += 1;
            }
            let top = *counts.values().max().unwrap() as f64 / draws as f64;
            assert!((0.033..0.043).contains(&top), "{records}: top share {top}");
            let hottest = fnv64_ycsb(0) % records;
            assert_eq!(
                counts.get(&hottest).copied(),
                counts.values().max().copied()
            );
        }
    }

    #[test]
    fn uniform_and_keys() {
        let d = KeyDist::new(100, 0.0);
        let mut rng = Rng::new(1);
        assert!((0..1000).all(|_| d.next(&mut rng) < 100));
        assert!((0..1000).all(|_| d.rank(&mut rng) < 100));
        // Unscrambled zipfian ranks: rank 0 is the most frequent.
        let z = KeyDist::new(100, 0.99);
        let zeros = (0..10_000).filter(|_| z.rank(&mut rng) == 0).count();
        assert!(zeros > 1_000, "rank 0 drawn {zeros} times in 10000");
    }
}
