//! The attention pass on the zoo's transformers: every layer's attention of bert-tiny, gpt2-2layer and
//! vit-tiny fuses into one `Attention` op (nothing of the unfused pattern left), and the reference
//! interpreter gives the same outputs on the fused graph as on the unfused one. The fixtures make Kᵀ with one
//! Transpose of the heads-split K, so every op reads K in its natural `[.., Sk, D]` layout (`k_transposed: false`).

use tessera_fixtures::registry::{build_with, ModelOptions};
use tessera_stages::interp::{random_inputs, run_graph};
use tessera_stages::ir::{AttentionAttrs, Graph, Op};
use tessera_stages::passes::simplify::simplify;

fn count(g: &Graph, pred: impl Fn(&Op) -> bool) -> usize {
    g.nodes.iter().filter(|n| pred(&n.op)).count()
}

/// Fuses `model`'s graph and checks the count, the attributes and the reference outputs (within `tol` of the
/// output's largest magnitude).
fn check(model: &str, opts: ModelOptions, layers: usize, want: AttentionAttrs, tol: f64) -> usize {
    let g0 = build_with(model, &opts).unwrap();
    let mut g = g0.clone();
    let r = simplify(&mut g).unwrap();
    assert_eq!(r.attentions, layers, "{model}: one attention per layer");
    let attn: Vec<&AttentionAttrs> = g.nodes.iter().filter_map(|n| if let Op::Attention(a) = &n.op { Some(a) } else { None }).collect();
    assert_eq!(attn.len(), layers);
    for a in attn {
        assert_eq!(a, &want, "{model}");
    }
    assert_eq!(count(&g, |op| matches!(op, Op::Softmax { .. })), 0, "{model}: no Softmax left");
    assert_eq!(count(&g, |op| matches!(op, Op::Where)), 0, "{model}: no Where left");
    // Sibling projections merged into one MatMul leave one Split each, with one output per former MatMul.
    let merged_away: usize = g.nodes.iter().filter(|n| n.name.ends_with("/siblings_split")).map(|n| n.outputs.len() - 1).sum();
    assert_eq!(r.siblings, g.nodes.iter().filter(|n| n.name.ends_with("/siblings_split")).count());
    assert_eq!(
        count(&g0, |op| matches!(op, Op::MatMul)) - count(&g, |op| matches!(op, Op::MatMul)) - merged_away,
        2 * layers,
        "{model}: both attention MatMuls of every layer are gone"
    );
    let inputs = random_inputs(&g0, 5);
    let a = run_graph(&g0, &inputs).unwrap();
    let b = run_graph(&g, &inputs).unwrap();
    for (x, y) in a.iter().zip(&b) {
        let (x, y) = (x.to_f64_vec(), y.to_f64_vec());
        let scale = x.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        let worst = x.iter().zip(&y).map(|(p, q)| (p - q).abs() / scale).fold(0.0, f64::max);
        eprintln!("{model}: largest difference {worst:e} of the largest output magnitude {scale}");
        assert!(worst <= tol, "{model}: fused and unfused outputs differ by {worst:e}");
    }
    r.siblings
}

#[test]
fn bert_tiny_fuses_every_layer() {
    let opts = ModelOptions { batch: 2, seq: Some(16), image: None };
    let want = AttentionAttrs { scale: 1.0 / 8.0, k_transposed: false, mask: true, keep_fill: None, nan_to_zero: false };
    // The query, key and value projections of each layer merge into one MatMul.
    assert_eq!(check("bert-tiny", opts, 2, want, 1e-5), 2);
}

#[test]
fn gpt2_fuses_causal_attention() {
    let opts = ModelOptions { batch: 1, seq: Some(12), image: None };
    let want = AttentionAttrs { scale: 1.0 / 8.0, k_transposed: false, mask: true, keep_fill: Some(-10_000.0), nan_to_zero: false };
    check("gpt2-2layer", opts, 2, want, 1e-5);
}

#[test]
fn vit_tiny_fuses_every_block() {
    let opts = ModelOptions { batch: 1, seq: None, image: None };
    let want = AttentionAttrs { scale: 1.0 / 8.0, k_transposed: false, mask: false, keep_fill: None, nan_to_zero: false };
    check("vit-tiny", opts, 12, want, 1e-5);
}
