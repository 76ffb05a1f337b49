//! Static scratch allocation for one plan function: first-fit over a linear arena, regions freed after their
//! last use and merged with free neighbours. Offsets are in f32 elements and aligned to 16 (64 bytes, the
//! alignment of the scratch buffer itself), so GEMM operands in scratch start on cache lines. Deterministic:
//! the same sequence of requests gives the same offsets.

/// Alignment of every region, in f32 elements.
pub const ALIGN: u64 = 16;

#[derive(Debug, Default)]
pub struct Arena {
    /// Free regions `(offset, len)`, sorted by offset, never adjacent.
    free: Vec<(u64, u64)>,
    /// End of the highest region ever handed out: the scratch size the function needs.
    top: u64,
}

fn round_up(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

impl Arena {
    /// A region of at least `len` elements (a zero-length request still gets a distinct offset).
    pub fn alloc(&mut self, len: u64) -> u64 {
        let len = round_up(len.max(1));
        if let Some(i) = self.free.iter().position(|&(_, l)| l >= len) {
            let (off, l) = self.free[i];
            if l == len {
                self.free.remove(i);
            } else {
                self.free[i] = (off + len, l - len);
            }
            return off;
        }
        // Grow: reuse a free region that ends at the top.
        let off = match self.free.last() {
            Some(&(o, l)) if o + l == self.top => {
                self.free.pop();
                o
            }
            _ => self.top,
        };
        self.top = off + len;
        off
    }

    /// Returns a region given by [`Arena::alloc`] with the same `len`.
    pub fn free(&mut self, off: u64, len: u64) {
        let len = round_up(len.max(1));
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, len));
        // Merge with the next, then with the previous region.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }

    /// The scratch size needed so far, in f32 elements.
    pub fn size(&self) -> u64 {
        self.top
    }
}

#[cfg(test)]
#[path = "arena_tests.rs"]
mod tests;
