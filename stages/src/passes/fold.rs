//! Constant folding: every node whose inputs are all constants is evaluated with the reference
//! interpreter ([`crate::interp::eval_op`]) and its outputs become constants, so shape subgraphs and
//! weight preprocessing (transposes, casts, reshapes of initializers) disappear before partitioning.
//!
//! One exception keeps artifacts small: a node is left in place when folding would *grow* the graph's
//! constant data a lot, i.e. when its outputs hold more than [`FOLD_MAX_GROWN_ELEMENTS`] elements and
//! more elements than its inputs together (Expand, Tile, Pad, or a broadcast Add of small constants into
//! a large tensor). Folding that would only rewrite existing data (a Transpose of a weight) always
//! happens: it costs no size and saves run time.

use crate::interp::{eval_op, InterpError};
use crate::ir::{Graph, Tensor};

/// Outputs larger than this (in elements, summed over the node's outputs) are not materialized from
/// smaller inputs: 1 Mi elements, 4 MiB as f32.
pub const FOLD_MAX_GROWN_ELEMENTS: usize = 1 << 20;

/// Folding failed: evaluating a node on its constant inputs is an error the graph would also hit at
/// run time (an out-of-range Gather index, an integer division by zero...).
/// The interpreter's error is in the message, not in `source()` (anyhow's `{:#}` would print it twice).
#[derive(Debug, thiserror::Error)]
#[error("constant folding in graph '{graph}': {cause}")]
pub struct FoldError {
    pub graph: String,
    pub cause: Box<InterpError>,
}

/// Whether folding a node with these input and output element counts stays within the growth limit.
pub fn worth_folding(input_elements: usize, output_elements: usize) -> bool {
    output_elements <= FOLD_MAX_GROWN_ELEMENTS || output_elements <= input_elements
}

/// Folds every node whose inputs are all constants (repeatedly, in one forward sweep, since nodes are in
/// topological order), then compacts the graph. Returns the number of nodes folded. Folded outputs keep
/// their names; a graph output that folds becomes a constant output.
pub fn fold_constants(g: &mut Graph) -> Result<usize, FoldError> {
    let mut folded = 0;
    for n in 0..g.nodes.len() {
        let node = &g.nodes[n];
        let Some(args) = node.inputs.iter().map(|&v| g.constant(v)).collect::<Option<Vec<&Tensor>>>() else {
            continue;
        };
        let in_elems: usize = args.iter().map(|t| t.numel()).sum();
        let out_elems: usize = node.outputs.iter().map(|&o| g.ty(o).numel()).sum();
        if !worth_folding(in_elems, out_elems) {
            continue;
        }
        let results = eval_op(&node.op, &args).map_err(|e| FoldError {
            graph: g.name.clone(),
            cause: Box::new(match e {
                InterpError::Op { op, msg } => InterpError::Node { node: node.name.clone(), op, msg },
                other => other,
            }),
        })?;
        let outputs = node.outputs.clone();
        for (o, t) in outputs.into_iter().zip(results) {
            let name = g.value(o).name.clone();
            let c = g.add_const(name, t);
            g.replace_uses(o, c);
        }
        folded += 1;
    }
    if folded > 0 {
        g.compact();
    }
    Ok(folded)
}

#[cfg(test)]
#[path = "fold_tests.rs"]
mod tests;
