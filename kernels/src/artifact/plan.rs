//! The static memory plan: liveness of every arena buffer over the steps, and offsets in one arena so that
//! buffers live at the same time never share a byte, while buffers whose lives do not overlap reuse space.
//!
//! Placement is greedy by size with best fit (the "greedy by size" planner of TFLite's arena planner, also
//! used by ONNX Runtime's and TVM's static planners in spirit): buffers are placed largest first; each goes
//! into the smallest gap between the already-placed buffers whose lifetimes overlap its own, or after the
//! last of them. Largest-first keeps big activations from fragmenting the arena; best fit keeps small ones in
//! the holes. Ties break by position, so the plan is a pure function of the steps.

use super::{slot_bytes, Body, Buf, ALIGN};

/// Steps during which a buffer holds data, inclusive. Step `n` (the number of steps) stands for "after the
/// last step", when outputs are copied out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Lifetime {
    pub first: u32,
    pub last: u32,
}

impl Lifetime {
    pub fn overlaps(&self, o: &Lifetime) -> bool {
        self.first <= o.last && o.first <= self.last
    }
}

/// Lifetimes of the arena buffers of `body`: every input lives for the whole run (its own slot; the caller's
/// data is copied in before the first step), each value from the step writing it to the last step reading it,
/// or to the end when it is a model output. A value no step writes gets `None`.
pub fn lifetimes(body: &Body) -> (Vec<Lifetime>, Vec<Option<Lifetime>>) {
    let end = body.steps.len() as u32;
    let inputs = vec![Lifetime { first: 0, last: end }; body.inputs.len()];
    let mut values: Vec<Option<Lifetime>> = vec![None; body.values.len()];
    for (s, step) in body.steps.iter().enumerate() {
        let s = s as u32;
        for &arg in &step.args {
            if let Buf::Value(v) = arg {
                if let Some(slot) = values.get_mut(v as usize) {
                    match slot {
                        None => *slot = Some(Lifetime { first: s, last: s }),
                        Some(l) => l.last = l.last.max(s),
                    }
                }
            }
        }
    }
    // A transfer reads its value just before its step: normally that step reads the value too, but the
    // plan does not rely on it.
    for t in &body.transfers {
        if let Some(Some(l)) = values.get_mut(t.value as usize) {
            l.last = l.last.max(t.before);
        }
    }
    for o in &body.outputs {
        if let Buf::Value(v) = o.source {
            if let Some(Some(l)) = values.get_mut(v as usize) {
                l.last = end;
            }
        }
    }
    (inputs, values)
}

/// One buffer to place: its size (a multiple of [`ALIGN`]) and when it is live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub size: u64,
    pub life: Lifetime,
}

/// Offsets for `requests` (multiples of [`ALIGN`]) and the arena size. Buffers whose lifetimes overlap get
/// disjoint byte ranges.
pub fn assign(requests: &[Request]) -> (Vec<u64>, u64) {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by(|&a, &b| requests[b].size.cmp(&requests[a].size).then(requests[a].life.first.cmp(&requests[b].life.first)).then(a.cmp(&b)));
    let mut offsets = vec![0u64; requests.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(requests.len());
    let mut arena = 0u64;
    let mut live: Vec<(u64, u64)> = Vec::new();
    for &i in &order {
        let r = requests[i];
        live.clear();
        live.extend(placed.iter().filter(|&&p| requests[p].life.overlaps(&r.life)).map(|&p| (offsets[p], offsets[p] + requests[p].size)));
        live.sort_unstable();
        let mut best: Option<(u64, u64)> = None; // (gap size, offset)
        let mut cursor = 0u64;
        for &(start, end) in &live {
            if start > cursor {
                let gap = start - cursor;
                if gap >= r.size && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, cursor));
                }
            }
            cursor = cursor.max(end);
        }
        let offset = best.map_or(cursor, |(_, o)| o);
        debug_assert_eq!(offset % ALIGN, 0);
        offsets[i] = offset;
        arena = arena.max(offset + r.size);
        placed.push(i);
    }
    (offsets, arena)
}

/// The arena requests of `body` in order: inputs, then values (values no step writes are given an empty
/// lifetime at the end and never conflict; validation rejects them anyway).
pub fn requests(body: &Body) -> Vec<Request> {
    let (inputs, values) = lifetimes(body);
    let end = body.steps.len() as u32;
    let ins = body.inputs.iter().zip(inputs).map(|(d, life)| Request { size: slot_bytes(&d.ty), life });
    let vals = body.values.iter().zip(values).map(|(d, life)| Request { size: slot_bytes(&d.ty), life: life.unwrap_or(Lifetime { first: end, last: end }) });
    ins.chain(vals).collect()
}

/// Checks that buffers with overlapping lifetimes have disjoint byte ranges; returns the first clashing pair.
/// A sweep over lifetimes keeps only the buffers still live, so this costs about n·(buffers live at once).
pub fn find_overlap(requests: &[Request], offsets: &[u64]) -> Option<(usize, usize)> {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|&i| (requests[i].life.first, i));
    let mut active: Vec<usize> = Vec::new();
    for &i in &order {
        let r = requests[i];
        active.retain(|&a| requests[a].life.last >= r.life.first);
        for &a in &active {
            let (s0, e0) = (offsets[a], offsets[a] + requests[a].size);
            let (s1, e1) = (offsets[i], offsets[i] + r.size);
            if s0 < e1 && s1 < e0 {
                return Some((a.min(i), a.max(i)));
            }
        }
        active.push(i);
    }
    None
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
