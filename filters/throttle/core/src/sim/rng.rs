//! A small seeded generator (SplitMix64): the same seed gives the same run.

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's finaliser.
fn finalise(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One draw from `x` alone, as a generator's next would be after `x`: for
/// a value a scenario derives without taking from a seed's generator.
pub fn mix(x: u64) -> u64 {
    finalise(x.wrapping_add(GAMMA))
}

/// SplitMix64 (Steele, Lea and Flood), deterministic and fast enough for a
/// simulation; not for anything secret.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        finalise(self.0)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi]` (hi >= lo).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi.saturating_sub(lo).saturating_add(1)).max(1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// One of `items` (not empty).
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        let i = (self.next_u64() % items.len().max(1) as u64) as usize;
        items[i.min(items.len().saturating_sub(1))]
    }

    /// Exponential with mean `mean` (Poisson arrivals), at least 1.
    pub fn exp(&mut self, mean: f64) -> u64 {
        let u = self.unit().max(1e-12);
        ((-u.ln()) * mean).max(1.0) as u64
    }

    /// A new generator for a part of the run (independent of the draws of
    /// the others).
    pub fn fork(&mut self, salt: u64) -> Rng {
        Rng::new(self.next_u64() ^ salt.wrapping_mul(0xD6E8_FEB8_6659_FD93))
    }
}
