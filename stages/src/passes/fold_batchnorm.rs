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
mod tests {
    use super::*;
    use crate::ir::{ConvAttrs, TensorType};
    use crate::passes::simplify::testing::assert_same_outputs;

    fn conv_bn(with_bias: bool, conv_is_output: bool) -> Graph {
        let mut g = Graph::new("cbn");
        let x = g.add_input("x", TensorType::f32([1, 3, 6, 6]));
        let wv: Vec<f32> = (0..4 * 3 * 3 * 3).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.1).collect();
        let w = g.add_const("w", Tensor::from_f32([4, 3, 3, 3], &wv));
        let attrs = ConvAttrs { strides: vec![1, 1], pads: vec![1, 1, 1, 1], dilations: vec![1, 1], group: 1 };
        let mut ins = vec![x, w];
        if with_bias {
            ins.push(g.add_const("b", Tensor::from_f32([4], &[0.1, -0.2, 0.3, 0.0])));
        }
        let c = g.add("conv", Op::Conv(attrs), &ins).unwrap();
        let p = |g: &mut Graph, n: &str, v: [f32; 4]| g.add_const(n, Tensor::from_f32([4], &v));
        let gamma = p(&mut g, "gamma", [1.0, 0.5, 2.0, -1.0]);
        let beta = p(&mut g, "beta", [0.0, 0.1, -0.3, 0.2]);
        let mean = p(&mut g, "mean", [0.05, -0.1, 0.2, 0.0]);
        let var = p(&mut g, "var", [1.0, 0.25, 4.0, 0.5]);
        let y = g.add("bn", Op::BatchNorm { epsilon: 1e-5 }, &[c, gamma, beta, mean, var]).unwrap();
        g.outputs.push(y);
        if conv_is_output {
            g.outputs.push(c);
        }
        g
    }

    #[test]
    fn folds_with_and_without_conv_bias() {
        for bias in [true, false] {
            let g0 = conv_bn(bias, false);
            let mut g = g0.clone();
            assert_eq!(fold_batchnorm_into_conv(&mut g), 1);
            g.compact();
            crate::ir::verify(&g).unwrap();
            assert_eq!(g.nodes.len(), 1);
            assert!(matches!(g.nodes[0].op, Op::Conv(_)));
            assert_same_outputs(&g0, &g, 1e-5);
        }
    }

    #[test]
    fn conv_output_with_another_use_is_not_folded() {
        let mut g = conv_bn(true, true);
        assert_eq!(fold_batchnorm_into_conv(&mut g), 0);
    }

    /// conv -> bn -> conv -> bn: the second fold reads the first one's output, so no BatchNorm may survive.
    #[test]
    fn chained_folds_leave_no_batchnorm() {
        let mut g = Graph::new("chain");
        let x = g.add_input("x", TensorType::f32([1, 4, 5, 5]));
        let attrs = ConvAttrs { strides: vec![1, 1], pads: vec![1; 4], dilations: vec![1, 1], group: 1 };
        let mut v = x;
        for layer in 0..2 {
            let w: Vec<f32> = (0..4 * 4 * 9).map(|i| ((i * 7 + layer) % 11) as f32 / 11.0 - 0.5).collect();
            let w = g.add_const(format!("w{layer}"), Tensor::from_f32([4, 4, 3, 3], &w));
            let c = g.add(format!("conv{layer}"), Op::Conv(attrs.clone()), &[v, w]).unwrap();
            let p = |g: &mut Graph, n: &str, v: [f32; 4]| g.add_const(format!("{n}{layer}"), Tensor::from_f32([4], &v));
            let gamma = p(&mut g, "gamma", [1.0, 0.5, 2.0, -1.0]);
            let beta = p(&mut g, "beta", [0.0, 0.1, -0.3, 0.2]);
            let mean = p(&mut g, "mean", [0.05, -0.1, 0.2, 0.0]);
            let var = p(&mut g, "var", [1.0, 0.25, 4.0, 0.5]);
            v = g.add(format!("bn{layer}"), Op::BatchNorm { epsilon: 1e-5 }, &[c, gamma, beta, mean, var]).unwrap();
        }
        g.outputs.push(v);
        let g0 = g.clone();
        assert_eq!(fold_batchnorm_into_conv(&mut g), 2);
        g.compact();
        crate::ir::verify(&g).unwrap();
        assert!(g.nodes.iter().all(|n| matches!(n.op, Op::Conv(_))), "{:?}", g.nodes.iter().map(|n| n.op.name()).collect::<Vec<_>>());
        assert_eq!(g.nodes.len(), 2);
        assert_same_outputs(&g0, &g, 1e-5);
    }
}
