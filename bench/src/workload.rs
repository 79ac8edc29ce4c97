//! Workload generators: YCSB's zipfian distribution (Gray et al.'s
//! algorithm, as in YCSB's `ZipfianGenerator`), scrambled so hot keys spread
//! over the key space (`ScrambledZipfianGenerator`: FNV-1a of the rank), and
//! uniform. The operation mixes are files: see `ycsb.rs`.

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

fn zeta(n: u64, theta: f64) -> f64 {
    (1..=n).map(|i| 1.0 / (i as f64).powf(theta)).sum()
}

impl Zipfian {
    /// `theta` in (0, 1) ∪ (1, ∞); YCSB's default is 0.99. Computing zeta
    /// is O(n), done once.
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

/// FNV-1a 64 of a u64 (YCSB's `Utils.fnvhash64`).
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
    /// Zipfian over ranks, scrambled by hashing so hot keys are spread.
    Zipfian(Zipfian),
}

impl KeyDist {
    pub fn new(n: u64, theta: f64) -> KeyDist {
        if theta == 0.0 {
            KeyDist::Uniform { n }
        } else {
            KeyDist::Zipfian(Zipfian::new(n, theta))
        }
    }

    /// A record index in `0..n`.
    pub fn next(&self, rng: &mut Rng) -> u64 {
        match self {
            KeyDist::Uniform { n } => rng.below(*n),
            KeyDist::Zipfian(z) => fnv64(z.next(rng)) % z.n,
        }
    }

    /// A rank in `0..n`, unscrambled: rank 0 is the hottest. YCSB's
    /// "latest" counts ranks back from the newest record.
    pub fn rank(&self, rng: &mut Rng) -> u64 {
        match self {
            KeyDist::Uniform { n } => rng.below(*n),
            KeyDist::Zipfian(z) => z.next(rng),
        }
    }
}

/// The tree key of record `i`: records are spread over the 64-bit space
/// (and never u64::MAX, which the tree reserves).
pub fn key_of(i: u64) -> u64 {
    fnv64(i ^ 0x5bd1_e995) >> 1
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
    fn uniform_and_keys() {
        let d = KeyDist::new(100, 0.0);
        let mut rng = Rng::new(1);
        assert!((0..1000).all(|_| d.next(&mut rng) < 100));
        assert!((0..1000).all(|_| d.rank(&mut rng) < 100));
        // Unscrambled zipfian ranks: rank 0 is the most frequent.
        let z = KeyDist::new(100, 0.99);
        let zeros = (0..10_000).filter(|_| z.rank(&mut rng) == 0).count();
        assert!(zeros > 1_000, "rank 0 drawn {zeros} times in 10000");
        assert_ne!(key_of(1), key_of(2));
        assert!(key_of(u64::MAX) < u64::MAX);
    }
}
