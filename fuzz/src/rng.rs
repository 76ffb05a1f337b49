//! splitmix64: every execution's generator is seeded by (run seed, execution index), so any execution can
//! be regenerated alone.

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The generator of execution `index` of a run seeded `seed`.
    pub fn for_exec(seed: u64, index: u64) -> Rng {
        let mut r = Rng(seed ^ index.wrapping_mul(0xd605_bbb5_8c8a_bbb5));
        r.bits();
        r
    }

    pub fn bits(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`; 0 when `n == 0`.
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.bits() % n as u64) as usize
        }
    }

    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }

    /// An "interesting" integer: boundaries, small values, huge and negative ones.
    pub fn interesting_i64(&mut self) -> i64 {
        const V: [i64; 16] = [0, 1, -1, 2, 3, 7, 64, 255, 1 << 16, 1 << 31, -(1 << 31), 1 << 40, i64::MAX, i64::MIN, i64::MAX / 2, -7];
        if self.one_in(3) {
            self.below(40) as i64 - 8
        } else {
            *self.pick(&V)
        }
    }
}
