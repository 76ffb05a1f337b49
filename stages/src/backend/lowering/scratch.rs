//! Scratch layout: offsets for buffers with live intervals, reusing memory between buffers whose lifetimes
//! do not overlap.
//!
//! Greedy by size (largest first, then earliest start, then request order, so the layout is a pure function of
//! the requests): each buffer takes the lowest 64-byte-aligned offset that does not overlap any already placed
//! buffer whose interval intersects its own. Intervals are inclusive item indices: an item never writes a
//! buffer while reading another that shares its memory.

/// Alignment of every scratch buffer, in bytes (a cache line; enough for any vector load).
pub const ALIGN: u64 = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub bytes: u64,
    /// First item that writes the buffer.
    pub start: usize,
    /// Last item that reads it.
    pub end: usize,
}

fn align(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// Offsets for each request and the total scratch size.
pub fn assign(reqs: &[Request]) -> (Vec<u64>, u64) {
    let mut order: Vec<usize> = (0..reqs.len()).collect();
    order.sort_by(|&a, &b| reqs[b].bytes.cmp(&reqs[a].bytes).then(reqs[a].start.cmp(&reqs[b].start)).then(a.cmp(&b)));
    let mut offsets = vec![0u64; reqs.len()];
    let mut placed: Vec<usize> = Vec::new();
    let mut total = 0u64;
    for &i in &order {
        let r = reqs[i];
        if r.bytes == 0 {
            continue;
        }
        // Busy ranges of live-overlapping buffers, sorted by offset.
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&j| reqs[j].start <= r.end && r.start <= reqs[j].end)
            .map(|&j| (offsets[j], offsets[j] + align(reqs[j].bytes)))
            .collect();
        busy.sort();
        let mut at = 0u64;
        for (lo, hi) in busy {
            if at + align(r.bytes) <= lo {
                break;
            }
            at = at.max(hi);
        }
        offsets[i] = at;
        total = total.max(at + align(r.bytes));
        placed.push(i);
    }
    (offsets, total)
}

#[cfg(test)]
#[path = "scratch_tests.rs"]
mod tests;
