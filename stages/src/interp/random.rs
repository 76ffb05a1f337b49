//! Seeded random inputs: what `tessera run` feeds inputs the user did not give, and what tests and
//! benchmarks feed models. The values are a documented function of (seed, input position), so a run can
//! be reproduced from its seed, and never all zeros, so a benchmark never times a degenerate case.
//!
//! Distribution, per input `i`, from a ChaCha20 stream keyed by `seed` with stream number `i` (so the
//! values of one input do not depend on the sizes of the others):
//! - floats: `k · 2⁻²³ − 1` for `k` the top 24 bits of a 32-bit draw, i.e. uniform on a 2⁻²³ grid of
//!   [-1, 1), redrawn if exactly 0, then rounded to f16/bf16 for those dtypes (still never 0);
//! - integers: uniform in [0, B) by multiply-shift of a 32-bit draw, with B = [`INT_INPUT_BOUND`] (100)
//!   lowered to the axis size wherever the input (directly or through Reshape, Cast, Transpose and
//!   other index-preserving ops) indexes a Gather, GatherElements, GatherND or ScatterND, so every index is valid (BERT's
//!   token_type_ids index a table of 2 rows); and B = 2 wherever it is cast to a float or to bool: an
//!   integer read as a number or a truth value is a 0/1 mask (`attention_mask`, which exporters turn into
//!   `(1 - mask) * lowest`, or count with CumSum into position ids). Values up to 99 there are no mask at
//!   all: they push scores to +-1e6 and positions past their table, which no real input does and which
//!   made fp16 calibration fail on OPT. Masks are drawn as padding masks (`random_mask`: each row a run
//!   of 1s of random length, at least one, then 0s), not independent bits: independent bits mask whole
//!   rows of a causal model's attention (query 0 with key 0 masked), whose softmax then mixes scores
//!   offset by the mask value (-1e4), information no 16-bit type keeps and no real input asks for.
//!   (`tessera run` on an artifact, which has no graph, draws a mask's 0s and 1s independently;)
//! - bools: a fair coin (lowest bit of a draw).

use crate::ir::{DType, Graph, Op, Tensor};
pub use tessera_kernels::random::{random_mask, random_tensor, INT_INPUT_BOUND};

/// Ops through which integer values reach their output unchanged (as a multiset of values), on the
/// input positions that carry them.
fn passes_values(op: &Op, input_pos: usize) -> bool {
    match op {
        Op::Identity
        | Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Slice { .. }
        | Op::Split { .. }
        | Op::Expand { .. }
        | Op::Tile { .. }
        | Op::Pad { .. }
        | Op::Concat { .. } => true,
        Op::Cast { to } => to.is_int(),
        Op::Gather { .. } | Op::GatherElements { .. } | Op::GatherND { .. } => input_pos == 0,
        Op::ScatterND => input_pos != 1,
        Op::Where => input_pos > 0,
        _ => false,
    }
}

/// The exclusive bound of an integer input cast to a float or to bool (a 0/1 mask): values 0 and 1.
pub const MASK_BOUND: i64 = 2;

/// For each graph input, the exclusive bound its integer values must respect: the smallest axis size
/// it (or a value copied from it) indexes, [`MASK_BOUND`] where it is cast to a float or bool, capped at
/// [`INT_INPUT_BOUND`].
pub fn int_input_bounds(g: &Graph) -> Vec<i64> {
    int_input_uses(g).into_iter().map(|(bound, _)| bound).collect()
}

/// For each graph input: its bound ([`int_input_bounds`]), and whether it is a mask (cast to a float or
/// bool, with room for 0 and 1).
fn int_input_uses(g: &Graph) -> Vec<(i64, bool)> {
    let consumers = g.consumers();
    g.inputs
        .iter()
        .map(|&input| {
            let mut bound = INT_INPUT_BOUND;
            let mut mask = false;
            let mut seen = vec![false; g.values.len()];
            let mut stack = vec![input];
            while let Some(v) = stack.pop() {
                if std::mem::replace(&mut seen[v.index()], true) {
                    continue;
                }
                for &n in &consumers[v.index()] {
                    let node = g.node(n);
                    for (pos, _) in node.inputs.iter().enumerate().filter(|(_, &i)| i == v) {
                        match &node.op {
                            Op::Gather { axis } | Op::GatherElements { axis } if pos == 1 => {
                                let dim = g.ty(node.inputs[0]).shape[*axis] as i64;
                                bound = bound.min(dim.max(1));
                            }
                            // Each tuple entry indexes one of the k dims after the batch dims.
                            Op::GatherND { .. } | Op::ScatterND if pos == 1 => {
                                let b = if let Op::GatherND { batch_dims } = &node.op { *batch_dims } else { 0 };
                                let k = g.ty(v).shape.last().copied().unwrap_or(0);
                                let dims = &g.ty(node.inputs[0]).shape[b..b + k];
                                let dim = dims.iter().copied().min().unwrap_or(1) as i64;
                                bound = bound.min(dim.max(1));
                            }
                            Op::Cast { to } if to.is_float() || *to == DType::Bool => {
                                bound = bound.min(MASK_BOUND);
                                mask = true;
                            }
                            op if passes_values(op, pos) => stack.extend(node.outputs.iter().copied()),
                            _ => {}
                        }
                    }
                }
            }
            (bound, mask && bound == MASK_BOUND)
        })
        .collect()
}

/// Random inputs for every graph input, in `g.inputs` order (see the module documentation for the
/// distribution). Integer inputs that index a Gather stay inside the gathered axis; masks are padding
/// masks ([`random_mask`]).
pub fn random_inputs(g: &Graph, seed: u64) -> Vec<Tensor> {
    let uses = int_input_uses(g);
    g.inputs
        .iter()
        .enumerate()
        .map(|(i, &v)| match uses[i] {
            (_, true) if g.ty(v).dtype.is_int() => random_mask(g.ty(v), seed, i as u64),
            (bound, _) => random_tensor(g.ty(v), seed, i as u64, bound),
        })
        .collect()
}
