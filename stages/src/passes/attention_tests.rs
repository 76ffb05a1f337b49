//! Tests of [`super::fuse_attention`]: the exporters' spellings fuse, near misses do not, and the reference
//! interpreter gives the same outputs (NaN where the unfused graph has NaN) before and after, on fixed and on
//! random shapes.

use super::*;
use crate::interp::{random_inputs, run_graph};
use crate::ir::{DType, Tensor, TensorType};
use proptest::prelude::*;

/// How the scores are scaled.
#[derive(Clone, Copy, Debug)]
enum Scale {
    None,
    /// `Div(s, sqrt(d))` (BERT, GPT-2).
    Div,
    /// `Mul(s, 1/sqrt(d))` with the constant first (timm ViT, operands swapped).
    Mul,
    /// `Mul(q, d^-1/4)` and `Mul(kᵀ, d^-1/4)` (torch SDPA's decomposition).
    Operands,
}

/// How K reaches the scores MatMul.
#[derive(Clone, Copy, Debug)]
enum KForm {
    /// An input already `[.., D, Sk]`.
    Transposed,
    /// An input `[.., Sk, D]` and a Transpose of the last two axes (absorbed by the pass).
    SwapLastTwo,
    /// An input `[B, Sk, H, D]` and one Transpose to `[B, H, D, Sk]` (GPT-2, torchvision's ViT): the pass reads
    /// K through a Transpose to `[B, H, Sk, D]` instead.
    HeadsFirst,
}

/// The optional masks.
#[derive(Clone, Copy, Debug)]
enum Keep {
    None,
    /// `Where(keep, s, fill)`, keep a bool input broadcast over heads.
    Where(f32),
    /// `Where(drop, fill, s)`, as masked_fill exports.
    MaskedFill(f32),
}

#[derive(Clone, Copy, Debug)]
struct Spec {
    b: usize,
    h: usize,
    sq: usize,
    sk: usize,
    d: usize,
    dv: usize,
    scale: Scale,
    k: KForm,
    keep: Keep,
    /// An additive float mask `[b, 1, 1, sk]` (BERT's) when set.
    mask: bool,
    /// A position bias `[1, h, sq, sk]` added before the mask (T5's, Swin's).
    bias: bool,
    /// The NaN guard `Where(IsNaN(p), 0, p)` after the Softmax (PyTorch's SDPA export).
    guard: bool,
}

fn bin(g: &mut Graph, op: BinaryOp, a: ValueId, b: ValueId) -> ValueId {
    let name = format!("n{}", g.nodes.len());
    g.add(name, Op::Binary(op), &[a, b]).unwrap()
}

fn build(s: Spec) -> Graph {
    let mut g = Graph::new("attn");
    let q = g.add_input("q", TensorType::f32([s.b, s.h, s.sq, s.d]));
    let kt = match s.k {
        KForm::Transposed => g.add_input("k", TensorType::f32([s.b, s.h, s.d, s.sk])),
        KForm::SwapLastTwo => {
            let k = g.add_input("k", TensorType::f32([s.b, s.h, s.sk, s.d]));
            g.add("kt", Op::Transpose { perm: vec![0, 1, 3, 2] }, &[k]).unwrap()
        }
        KForm::HeadsFirst => {
            let k = g.add_input("k", TensorType::f32([s.b, s.sk, s.h, s.d]));
            g.add("kt", Op::Transpose { perm: vec![0, 2, 3, 1] }, &[k]).unwrap()
        }
    };
    let v = g.add_input("v", TensorType::f32([s.b, s.h, s.sk, s.dv]));
    let rd = (s.d as f32).sqrt();
    let (q, kt) = match s.scale {
        Scale::Operands => {
            let c = g.add_const("c", Tensor::scalar_f32(1.0 / rd.sqrt()));
            (bin(&mut g, BinaryOp::Mul, q, c), bin(&mut g, BinaryOp::Mul, kt, c))
        }
        _ => (q, kt),
    };
    let mut x = g.add("scores", Op::MatMul, &[q, kt]).unwrap();
    match s.scale {
        Scale::Div => {
            let c = g.add_const("sqrt_d", Tensor::scalar_f32(rd));
            x = bin(&mut g, BinaryOp::Div, x, c);
        }
        Scale::Mul => {
            let c = g.add_const("inv_sqrt_d", Tensor::scalar_f32(1.0 / rd));
            x = bin(&mut g, BinaryOp::Mul, c, x);
        }
        Scale::None | Scale::Operands => {}
    }
    match s.keep {
        Keep::None => {}
        Keep::Where(f) | Keep::MaskedFill(f) => {
            let cond = g.add_input("keep", TensorType::new(DType::Bool, vec![s.b, 1, s.sq, s.sk]));
            let fill = g.add_const("fill", Tensor::scalar_f32(f));
            let ins = if matches!(s.keep, Keep::Where(_)) { [cond, x, fill] } else { [cond, fill, x] };
            x = g.add("where", Op::Where, &ins).unwrap();
        }
    }
    if s.bias {
        let m = g.add_input("bias", TensorType::f32([1, s.h, s.sq, s.sk]));
        x = bin(&mut g, BinaryOp::Add, m, x);
    }
    if s.mask {
        let m = g.add_input("mask", TensorType::f32([s.b, 1, 1, s.sk]));
        x = bin(&mut g, BinaryOp::Add, x, m);
    }
    let mut p = g.add("softmax", Op::Softmax { axis: 3 }, &[x]).unwrap();
    if s.guard {
        let nan = g.add("isnan", Op::Unary(UnaryOp::IsNaN), &[p]).unwrap();
        let zero = g.add_const("zero", Tensor::from_f32([1], &[0.0]));
        p = g.add("guard", Op::Where, &[nan, zero, p]).unwrap();
    }
    let y = g.add("context", Op::MatMul, &[p, v]).unwrap();
    g.outputs.push(y);
    g
}

/// Both graphs on the same seeded inputs: every output element within `tol` of the unfused one relative to
/// the output's largest finite magnitude (at least 1), NaN exactly where the unfused graph has NaN.
fn assert_same(before: &Graph, after: &Graph, tol: f64) {
    for seed in [1, 2, 3] {
        let inputs = random_inputs(before, seed);
        let a = run_graph(before, &inputs).expect("unfused graph runs");
        let b = run_graph(after, &inputs).expect("fused graph runs");
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.ty, y.ty);
            let (x, y) = (x.to_f64_vec(), y.to_f64_vec());
            let scale = x.iter().filter(|v| v.is_finite()).fold(1.0f64, |m, v| m.max(v.abs()));
            for (i, (p, q)) in x.iter().zip(&y).enumerate() {
                assert_eq!(p.is_nan(), q.is_nan(), "element {i}: {p} vs {q}");
                if !p.is_nan() {
                    assert!((p - q).abs() <= tol * scale, "element {i}: {p} vs {q} (tolerance {tol} x {scale})");
                }
            }
        }
    }
}

fn attention_ops(g: &Graph) -> Vec<&AttentionAttrs> {
    g.nodes.iter().filter_map(|n| if let Op::Attention(a) = &n.op { Some(a) } else { None }).collect()
}

/// Fuses, checks the graph is one Attention (plus a Not for masked_fill, a Transpose of K for HeadsFirst), and
/// compares the outputs.
fn fuse_and_check(s: Spec) -> AttentionAttrs {
    let g0 = build(s);
    let mut g = g0.clone();
    assert_eq!(fuse_attention(&mut g), 1, "{s:?}");
    g.compact();
    crate::ir::verify(&g).unwrap();
    let ops = attention_ops(&g);
    assert_eq!(ops.len(), 1);
    let a = ops[0].clone();
    // A Not for masked_fill, a Transpose reading K in its natural layout for HeadsFirst.
    // The masks' sum when there are two.
    let extra = usize::from(matches!(s.keep, Keep::MaskedFill(_))) + usize::from(matches!(s.k, KForm::HeadsFirst)) + usize::from(s.mask && s.bias);
    assert_eq!(a.nan_to_zero, s.guard);
    assert_eq!(g.nodes.len(), 1 + extra, "{s:?}: {:?}", g.nodes.iter().map(|n| n.op.name()).collect::<Vec<_>>());
    assert_same(&g0, &g, 2e-6);
    a
}

const BERT: Spec = Spec { b: 2, h: 2, sq: 5, sk: 5, d: 8, dv: 8, scale: Scale::Div, k: KForm::Transposed, keep: Keep::None, mask: true, bias: false, guard: false };

#[test]
fn bert_pattern_fuses() {
    let a = fuse_and_check(BERT);
    assert_eq!(a, AttentionAttrs { scale: 1.0 / 8f32.sqrt(), k_transposed: true, mask: true, keep_fill: None, nan_to_zero: false });
}

#[test]
fn gpt2_pattern_fuses_with_causal_where_and_mask() {
    let a = fuse_and_check(Spec { keep: Keep::Where(-10_000.0), sq: 6, sk: 6, ..BERT });
    assert_eq!(a.keep_fill, Some(-10_000.0));
    assert!(a.mask);
}

#[test]
fn vit_and_sdpa_scales_fold() {
    let a = fuse_and_check(Spec { scale: Scale::Mul, mask: false, ..BERT });
    assert!((a.scale - 1.0 / 8f32.sqrt()).abs() < 1e-7);
    let a = fuse_and_check(Spec { scale: Scale::Operands, k: KForm::SwapLastTwo, ..BERT });
    assert!((a.scale - 1.0 / 8f32.sqrt()).abs() < 1e-6, "{}", a.scale);
    assert!(!a.k_transposed, "the Transpose of the last two axes is absorbed");
    assert_eq!(fuse_and_check(Spec { scale: Scale::None, ..BERT }).scale, 1.0);
}

/// Kᵀ made by one Transpose `[B, Sk, H, D] -> [B, H, D, Sk]`: the op reads K as `[B, H, Sk, D]` through a new
/// Transpose (`[0, 2, 1, 3]`), natural layout, same outputs.
#[test]
fn heads_first_k_is_read_in_its_natural_layout() {
    let s = Spec { k: KForm::HeadsFirst, sk: 11, ..BERT };
    let a = fuse_and_check(s);
    assert!(!a.k_transposed);
    let mut g = build(s);
    fuse_attention(&mut g);
    let att = g.nodes.iter().find(|n| matches!(n.op, Op::Attention(_))).unwrap();
    let k = g.value(att.inputs[1]);
    let crate::ir::ValueDef::Node { node, .. } = k.def else { panic!("K comes from a node") };
    assert_eq!(g.node(node).op, Op::Transpose { perm: vec![0, 2, 1, 3] });
    assert_eq!(g.ty(att.inputs[1]).shape, vec![s.b, s.h, s.sk, s.d]);
}

/// masked_fill with -inf: rows whose keys are all dropped are NaN in both graphs (Softmax's 0/0).
#[test]
fn masked_fill_with_minus_infinity_keeps_nan_rows() {
    let s = Spec { keep: Keep::MaskedFill(f32::NEG_INFINITY), mask: false, sk: 2, sq: 7, ..BERT };
    fuse_and_check(s);
    let g = build(s);
    let out = run_graph(&g, &random_inputs(&g, 1)).unwrap();
    assert!(out[0].to_f32_vec().iter().any(|v| v.is_nan()), "the seeded keep mask drops a whole row somewhere");
}

/// PyTorch's SDPA export: scale on both operands, a mask, the NaN guard. With a -inf fill that drops whole rows,
/// the guarded graph gives zeros there, and so does the fused op (`nan_to_zero`).
#[test]
fn sdpa_nan_guard_fuses_and_zeroes_dropped_rows() {
    let s = Spec { scale: Scale::Operands, keep: Keep::MaskedFill(f32::NEG_INFINITY), guard: true, sk: 2, sq: 7, ..BERT };
    let a = fuse_and_check(s);
    assert!(a.nan_to_zero);
    let mut g = build(s);
    let inputs = random_inputs(&g, 1);
    let before = run_graph(&g, &inputs).unwrap();
    fuse_attention(&mut g);
    let after = run_graph(&g, &inputs).unwrap()[0].to_f32_vec();
    assert!(before[0].to_f32_vec().iter().all(|v| !v.is_nan()) && after.iter().all(|v| !v.is_nan()));
    // The guard only where it is whole: an IsNaN read elsewhere too, or a non-zero replacement, stay.
    let mut g = build(Spec { guard: true, ..BERT });
    let isnan = g.nodes.iter().find(|n| matches!(n.op, Op::Unary(UnaryOp::IsNaN))).unwrap().outputs[0];
    g.outputs.push(isnan);
    assert_eq!(fuse_attention(&mut g), 0);
    let mut g = build(Spec { guard: true, ..BERT });
    let zero = g.nodes.iter().find(|n| matches!(n.op, Op::Where)).unwrap().inputs[1];
    g.values[zero.index()].def = crate::ir::ValueDef::Const(Tensor::from_f32([1], &[1.0]));
    assert_eq!(fuse_attention(&mut g), 0);
}

/// T5's and Swin's position bias, then the mask: both summed into the op's one mask.
#[test]
fn position_bias_and_mask_sum_into_one() {
    let a = fuse_and_check(Spec { bias: true, ..BERT });
    assert!(a.mask);
    fuse_and_check(Spec { bias: true, mask: false, scale: Scale::Mul, ..BERT });
    // Behind a keep fill two masks are not summed (rounding at the fill's magnitude decides dropped rows).
    let mut g = build(Spec { bias: true, keep: Keep::Where(-10_000.0), ..BERT });
    assert_eq!(fuse_attention(&mut g), 0);
}

#[test]
fn a_shared_intermediate_blocks_the_rewrite() {
    let mut g = build(BERT);
    let softmax = g.nodes.iter().find(|n| matches!(n.op, Op::Softmax { .. })).unwrap();
    let probs = softmax.outputs[0];
    g.outputs.push(probs);
    assert_eq!(fuse_attention(&mut g), 0, "attention probabilities that are an output stay");
    let mut g = build(BERT);
    let scores = g.nodes[0].outputs[0];
    let extra = g.add("other", Op::Unary(UnaryOp::Exp), &[scores]).unwrap();
    g.outputs.push(extra);
    assert_eq!(fuse_attention(&mut g), 0, "scores with another consumer stay");
}

#[test]
fn near_misses_do_not_fuse() {
    // A scale that is a vector (per-key), not a scalar.
    let mut g = Graph::new("vec");
    let q = g.add_input("q", TensorType::f32([2, 4, 8]));
    let kt = g.add_input("k", TensorType::f32([2, 8, 4]));
    let v = g.add_input("v", TensorType::f32([2, 4, 8]));
    let s = g.add("s", Op::MatMul, &[q, kt]).unwrap();
    let c = g.add_const("c", Tensor::from_f32([4], &[1.0, 2.0, 3.0, 4.0]));
    let s2 = bin(&mut g, BinaryOp::Mul, s, c);
    let p = g.add("p", Op::Softmax { axis: 2 }, &[s2]).unwrap();
    let y = g.add("y", Op::MatMul, &[p, v]).unwrap();
    g.outputs.push(y);
    assert_eq!(fuse_attention(&mut g), 0);
    // Softmax over the query axis.
    let mut g = Graph::new("axis");
    let q = g.add_input("q", TensorType::f32([2, 4, 8]));
    let kt = g.add_input("k", TensorType::f32([2, 8, 4]));
    let v = g.add_input("v", TensorType::f32([2, 4, 8]));
    let s = g.add("s", Op::MatMul, &[q, kt]).unwrap();
    let p = g.add("p", Op::Softmax { axis: 1 }, &[s]).unwrap();
    let y = g.add("y", Op::MatMul, &[p, v]).unwrap();
    g.outputs.push(y);
    assert_eq!(fuse_attention(&mut g), 0);
    // A mask that widens the scores (an extra leading dim).
    let mut g = Graph::new("widen");
    let q = g.add_input("q", TensorType::f32([2, 4, 8]));
    let kt = g.add_input("k", TensorType::f32([2, 8, 4]));
    let v = g.add_input("v", TensorType::f32([2, 4, 8]));
    let m = g.add_input("m", TensorType::f32([3, 1, 1, 4]));
    let s = g.add("s", Op::MatMul, &[q, kt]).unwrap();
    let s = bin(&mut g, BinaryOp::Add, s, m);
    let p = g.add("p", Op::Softmax { axis: 3 }, &[s]).unwrap();
    let y = g.add("y", Op::MatMul, &[p, v]).unwrap();
    g.outputs.push(y);
    assert_eq!(fuse_attention(&mut g), 0);
}

/// Two attentions in a row, the second reading the first's result as its values.
#[test]
fn stacked_attention_reads_the_fused_result() {
    let mut g = build(Spec { mask: false, dv: 5, ..BERT });
    let y = g.outputs[0];
    let q2 = g.add_input("q2", TensorType::f32([2, 2, 3, 5]));
    let k2 = g.add_input("k2", TensorType::f32([2, 2, 5, 5]));
    let s = g.add("s2", Op::MatMul, &[q2, k2]).unwrap();
    let p = g.add("p2", Op::Softmax { axis: 3 }, &[s]).unwrap();
    let y2 = g.add("y2", Op::MatMul, &[p, y]).unwrap();
    g.outputs = vec![y2];
    let g0 = g.clone();
    assert_eq!(fuse_attention(&mut g), 2);
    g.compact();
    assert_eq!(attention_ops(&g).len(), 2);
    assert_eq!(g.nodes.len(), 2, "nothing of the unfused chains is left");
    assert_same(&g0, &g, 2e-6);
}

fn spec() -> impl Strategy<Value = Spec> {
    let scale = prop_oneof![Just(Scale::None), Just(Scale::Div), Just(Scale::Mul), Just(Scale::Operands)];
    let k = prop_oneof![Just(KForm::Transposed), Just(KForm::SwapLastTwo), Just(KForm::HeadsFirst)];
    let keep = prop_oneof![
        Just(Keep::None),
        Just(Keep::Where(-10_000.0)),
        Just(Keep::Where(f32::MIN)),
        Just(Keep::MaskedFill(f32::NEG_INFINITY))
    ];
    ((1usize..3, 1usize..4, 1usize..20, 1usize..20), (1usize..40, 1usize..40), scale, k, keep, (any::<bool>(), any::<bool>(), any::<bool>()))
        // A position bias only without a keep fill (see `match_at`: the masks are then not summed).
        .prop_map(|((b, h, sq, sk), (d, dv), scale, k, keep, (mask, bias, guard))| {
            let bias = bias && matches!(keep, Keep::None);
            Spec { b, h, sq, sk, d, dv, scale, k, keep, mask, bias, guard }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    /// Every spelling on random shapes fuses into one op whose reference outputs match the unfused graph's.
    #[test]
    fn fused_matches_unfused_on_random_shapes(s in spec()) {
        fuse_and_check(s);
    }
}

/// HuggingFace GPT-2's eager attention as the TorchScript exporter writes it: `key.transpose(-1, -2)`,
/// Div by a scalar, `torch.where(causal, w.to(dtype), finfo.min)`, the mask added, Softmax, `.type(dtype)`
/// (Casts to the dtype the value already has), MatMul. The whole simplification fuses it.
#[test]
fn hf_gpt2_export_with_same_type_casts_fuses_through_simplify() {
    let mut g = Graph::new("gpt2");
    let q = g.add_input("q", TensorType::f32([1, 2, 6, 8]));
    let k = g.add_input("k", TensorType::f32([1, 2, 6, 8]));
    let v = g.add_input("v", TensorType::f32([1, 2, 6, 8]));
    let m = g.add_input("mask", TensorType::f32([1, 1, 1, 6]));
    let kt = g.add("kt", Op::Transpose { perm: vec![0, 1, 3, 2] }, &[k]).unwrap();
    let s = g.add("mm", Op::MatMul, &[q, kt]).unwrap();
    let c = g.add_const("scale", Tensor::scalar_f32(8f32.sqrt()));
    let s = bin(&mut g, BinaryOp::Div, s, c);
    let s = g.add("to", Op::Cast { to: DType::F32 }, &[s]).unwrap();
    let keep: Vec<bool> = (0..36).map(|i| i % 6 <= i / 6).collect();
    let causal = g.add_const("causal", Tensor::from_bool([1, 1, 6, 6], &keep));
    let fill = g.add_const("min", Tensor::scalar_f32(f32::MIN));
    let s = g.add("where", Op::Where, &[causal, s, fill]).unwrap();
    let s = bin(&mut g, BinaryOp::Add, s, m);
    let p = g.add("softmax", Op::Softmax { axis: 3 }, &[s]).unwrap();
    let p = g.add("type", Op::Cast { to: DType::F32 }, &[p]).unwrap();
    let y = g.add("context", Op::MatMul, &[p, v]).unwrap();
    g.outputs.push(y);
    let g0 = g.clone();
    let r = crate::passes::simplify::simplify(&mut g).unwrap();
    assert_eq!((r.identities, r.attentions), (2, 1), "{r:?}");
    assert_eq!(g.nodes.len(), 1);
    let a = attention_ops(&g)[0].clone();
    assert_eq!(a, AttentionAttrs { scale: 1.0 / 8f32.sqrt(), k_transposed: false, mask: true, keep_fill: Some(f32::MIN), nan_to_zero: false });
    assert_same(&g0, &g, 2e-6);
}
