use super::*;
use crate::ir::TensorType;
use crate::passes::simplify::testing::assert_same_outputs;
use proptest::prelude::*;

/// `Reshape(Transpose(Reshape(x, a), perm), y)` then a Neg (so the chain's result is not the output).
fn chain(x: &[usize], a: &[usize], perm: &[usize], y: &[usize]) -> Graph {
    let mut g = Graph::new("movement");
    let v = g.add_input("x", TensorType::f32(x.to_vec()));
    let r = g.add("split", Op::Reshape { shape: a.to_vec() }, &[v]).unwrap();
    let t = g.add("t", Op::Transpose { perm: perm.to_vec() }, &[r]).unwrap();
    let o = g.add("merge", Op::Reshape { shape: y.to_vec() }, &[t]).unwrap();
    let n = g.add("neg", Op::Unary(crate::ir::UnaryOp::Neg), &[o]).unwrap();
    g.outputs.push(n);
    g
}

fn ops(g: &Graph) -> Vec<&'static str> {
    g.nodes.iter().map(|n| n.op.name()).collect()
}

#[test]
fn dynamo_llama_k_transpose_becomes_one_transpose_of_a_view() {
    // Llama's repeated K [1, 2, 2, 16, 32] (batch, kv heads, group, keys, head dim) through [4, 16, 32].
    let g0 = chain(&[1, 2, 2, 16, 32], &[4, 16, 32], &[0, 2, 1], &[1, 4, 32, 16]);
    let mut g = g0.clone();
    assert_eq!(collapse_movement(&mut g), 1);
    g.compact();
    assert_eq!(ops(&g), ["Reshape", "Transpose", "Neg"]);
    assert_eq!(g.nodes[0].op, Op::Reshape { shape: vec![1, 4, 16, 32] });
    assert_eq!(g.nodes[1].op, Op::Transpose { perm: vec![0, 1, 3, 2] });
    assert_same_outputs(&g0, &g, 0.0);
}

#[test]
fn dynamo_bert_k_transpose_is_a_transpose_of_k() {
    let g0 = chain(&[1, 2, 16, 32], &[2, 16, 32], &[0, 2, 1], &[1, 2, 32, 16]);
    let mut g = g0.clone();
    assert_eq!(collapse_movement(&mut g), 1);
    g.compact();
    assert_eq!(ops(&g), ["Transpose", "Neg"]);
    assert_eq!(g.nodes[0].op, Op::Transpose { perm: vec![0, 1, 3, 2] });
    assert_same_outputs(&g0, &g, 0.0);
}

#[test]
fn dynamo_bert_q_head_split_loses_a_node() {
    // [1, 16, 64] -> [1, 16, 2, 32] -> heads first -> [2, 16, 32] (batch and heads merged): the view [16, 2, 32]
    // of x with its first two dims swapped.
    let g0 = chain(&[1, 16, 64], &[1, 16, 2, 32], &[0, 2, 1, 3], &[2, 16, 32]);
    let mut g = g0.clone();
    assert_eq!(collapse_movement(&mut g), 1);
    g.compact();
    assert_eq!(ops(&g), ["Reshape", "Transpose", "Neg"]);
    assert_eq!(g.nodes[1].op, Op::Transpose { perm: vec![1, 0, 2] });
    assert_same_outputs(&g0, &g, 0.0);
}

#[test]
fn chains_that_are_no_transpose_of_a_view_are_left_alone() {
    // Reversed dims merged: [2, 3, 4] -> [4, 3, 2] -> [12, 2] merges 4 and 3, which x holds in the other order.
    let mut g = chain(&[2, 3, 4], &[2, 3, 4], &[2, 1, 0], &[12, 2]);
    assert_eq!(collapse_movement(&mut g), 0);
    // Dims that do not refine into one sequence.
    assert!(refine(&[6, 4], &[4, 6]).is_none());
}

/// Shapes: x's dims from factors, a regrouping of them as A, a permutation, and Y a regrouping of the
/// permuted dims (so the chain is valid); the rewrite, when it applies, gives the same elements.
fn case() -> impl Strategy<Value = (Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>)> {
    (prop::collection::vec(1usize..4, 1..6), any::<u64>()).prop_map(|(factors, seed)| {
        let mut rng = seed;
        let mut next = move |n: usize| {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((rng >> 33) as usize) % n.max(1)
        };
        let group = |f: &[usize], next: &mut dyn FnMut(usize) -> usize| {
            let mut out = Vec::new();
            let mut acc = 1;
            for (i, &x) in f.iter().enumerate() {
                acc *= x;
                if i + 1 == f.len() || next(2) == 0 {
                    out.push(acc);
                    acc = 1;
                }
            }
            out
        };
        let x = group(&factors, &mut next);
        let a = group(&factors, &mut next);
        let mut perm: Vec<usize> = (0..a.len()).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, next(i + 1));
        }
        let permuted: Vec<usize> = perm.iter().map(|&p| a[p]).collect();
        let y = group(&permuted, &mut next);
        (x, a, perm, y)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn rewrites_keep_every_element((x, a, perm, y) in case()) {
        let g0 = chain(&x, &a, &perm, &y);
        let mut g = g0.clone();
        let n = collapse_movement(&mut g);
        g.compact();
        crate::ir::verify(&g).unwrap();
        if n == 1 {
            prop_assert!(g.nodes.len() <= 3);
        }
        assert_same_outputs(&g0, &g, 0.0);
    }
}
