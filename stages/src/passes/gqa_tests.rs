use super::*;
use crate::ir::{AttentionAttrs, DType, TensorType};
use crate::passes::simplify::testing::assert_same_outputs;

/// `Attention(q, repeat_kv(k), repeat_kv(v), mask?)` with `hkv` key/value heads in groups of `group`, K in
/// `[.., Sk, D]` or transposed; `mask_heads` 1 or H.
fn gqa(hkv: usize, group: usize, k_transposed: bool, mask_heads: Option<usize>, keep: bool) -> Graph {
    let (b, sq, sk, d) = (2, 5, 7, 8);
    let h = hkv * group;
    let mut g = Graph::new("gqa");
    let q = g.add_input("q", TensorType::f32([b, h, sq, d]));
    let repeat = |g: &mut Graph, name: &str, rows: usize, cols: usize| {
        let u = g.add_input(name, TensorType::f32([b, hkv, 1, rows, cols]));
        let e = g.add(format!("{name}_expand"), Op::Expand { shape: vec![b, hkv, group, rows, cols] }, &[u]).unwrap();
        g.add(format!("{name}_heads"), Op::Reshape { shape: vec![b, h, rows, cols] }, &[e]).unwrap()
    };
    let k = if k_transposed { repeat(&mut g, "k", d, sk) } else { repeat(&mut g, "k", sk, d) };
    let v = repeat(&mut g, "v", sk, d);
    let mut inputs = vec![q, k, v];
    if let Some(mh) = mask_heads {
        inputs.push(g.add_input("mask", TensorType::f32([b, mh, sq, sk])));
    }
    if keep {
        inputs.push(g.add_input("keep", TensorType::new(DType::Bool, vec![sq, sk])));
    }
    let attrs = AttentionAttrs { scale: 0.3, k_transposed, mask: mask_heads.is_some(), keep_fill: keep.then_some(-1e4), nan_to_zero: true };
    let y = g.add("attention", Op::Attention(attrs), &inputs).unwrap();
    let y = g.add("after", Op::Unary(crate::ir::UnaryOp::Neg), &[y]).unwrap();
    g.outputs.push(y);
    g
}

fn rewrites(hkv: usize, group: usize, k_transposed: bool, mask_heads: Option<usize>, keep: bool) {
    let g0 = gqa(hkv, group, k_transposed, mask_heads, keep);
    let mut g = g0.clone();
    assert_eq!(read_gqa_in_place(&mut g), 1);
    g.compact();
    crate::ir::verify(&g).unwrap();
    assert!(!g.nodes.iter().any(|n| matches!(n.op, Op::Expand { .. })), "no repeated K or V is made");
    let att = g.nodes.iter().find(|n| matches!(n.op, Op::Attention(_))).unwrap();
    assert_eq!(g.ty(att.inputs[1]).shape[2], 1, "K is read with its group dim of 1");
    assert_same_outputs(&g0, &g, 1e-6);
}

#[test]
fn grouped_and_multi_query_attention_read_k_and_v_in_place() {
    rewrites(2, 2, false, Some(1), false);
    rewrites(2, 3, true, Some(6), true);
    rewrites(1, 4, false, None, true);
    rewrites(3, 2, false, None, false);
}

#[test]
fn mismatched_groups_are_left_alone() {
    let mut g = gqa(2, 2, false, Some(1), false);
    // V repeated with another group size: [2, 1, 1, 7, 8] -> [2, 1, 4, 7, 8] -> [2, 4, 7, 8].
    let v = g.add_input("v2", TensorType::f32([2, 1, 1, 7, 8]));
    let e = g.add("v2_expand", Op::Expand { shape: vec![2, 1, 4, 7, 8] }, &[v]).unwrap();
    let v = g.add("v2_heads", Op::Reshape { shape: vec![2, 4, 7, 8] }, &[e]).unwrap();
    let att = g.nodes.iter().position(|n| matches!(n.op, Op::Attention(_))).unwrap();
    g.nodes[att].inputs[2] = v;
    assert_eq!(read_gqa_in_place(&mut g), 0);
    // A mask with a head count that is neither 1 nor H.
    assert_eq!(mask_view(&[2, 4, 5, 7], 2, 2), Some(vec![2, 2, 2, 5, 7]));
    assert_eq!(mask_view(&[5, 7], 2, 2), Some(vec![1, 1, 1, 5, 7]));
    assert!(mask_view(&[2, 2, 5, 7], 2, 2).is_none());
}
