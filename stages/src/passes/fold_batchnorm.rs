//! Folds an inference BatchNormalization into the Conv that feeds it:
//! `bn(conv(x, w) + b) = conv(x, w * k) + (b - mean) * k + beta` with `k = gamma / sqrt(var + eps)` per output
//! channel. Applies when the conv's output feeds only the BatchNormalization (it is not a graph output either)
//! and the weight, the conv bias (if any) and all four statistics are constants. The new weight and bias are
//! computed in f64 and rounded once to the conv's dtype.

use super::pattern::Uses;
use crate::ir::{Graph, NodeId, Op, Tensor, ValueId};

struct Fold {
    bn_out: ValueId,
    x: ValueId,
    conv: NodeId,
    weight: Tensor,
    bias: Tensor,
}

fn plan(g: &Graph, uses: &Uses, bn: NodeId) -> Option<Fold> {
    let node = g.node(bn);
    let Op::BatchNorm { epsilon } = node.op else { return None };
    let conv_out = node.inputs[0];
    if !uses.single(conv_out) {
        return None;
    }
    let conv = g.producer(conv_out)?;
    let cn = g.node(conv);
    if !matches!(cn.op, Op::Conv(_)) {
        return None;
    }
    let w = g.constant(cn.inputs[1])?;
    let dtype = w.dtype();
    if !dtype.is_float() {
        return None;
    }
    let c_out = w.shape()[0];
    let conv_bias = match cn.inputs.get(2) {
        Some(&b) => g.constant(b)?.to_f64_vec(),
        None => vec![0.0; c_out],
    };
    let stats: Vec<Vec<f64>> = node.inputs[1..5].iter().map(|&v| g.constant(v).map(|t| t.to_f64_vec())).collect::<Option<_>>()?;
    let (gamma, beta, mean, var) = (&stats[0], &stats[1], &stats[2], &stats[3]);
    if [gamma, beta, mean, var].iter().any(|s| s.len() != c_out) {
        return None;
    }
    let k: Vec<f64> = (0..c_out).map(|c| gamma[c] / (var[c] + epsilon as f64).sqrt()).collect();
    let per = w.numel() / c_out.max(1);
    let wv = w.to_f64_vec();
    let new_w: Vec<f64> = wv.iter().enumerate().map(|(i, &x)| x * k[i / per]).collect();
    let new_b: Vec<f64> = (0..c_out).map(|c| (conv_bias[c] - mean[c]) * k[c] + beta[c]).collect();
    Some(Fold {
        bn_out: node.outputs[0],
        x: cn.inputs[0],
        conv,
        weight: Tensor::from_f64_as(dtype, w.shape().to_vec(), &new_w),
        bias: Tensor::from_f64_as(dtype, [c_out], &new_b),
    })
}

/// Folds every eligible Conv + BatchNormalization pair; returns how many.
pub fn fold_batchnorm_into_conv(g: &mut Graph) -> usize {
    let uses = Uses::new(g);
    let folds: Vec<Fold> = (0..g.nodes.len()).filter_map(|i| plan(g, &uses, NodeId(i as u32))).collect();
    let count = folds.len();
    // Folds are applied in node order; a later conv may read an earlier fold's BatchNorm output, so its input
    // is looked up through the replacements made so far (else the old BatchNorm would stay alive).
    let mut replaced: std::collections::BTreeMap<ValueId, ValueId> = std::collections::BTreeMap::new();
    for f in folds {
        let x = *replaced.get(&f.x).unwrap_or(&f.x);
        let (name, op) = {
            let cn = g.node(f.conv);
            (cn.name.clone(), cn.op.clone())
        };
        let w = g.add_const(format!("{name}/w_bn"), f.weight);
        let b = g.add_const(format!("{name}/b_bn"), f.bias);
        let y = g.add(format!("{name}/bn"), op, &[x, w, b]).expect("folded conv keeps its types");
        g.replace_uses(f.bn_out, y);
        replaced.insert(f.bn_out, y);
    }
    count
}

#[cfg(test)]
#[path = "fold_batchnorm_tests.rs"]
mod tests;
