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
mod tests {
    use super::*;
    use crate::interp::run_graph;
    use crate::ir::*;

    /// A typical exported shape computation: reshape x [2, 3, 4] to [x.shape[0], -1] through constants.
    fn shape_graph() -> (Graph, ValueId) {
        let mut g = Graph::new("shapes");
        let x = g.add_input("x", TensorType::f32([2, 3, 4]));
        let shape = g.add_const("shape", Tensor::from_i64(vec![3], &[2, 3, 4]));
        let first = g.add_const("zero", Tensor::from_i64(vec![1], &[0]));
        let d0 = g.add("d0", Op::Gather { axis: 0 }, &[shape, first]).unwrap();
        let rest = g.add("rest", Op::Slice { axes: vec![0], starts: vec![1], ends: vec![3], steps: vec![1] }, &[shape]).unwrap();
        let prod = g.add("prod", Op::Reduce { kind: ReduceKind::Sum, axes: vec![0], keepdims: true }, &[rest]).unwrap();
        let target = g.add("target", Op::Concat { axis: 0 }, &[d0, prod]).unwrap();
        let y = g.add("y", Op::Reshape { shape: vec![2, 12] }, &[x]).unwrap();
        let w = g.add_const("w", Tensor::from_f32(vec![2, 2], &[1., 2., 3., 4.]));
        let wt = g.add("wt", Op::Transpose { perm: vec![1, 0] }, &[w]).unwrap();
        g.outputs.extend([y, target, wt]);
        (g, x)
    }

    #[test]
    fn folds_shape_subgraphs_and_keeps_names() {
        let (mut g, _) = shape_graph();
        let before = run_graph(&g, &[Tensor::from_f32(vec![2, 3, 4], &[1.; 24])]).unwrap();
        let n = fold_constants(&mut g).unwrap();
        assert_eq!(n, 5); // d0, rest, prod, target, wt
        verify(&g).unwrap();
        assert_eq!(g.nodes.len(), 1);
        let target = g.outputs[1];
        assert_eq!(g.value(target).name, "target");
        assert_eq!(g.constant(target).unwrap().to_i64_vec(), vec![2, 7]);
        assert_eq!(g.constant(g.outputs[2]).unwrap().to_f32_vec(), vec![1., 3., 2., 4.]);
        let after = run_graph(&g, &[Tensor::from_f32(vec![2, 3, 4], &[1.; 24])]).unwrap();
        assert_eq!(before, after);
        // A second run finds nothing left.
        assert_eq!(fold_constants(&mut g).unwrap(), 0);
    }

    #[test]
    fn keeps_large_expansions_of_small_constants() {
        let mut g = Graph::new("grow");
        let one = g.add_const("one", Tensor::from_f32(vec![1], &[1.0]));
        let big = g.add("big", Op::Expand { shape: vec![1024, 1025] }, &[one]).unwrap();
        let small = g.add("small", Op::Expand { shape: vec![1024, 1024] }, &[one]).unwrap();
        g.outputs.extend([big, small]);
        assert_eq!(fold_constants(&mut g).unwrap(), 1);
        assert_eq!(g.nodes.len(), 1);
        assert!(matches!(g.nodes[0].op, Op::Expand { .. }));
        assert!(g.constant(g.outputs[1]).is_some());
        assert!(worth_folding(4_000_000, 4_000_000));
        assert!(!worth_folding(1, FOLD_MAX_GROWN_ELEMENTS + 1));
    }

    #[test]
    fn an_error_names_the_node() {
        let mut g = Graph::new("bad");
        let data = g.add_const("data", Tensor::from_i64(vec![2], &[1, 2]));
        let idx = g.add_const("idx", Tensor::from_i64(vec![1], &[7]));
        let y = g.add("pick", Op::Gather { axis: 0 }, &[data, idx]).unwrap();
        g.outputs.push(y);
        let e = fold_constants(&mut g).unwrap_err().to_string();
        assert!(e.contains("'bad'") && e.contains("node 'pick' (Gather)") && e.contains("index 7"), "{e}");
    }
}
