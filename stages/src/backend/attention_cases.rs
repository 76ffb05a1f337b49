//! Attention graphs the backends' tests share: one `Attention` op on graph inputs, in the shapes and
//! options kernels must handle (K in both layouts, broadcast batch dims, masks broadcast in every way,
//! -inf fills, an empty key axis, head dims that are not a multiple of 32, Sq not a multiple of a tile).

use crate::ir::{AttentionAttrs, DType, Graph, Op, TensorType};

/// One test shape: leading dims of q, k and v (broadcast together), sizes, K layout, masks.
#[derive(Clone, Debug)]
pub struct AttnCase {
    pub name: &'static str,
    pub q_lead: Vec<usize>,
    pub k_lead: Vec<usize>,
    pub v_lead: Vec<usize>,
    pub sq: usize,
    pub sk: usize,
    pub d: usize,
    pub dv: usize,
    pub scale: f32,
    pub k_transposed: bool,
    /// Shape of an additive mask input.
    pub mask: Option<Vec<usize>>,
    /// Shape of a bool keep-mask input and its fill.
    pub keep: Option<(Vec<usize>, f32)>,
}

impl AttnCase {
    pub fn graph(&self) -> Graph {
        let mut g = Graph::new(self.name);
        let shape = |lead: &[usize], a: usize, b: usize| {
            let mut s = lead.to_vec();
            s.extend([a, b]);
            s
        };
        let q = g.add_input("q", TensorType::f32(shape(&self.q_lead, self.sq, self.d)));
        let k_shape = if self.k_transposed { shape(&self.k_lead, self.d, self.sk) } else { shape(&self.k_lead, self.sk, self.d) };
        let k = g.add_input("k", TensorType::f32(k_shape));
        let v = g.add_input("v", TensorType::f32(shape(&self.v_lead, self.sk, self.dv)));
        let mut inputs = vec![q, k, v];
        if let Some(m) = &self.mask {
            inputs.push(g.add_input("mask", TensorType::f32(m.clone())));
        }
        if let Some((m, _)) = &self.keep {
            inputs.push(g.add_input("keep", TensorType::new(DType::Bool, m.clone())));
        }
        let attrs = AttentionAttrs { scale: self.scale, k_transposed: self.k_transposed, mask: self.mask.is_some(), keep_fill: self.keep.as_ref().map(|k| k.1) };
        let y = g.add("attention", Op::Attention(attrs), &inputs).unwrap_or_else(|e| panic!("{}: {e}", self.name));
        g.outputs.push(y);
        g
    }

    /// Whether the reference gives NaN rows on random inputs (every key of some row dropped with a -inf fill).
    pub fn may_be_nan(&self) -> bool {
        self.keep.as_ref().is_some_and(|k| k.1 == f32::NEG_INFINITY)
    }
}

/// The shared cases.
pub fn cases() -> Vec<AttnCase> {
    let base = AttnCase {
        name: "bert",
        q_lead: vec![2, 2],
        k_lead: vec![2, 2],
        v_lead: vec![2, 2],
        sq: 5,
        sk: 7,
        d: 8,
        dv: 6,
        scale: 0.353_553_38,
        k_transposed: true,
        mask: Some(vec![2, 1, 1, 7]),
        keep: None,
    };
    vec![
        base.clone(),
        AttnCase { name: "gpt2_causal", sq: 9, sk: 9, d: 64, dv: 64, mask: Some(vec![2, 1, 1, 9]), keep: Some((vec![1, 1, 9, 9], -10_000.0)), ..base.clone() },
        AttnCase { name: "decode_natural_k", q_lead: vec![3], k_lead: vec![3], v_lead: vec![3], sq: 1, sk: 70, d: 80, dv: 80, k_transposed: false, mask: None, ..base.clone() },
        AttnCase { name: "vit_197", q_lead: vec![1, 3], k_lead: vec![1, 3], v_lead: vec![1, 3], sq: 197, sk: 197, d: 64, dv: 64, scale: 0.125, mask: None, ..base.clone() },
        AttnCase {
            name: "broadcast_batch",
            q_lead: vec![2, 3],
            k_lead: vec![1, 3],
            v_lead: vec![2, 1],
            sq: 33,
            sk: 65,
            d: 128,
            dv: 40,
            mask: Some(vec![33, 65]),
            keep: Some((vec![1, 3, 1, 65], f32::MIN)),
            ..base.clone()
        },
        AttnCase { name: "dropped_rows_nan", sq: 6, sk: 2, d: 4, dv: 3, mask: None, keep: Some((vec![2, 1, 6, 2], f32::NEG_INFINITY)), ..base.clone() },
        AttnCase { name: "no_keys", sk: 0, mask: None, ..base.clone() },
        // Keys a multiple of 8 but not of a tile, K transposed: the tensor-core kernel's 16-byte copies of K.
        AttnCase { name: "aligned_keys", q_lead: vec![1, 2], k_lead: vec![1, 2], v_lead: vec![1, 2], sq: 40, sk: 136, d: 64, dv: 64, mask: Some(vec![1, 1, 1, 136]), keep: Some((vec![1, 1, 40, 136], -10_000.0)), ..base.clone() },
        AttnCase { name: "rank2", q_lead: vec![], k_lead: vec![], v_lead: vec![], sq: 3, sk: 4, d: 5, dv: 2, mask: Some(vec![1]), ..base },
    ]
}
