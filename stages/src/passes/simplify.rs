//! The simplifications importers need, run by the ONNX importer after every import:
//!
//! 1. [`remove_identities`]: Identity nodes (and Casts to the same dtype) disappear (their uses read the input).
//! 2. [`fold_weight_transposes`]: a Transpose of a constant (Gemm's `transB` on a weight) becomes a transposed
//!    constant, so MatMul reads the weight directly; [`transposes_as_reshapes`]: a Transpose that moves only
//!    size-1 axes becomes a Reshape, which backends run as an alias (no copy); [`batch_matmul_rows`]: a 2-D
//!    MatMul (and its bias) whose output is only reshaped to split its rows becomes a MatMul over those batches,
//!    so the op after it (a residual add) meets the MatMul without a Reshape between.
//! 3. [`fold_batchnorm_into_conv`]: inference BatchNormalization after a Conv folds into its weight and bias.
//! 4. [`fuse_gelu`]: erf- and tanh-GELU written out by exporters become one `Gelu`.
//! 5. [`fuse_layernorm`]: decomposed layer normalization becomes one `LayerNorm`.
//! 6. [`unsplit_masked_adds`]: a mask added in a view that splits the leading axis (Swin's shifted windows)
//!    is added in the unsplit shape; [`collapse_movement`]: a Reshape, Transpose, Reshape chain that is one
//!    Transpose of a view becomes one (the dynamo exporter's 3-D head moves); then [`fuse_attention`]: scaled
//!    dot-product attention (MatMul, scale, masks, Softmax, the exporters' NaN guard, MatMul) becomes one
//!    `Attention`, and [`read_gqa_in_place`]: one whose K and V are key/value heads repeated for their query
//!    groups (`repeat_kv`) reads them unrepeated.
//! 7. [`collapse_reshapes`]: a Reshape of a Reshape reads the first one's input, and a Reshape back to its
//!    input's shape disappears (exporters flatten rows for a GEMM and restore them; the rewrites above leave
//!    such pairs between a GELU and the next GEMM).
//! 8. [`merge_sibling_matmuls`]: MatMuls of one activation by constant weights (BERT's query, key and value
//!    projections) become one MatMul over the weights side by side and a Split.
//!
//! Each is a small function over the graph that rewrites by adding nodes and redirecting uses; the graph is
//! compacted after each (dead nodes go, topological order is restored) and verified at the end. Every rewrite
//! checks the constants it relies on and is exact in real arithmetic, so results change only by rounding
//! (the unit tests compare the reference interpreter's outputs before and after within 1e-5).

pub use super::attention::fuse_attention;
pub use super::fold_batchnorm::fold_batchnorm_into_conv;
pub use super::gelu::fuse_gelu;
pub use super::layernorm::fuse_layernorm;
pub use super::siblings::merge_sibling_matmuls;
pub use super::window_mask::unsplit_masked_adds;
pub use super::gqa::read_gqa_in_place;
pub use super::movement::collapse_movement;
use super::pattern::Uses;
use crate::ir::{verify, Graph, Op, ValueDef, VerifyError};

/// How many rewrites each simplification made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimplifyReport {
    pub identities: usize,
    pub transposes: usize,
    pub matmul_rows: usize,
    pub batchnorms: usize,
    pub gelus: usize,
    pub layernorms: usize,
    pub window_masks: usize,
    pub movements: usize,
    pub attentions: usize,
    pub gqa: usize,
    pub reshapes: usize,
    pub siblings: usize,
}

/// Runs every simplification, then dead-code elimination and the verifier.
pub fn simplify(g: &mut Graph) -> Result<SimplifyReport, VerifyError> {
    let mut r = SimplifyReport::default();
    g.compact();
    r.identities = remove_identities(g);
    g.compact();
    r.transposes = fold_weight_transposes(g);
    g.compact();
    r.transposes += transposes_as_reshapes(g);
    g.compact();
    r.matmul_rows = batch_matmul_rows(g);
    g.compact();
    r.batchnorms = fold_batchnorm_into_conv(g);
    g.compact();
    r.gelus = fuse_gelu(g);
    g.compact();
    r.layernorms = fuse_layernorm(g);
    g.compact();
    r.window_masks = unsplit_masked_adds(g);
    g.compact();
    r.movements = collapse_movement(g);
    g.compact();
    r.attentions = fuse_attention(g);
    g.compact();
    r.gqa = read_gqa_in_place(g);
    g.compact();
    r.reshapes = collapse_reshapes(g);
    g.compact();
    r.siblings = merge_sibling_matmuls(g);
    g.compact();
    verify(g)?;
    Ok(r)
}

/// Redirects the uses of every Identity's output to its input; a Cast to the dtype its input already has
/// (PyTorch exports `.to(dtype)` and `.type(dtype)` as one, e.g. around GPT-2's attention softmax) counts
/// as an Identity. An Identity that maps a graph input (or a value that is already another graph output) to
/// a graph output stays: removing it would rename or merge outputs that callers bind by name.
pub fn remove_identities(g: &mut Graph) -> usize {
    let mut count = 0;
    for i in 0..g.nodes.len() {
        let node = &g.nodes[i];
        let identity = match node.op {
            Op::Identity => true,
            Op::Cast { to } => to == g.ty(node.inputs[0]).dtype,
            _ => false,
        };
        if !identity {
            continue;
        }
        let (input, output) = (node.inputs[0], node.outputs[0]);
        if g.outputs.contains(&output)
            && (matches!(g.value(input).def, ValueDef::Input(_)) || g.outputs.contains(&input))
        {
            continue;
        }
        g.replace_uses(output, input);
        count += 1;
    }
    count
}

/// Replaces each Transpose of a constant by the transposed constant (evaluated by the reference interpreter),
/// when the constant has no other use (otherwise both layouts would be stored).
pub fn fold_weight_transposes(g: &mut Graph) -> usize {
    let uses = Uses::new(g);
    let mut count = 0;
    for i in 0..g.nodes.len() {
        let node = &g.nodes[i];
        if !matches!(node.op, Op::Transpose { .. }) {
            continue;
        }
        let Some(w) = g.constant(node.inputs[0]) else { continue };
        if !uses.single(node.inputs[0]) {
            continue;
        }
        let Ok(mut out) = crate::interp::eval_op(&node.op, &[w]) else { continue };
        let (name, output) = (format!("{}/transposed", node.name), node.outputs[0]);
        let c = g.add_const(name, out.remove(0));
        g.replace_uses(output, c);
        count += 1;
    }
    count
}

/// Replaces each Transpose whose axes of size above 1 keep their order by a Reshape to its output shape: the
/// elements stay where they are in memory, so the copy was a relabelling. (PyTorch's MultiheadAttention at
/// batch 1 exports two per layer, `[1, S, E] <-> [S, 1, E]`: ViT-B/16 ran 24 copy kernels for nothing.) A
/// Transpose that writes a graph output stays, as Identities do, so outputs keep their names.
pub fn transposes_as_reshapes(g: &mut Graph) -> usize {
    let mut count = 0;
    for i in 0..g.nodes.len() {
        let node = &g.nodes[i];
        let Op::Transpose { perm } = &node.op else { continue };
        let (input, output) = (node.inputs[0], node.outputs[0]);
        if g.outputs.contains(&output) {
            continue;
        }
        let shape = &g.ty(input).shape;
        let moved: Vec<usize> = perm.iter().copied().filter(|&a| shape[a] != 1).collect();
        if !moved.windows(2).all(|w| w[0] < w[1]) {
            continue;
        }
        let (name, to) = (format!("{}/as_reshape", node.name), g.ty(output).shape.clone());
        let Ok(r) = g.add(name, Op::Reshape { shape: to }, &[input]) else { continue };
        g.replace_uses(output, r);
        count += 1;
    }
    count
}

/// Rewrites `Reshape(.. Reshape(MatMul(a, w) [+ bias]))`, with `a` and `w` matrices, each value used once, and
/// the last Reshape splitting the rows only (`[d0, .., dk, N]` with `d0 * .. * dk` the rows of `a`), as
/// `MatMul(Reshape(a, [d0, .., dk, K]), w) [+ bias]`: the same GEMM over a batch that shares `w`. PyTorch's
/// GPT-2 (`Conv1D`: `addmm` on `x.view(-1, nx)`, then `.view` back) and MultiheadAttention's out-projection
/// export a Reshape between the GEMM and the residual add after it, and the libraries' epilogue chains stop
/// at a Reshape, so the add ran as a kernel of its own (24 per GPT-2 forward). The bias, a vector along the
/// last axis, broadcasts the same either way.
pub fn batch_matmul_rows(g: &mut Graph) -> usize {
    use crate::ir::BinaryOp;
    let uses = Uses::new(g);
    let reshape_of = |g: &Graph, v: crate::ir::ValueId| g.producer(v).filter(|&p| matches!(g.node(p).op, Op::Reshape { .. }));
    // Consumers as the graph was: rewrites only add readers of values whose nodes come earlier.
    let consumers = g.consumers();
    let mut count = 0;
    for i in 0..g.nodes.len() {
        let Op::Reshape { shape: to } = &g.nodes[i].op else { continue };
        let (to, last) = (to.clone(), g.nodes[i].outputs[0]);
        // The outermost Reshape of a chain: one its output is not only reshaped again.
        let reshaped_again = uses.single(last) && consumers[last.index()].iter().any(|&n| matches!(g.node(n).op, Op::Reshape { .. }));
        if reshaped_again {
            continue;
        }
        // Down the chain to the value before the first Reshape.
        let mut y = g.nodes[i].inputs[0];
        while let Some(p) = reshape_of(g, y).filter(|_| uses.single(y)) {
            y = g.node(p).inputs[0];
        }
        if !uses.single(y) || reshape_of(g, y).is_some() {
            continue;
        }
        let Some(p) = g.producer(y) else { continue };
        let is_matmul = |v: crate::ir::ValueId| g.producer(v).filter(|&m| g.node(m).op == Op::MatMul && uses.single(v));
        // y = MatMul(a, w), or y = Add of one with a bias along the last axis (either operand order).
        let (mm, bias) = match &g.node(p).op {
            Op::MatMul => (p, None),
            Op::Binary(BinaryOp::Add) => {
                let ins = &g.node(p).inputs;
                match (0..2).find_map(|k| is_matmul(ins[k]).map(|m| (m, k))) {
                    Some((m, k)) => (m, Some((ins[1 - k], k))),
                    None => continue,
                }
            }
            _ => continue,
        };
        let (a, w) = (g.node(mm).inputs[0], g.node(mm).inputs[1]);
        let (sa, sw) = (g.ty(a).shape.clone(), g.ty(w).shape.clone());
        if sa.len() != 2 || sw.len() != 2 || to.len() < 2 || to[to.len() - 1] != sw[1] || to[..to.len() - 1].iter().product::<usize>() != sa[0] {
            continue;
        }
        if let Some((b, _)) = bias {
            let sb = &g.ty(b).shape;
            if sb.is_empty() || sb[sb.len() - 1] != sw[1] || sb[..sb.len() - 1].iter().any(|&d| d != 1) || sb.len() > to.len() {
                continue;
            }
        }
        let name = g.node(mm).name.clone();
        let mut rows = to[..to.len() - 1].to_vec();
        rows.push(sa[1]);
        let Ok(a2) = g.add(format!("{name}/rows"), Op::Reshape { shape: rows }, &[a]) else { continue };
        let Ok(m2) = g.add(format!("{name}/batched"), Op::MatMul, &[a2, w]) else { continue };
        let out = match bias {
            None => m2,
            Some((b, k)) => {
                let ins = if k == 0 { [m2, b] } else { [b, m2] };
                let Ok(o) = g.add(format!("{}/batched", g.node(p).name), Op::Binary(BinaryOp::Add), &ins) else { continue };
                o
            }
        };
        if g.ty(out).shape != to {
            continue;
        }
        g.replace_uses(last, out);
        count += 1;
    }
    count
}

/// Collapses chains of Reshapes: each Reshape whose input is another Reshape's output reads that one's input
/// instead (a Reshape depends only on the element order, which no Reshape changes), and a Reshape whose
/// result has its input's shape is replaced by its input, unless it writes a graph output (outputs keep their
/// names, as for Identities). The Reshapes left unread go with the next compaction.
pub fn collapse_reshapes(g: &mut Graph) -> usize {
    let mut count = 0;
    for i in 0..g.nodes.len() {
        if !matches!(g.nodes[i].op, Op::Reshape { .. }) {
            continue;
        }
        let output = g.nodes[i].outputs[0];
        // The shape the Reshape produced: its attribute may hold ONNX's -1 and 0, which depend on the input.
        let shape = g.ty(output).shape.clone();
        let mut root = g.nodes[i].inputs[0];
        while let Some(p) = g.producer(root).filter(|&p| matches!(g.node(p).op, Op::Reshape { .. })) {
            root = g.node(p).inputs[0];
        }
        if g.ty(root).shape == shape && !g.outputs.contains(&output) {
            g.replace_uses(output, root);
            count += 1;
        } else if root != g.nodes[i].inputs[0] {
            g.nodes[i].inputs[0] = root;
            g.nodes[i].op = Op::Reshape { shape };
            count += 1;
        }
    }
    count
}

/// Test helpers shared by the simplification passes.
#[cfg(test)]
pub mod testing {
    use crate::interp::{random_inputs, run_graph};
    use crate::ir::Graph;

    /// Runs both graphs on the same seeded random inputs and asserts every output agrees within `tol`
    /// relative to the output's largest magnitude (at least 1).
    pub fn assert_same_outputs(before: &Graph, after: &Graph, tol: f64) {
        for seed in [1, 2] {
            let inputs = random_inputs(before, seed);
            let a = run_graph(before, &inputs).expect("original graph runs");
            let b = run_graph(after, &inputs).expect("rewritten graph runs");
            assert_eq!(a.len(), b.len());
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(x.ty, y.ty);
                let (x, y) = (x.to_f64_vec(), y.to_f64_vec());
                let scale = x.iter().fold(1.0f64, |m, v| m.max(v.abs()));
                for (p, q) in x.iter().zip(&y) {
                    assert!((p - q).abs() <= tol * scale, "outputs differ: {p} vs {q} (tolerance {tol} x {scale})");
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "simplify_tests.rs"]
mod tests;
