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
    /// NaN probabilities become 0 (the exporters' NaN guard).
    pub nan_to_zero: bool,
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
        let attrs = AttentionAttrs { scale: self.scale, k_transposed: self.k_transposed, mask: self.mask.is_some(), keep_fill: self.keep.as_ref().map(|k| k.1), nan_to_zero: self.nan_to_zero };
        let y = g.add("attention", Op::Attention(attrs), &inputs).unwrap_or_else(|e| panic!("{}: {e}", self.name));
        g.outputs.push(y);
        g
    }

    /// Whether the reference gives NaN rows on random inputs (every key of some row dropped with a -inf fill).
    pub fn may_be_nan(&self) -> bool {
        !self.nan_to_zero && self.keep.as_ref().is_some_and(|k| k.1 == f32::NEG_INFINITY)
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
        nan_to_zero: false,
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
        // The same rows guarded (SDPA's export): a dropped row gives zeros, the others their values.
        AttnCase { name: "dropped_rows_zeroed", sq: 6, sk: 2, d: 4, dv: 3, mask: None, keep: Some((vec![2, 1, 6, 2], f32::NEG_INFINITY)), nan_to_zero: true, ..base.clone() },
        AttnCase { name: "no_keys", sk: 0, mask: None, ..base.clone() },
        // Keys a multiple of 8 but not of a tile, K transposed: the tensor-core kernel's 16-byte copies of K.
        AttnCase { name: "aligned_keys", q_lead: vec![1, 2], k_lead: vec![1, 2], v_lead: vec![1, 2], sq: 40, sk: 136, d: 64, dv: 64, mask: Some(vec![1, 1, 1, 136]), keep: Some((vec![1, 1, 40, 136], -10_000.0)), ..base.clone() },
        AttnCase { name: "rank2", q_lead: vec![], k_lead: vec![], v_lead: vec![], sq: 3, sk: 4, d: 5, dv: 2, mask: Some(vec![1]), ..base },
    ]
}

/// Attentions whose heads an exporter moved into place, as the zoo's exporters spell them: each graph computes
/// its projection inside the graph (so its output is a kernel's own value) and moves Q, K and V into heads by
/// a chain of Reshape, Transpose, Gather and Split, and the output back. Backends that read through views run
/// none of that movement; the others run it as the graph says.
pub fn head_chains() -> Vec<(&'static str, Graph)> {
    use crate::ir::{Tensor, UnaryOp};
    let attention = |g: &mut Graph, q, k, v, mask: Option<crate::ir::ValueId>| {
        let attrs = AttentionAttrs { scale: 0.25, k_transposed: true, mask: mask.is_some(), keep_fill: None, nan_to_zero: false };
        let mut inputs = vec![q, k, v];
        inputs.extend(mask);
        g.add("attention", Op::Attention(attrs), &inputs).unwrap()
    };
    // torchvision ViT: [S, B, 3E] -> Reshape, Unsqueeze, 5-D Transpose, Squeeze, Gather, heads; K transposed;
    // the output back to [S, B, E], then an activation (so the transposed output is a value of the kernel).
    let vit = |name: &'static str, s: usize, heads: usize, d: usize| {
        let e = heads * d;
        let mut g = Graph::new(name);
        let x = g.add_input("x", TensorType::f32([s, 1, 3 * e]));
        let qkv = g.add("proj", Op::Unary(UnaryOp::Neg), &[x]).unwrap();
        let r = g.add("view_1", Op::Reshape { shape: vec![s, 1, 3, e] }, &[qkv]).unwrap();
        let r = g.add("unsqueeze", Op::Reshape { shape: vec![1, s, 1, 3, e] }, &[r]).unwrap();
        let t = g.add("transpose_1", Op::Transpose { perm: vec![3, 1, 2, 0, 4] }, &[r]).unwrap();
        let t = g.add("squeeze", Op::Reshape { shape: vec![3, s, 1, e] }, &[t]).unwrap();
        let mut heads_of = |i: i64| {
            let idx = g.add_const(format!("i{i}"), Tensor::from_i64(Vec::<usize>::new(), &[i]));
            let sel = g.add(format!("select_{i}"), Op::Gather { axis: 0 }, &[t, idx]).unwrap();
            let h = g.add(format!("view_{i}"), Op::Reshape { shape: vec![s, heads, d] }, &[sel]).unwrap();
            g.add(format!("heads_{i}"), Op::Transpose { perm: vec![1, 0, 2] }, &[h]).unwrap()
        };
        let (q, k, v) = (heads_of(0), heads_of(1), heads_of(2));
        let q = g.add("q", Op::Reshape { shape: vec![1, heads, s, d] }, &[q]).unwrap();
        let kt = g.add("kt", Op::Transpose { perm: vec![0, 2, 1] }, &[k]).unwrap();
        let kt = g.add("kt4", Op::Reshape { shape: vec![1, heads, d, s] }, &[kt]).unwrap();
        let v = g.add("v", Op::Reshape { shape: vec![1, heads, s, d] }, &[v]).unwrap();
        let y = attention(&mut g, q, kt, v, None);
        let y = g.add("permute", Op::Transpose { perm: vec![2, 0, 1, 3] }, &[y]).unwrap();
        let y = g.add("merge", Op::Reshape { shape: vec![s, e] }, &[y]).unwrap();
        let y = g.add("act", Op::Unary(UnaryOp::Relu), &[y]).unwrap();
        g.outputs.push(y);
        (name, g)
    };
    // GPT-2: one [B, S, 3E] projection split in three, each into heads [B, H, S, D], K transposed again;
    // the output back to [B, S, E] as a graph output.
    let gpt2 = || {
        let (b, s, heads, d) = (2, 20, 2, 16);
        let e = heads * d;
        let mut g = Graph::new("heads_gpt2_split");
        let x = g.add_input("x", TensorType::f32([b, s, 3 * e]));
        let qkv = g.add("c_attn", Op::Unary(UnaryOp::Neg), &[x]).unwrap();
        let parts = g.add_node("split", Op::Split { axis: 2, sizes: vec![e; 3] }, &[qkv]).unwrap();
        let heads_of = |g: &mut Graph, i: usize, perm: Vec<usize>| {
            let h = g.add(format!("view_{i}"), Op::Reshape { shape: vec![b, s, heads, d] }, &[parts[i]]).unwrap();
            g.add(format!("heads_{i}"), Op::Transpose { perm }, &[h]).unwrap()
        };
        let q = heads_of(&mut g, 0, vec![0, 2, 1, 3]);
        let kt = heads_of(&mut g, 1, vec![0, 2, 3, 1]);
        let v = heads_of(&mut g, 2, vec![0, 2, 1, 3]);
        let mask = g.add_input("mask", TensorType::f32([b, 1, 1, s]));
        let y = attention(&mut g, q, kt, v, Some(mask));
        let y = g.add("merge_heads", Op::Transpose { perm: vec![0, 2, 1, 3] }, &[y]).unwrap();
        let y = g.add("merge", Op::Reshape { shape: vec![b, s, e] }, &[y]).unwrap();
        g.outputs.push(y);
        ("heads_gpt2_split", g)
    };
    vec![
        // Head dims a multiple of 8: 16-byte copies of every operand straight from the projection.
        vit("heads_vit_aligned", 37, 2, 16),
        // Head dims of 12: odd heads start off 16-byte boundaries, so the copies go one element at a time.
        vit("heads_vit_unaligned", 19, 3, 12),
        gpt2(),
    ]
}
