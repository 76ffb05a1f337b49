//! Operators of the IR, with typed attributes.
//!
//! Attributes are normalized at import: axes are non-negative, padding is explicit (auto_pad resolved against
//! static shapes), shape-like operands that ONNX passes as tensors (Reshape's shape, Slice's starts, Clip's
//! bounds...) are folded into attributes. So a backend never re-derives what the importer already knew, and the
//! structural hash sees one spelling of each computation.

use super::dtype::DType;
use serde::{Deserialize, Serialize};

/// Elementwise operators of one input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum UnaryOp {
    Relu,
    Sigmoid,
    Tanh,
    Erf,
    Sqrt,
    Exp,
    Log,
    Neg,
    Reciprocal,
    Abs,
    Floor,
    Ceil,
    /// x * relu6(x + 3) / 6
    HardSwish,
    /// bool -> bool
    Not,
    /// float -> bool
    IsNaN,
    // The variants below were added after the ones above had been hashed and stored: new variants go last so
    // the encodings (and structural hashes) of every older op stay as they were.
    Cos,
    Sin,
    Tan,
    Acos,
    Asin,
    Atan,
    Cosh,
    Sinh,
    Asinh,
    /// Defined on [1, inf); NaN below.
    Acosh,
    /// Defined on [-1, 1]; ±inf at ±1, NaN beyond.
    Atanh,
    /// Round half to even (ONNX Round, NumPy's `round`).
    Round,
    /// log(1 + exp(x)), evaluated without overflow: max(x, 0) + log1p(exp(-|x|)).
    Softplus,
    /// x * tanh(softplus(x)).
    Mish,
}

/// Elementwise operators of two inputs, with NumPy broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Min,
    Max,
    /// Integer modulo with the sign of the divisor (ONNX Mod, fmod=0).
    Mod,
    /// C fmod: the sign of the dividend (ONNX Mod, fmod=1).
    FMod,
    Equal,
    Less,
    Greater,
    LessOrEqual,
    GreaterOrEqual,
    And,
    Or,
}

impl BinaryOp {
    /// Comparison and logical ops produce bool.
    pub fn returns_bool(self) -> bool {
        matches!(
            self,
            BinaryOp::Equal
                | BinaryOp::Less
                | BinaryOp::Greater
                | BinaryOp::LessOrEqual
                | BinaryOp::GreaterOrEqual
                | BinaryOp::And
                | BinaryOp::Or
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    Min,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum GeluApprox {
    /// 0.5 x (1 + erf(x / sqrt 2))
    Erf,
    /// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    Tanh,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PadMode {
    Constant,
    Reflect,
    Edge,
}

/// Convolution attributes for N spatial dimensions (input layout NCHW..., weights OIHW...).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvAttrs {
    pub strides: Vec<usize>,
    /// Explicit padding: `[begin_0, .., begin_n, end_0, .., end_n]` as in ONNX.
    pub pads: Vec<usize>,
    pub dilations: Vec<usize>,
    pub group: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvTransposeAttrs {
    pub strides: Vec<usize>,
    pub pads: Vec<usize>,
    pub dilations: Vec<usize>,
    pub group: usize,
    pub output_padding: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolAttrs {
    pub kernel: Vec<usize>,
    pub strides: Vec<usize>,
    /// `[begin.., end..]`, explicit.
    pub pads: Vec<usize>,
    pub dilations: Vec<usize>,
    pub ceil_mode: bool,
}

/// Attributes of [`Op::Attention`]: `softmax(scale · Q Kᵀ [where keep, else fill] [+ mask]) · V`.
///
/// Inputs, in order: `q` `[.., Sq, D]`, `k` (`[.., Sk, D]`, or `[.., D, Sk]` when `k_transposed`), `v`
/// `[.., Sk, Dv]`, then the additive `mask` if `mask` is set, then the bool `keep` mask if `keep_fill` is
/// set. The leading (batch, head) dims of q, k and v broadcast together; `mask` and `keep` broadcast to the
/// scores' shape `[.., Sq, Sk]` without widening it. The output is `[.., Sq, Dv]`.
///
/// Semantics, exactly the unfused graph's in real arithmetic: `s = scale * (Q Kᵀ)`; where `keep` is false
/// `s = keep_fill` (ONNX `Where(keep, s, fill)`); `s = s + mask`; softmax over the last axis; times V. So a
/// query row whose scores are all -inf (or hold a NaN or +inf) gives NaN outputs, as Softmax's 0/0 does in
/// the unfused graph, and `Sk = 0` gives zeros (an empty sum), as the unfused MatMul does. With `nan_to_zero`
/// such a row's probabilities are 0 instead, so its outputs are 0: the NaN guard `Where(IsNaN(p), 0, p)` that
/// PyTorch's exporters write after the Softmax of `scaled_dot_product_attention` (a softmax row is all NaN or
/// has none, so zeroing its NaNs is zeroing the row).
///
/// `k_transposed` keeps K in whatever layout the graph had for the scores MatMul (exporters usually
/// transpose K to `[.., D, Sk]` themselves, with a head-splitting Transpose that stays a node), so the fusion
/// never adds a transpose; kernels read either layout through strides.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AttentionAttrs {
    pub scale: f32,
    pub k_transposed: bool,
    /// An additive float mask follows `v`.
    pub mask: bool,
    /// A bool keep-mask follows (after `mask`, if any); scores where it is false become this value before
    /// the additive mask is added.
    pub keep_fill: Option<f32>,
    /// Probabilities that are NaN become 0 (see above).
    pub nan_to_zero: bool,
}

impl AttentionAttrs {
    /// Number of inputs the op takes with these attributes.
    pub fn arity(&self) -> usize {
        3 + usize::from(self.mask) + usize::from(self.keep_fill.is_some())
    }

    /// Input positions of the additive mask and of the keep mask.
    pub fn mask_index(&self) -> Option<usize> {
        self.mask.then_some(3)
    }

    pub fn keep_index(&self) -> Option<usize> {
        self.keep_fill.map(|_| 3 + usize::from(self.mask))
    }
}

/// One operator with its attributes. Inputs are positional (documented per variant); optional trailing inputs
/// are simply absent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// x -> x. Importers may emit it; simplification removes it.
    Identity,
    Unary(UnaryOp),
    LeakyRelu { alpha: f32 },
    /// max(0, min(1, alpha x + beta))
    HardSigmoid { alpha: f32, beta: f32 },
    /// Bounds are attributes (±inf when absent).
    Clip { min: f32, max: f32 },
    Gelu { approximate: GeluApprox },
    Binary(BinaryOp),
    /// (cond: bool, x, y) -> broadcast select.
    Where,
    Cast { to: DType },
    /// (a, b): NumPy matmul semantics, batched and broadcast; rank-1 operands promoted as NumPy does.
    MatMul,
    /// (x, w, [bias])
    Conv(ConvAttrs),
    /// (x, w, [bias]); w is [C_in, C_out/group, k...]
    ConvTranspose(ConvTransposeAttrs),
    /// (x, scale, bias, mean, var), inference mode.
    BatchNorm { epsilon: f32 },
    MaxPool(PoolAttrs),
    AveragePool { pool: PoolAttrs, count_include_pad: bool },
    GlobalAveragePool,
    /// Axes sorted, non-negative; empty axes never appear (importers turn a no-op reduce into Identity).
    Reduce { kind: ReduceKind, axes: Vec<usize>, keepdims: bool },
    Softmax { axis: usize },
    LogSoftmax { axis: usize },
    /// (x, scale, [bias]): normalize over axes `axis..rank`.
    LayerNorm { axis: usize, epsilon: f32 },
    /// Static target shape (no -1 or 0 left).
    Reshape { shape: Vec<usize> },
    Transpose { perm: Vec<usize> },
    /// (x0, x1, ...)
    Concat { axis: usize },
    /// One output per entry of `sizes`.
    Split { axis: usize, sizes: Vec<usize> },
    /// Per listed axis: start, end, step, already clamped to the dimension (end may be -1 for a negative step
    /// running through index 0).
    Slice { axes: Vec<usize>, starts: Vec<i64>, ends: Vec<i64>, steps: Vec<i64> },
    /// (data, indices)
    Gather { axis: usize },
    /// (data, indices)
    GatherElements { axis: usize },
    /// Broadcast to a static shape.
    Expand { shape: Vec<usize> },
    /// `[begin.., end..]`, negative values crop.
    Pad { pads: Vec<i64>, mode: PadMode, value: f32 },
    Tile { repeats: Vec<usize> },
    /// (q, k, v, [mask], [keep]): scaled dot-product attention, see [`AttentionAttrs`]. Last in the enum so the
    /// encodings (and structural hashes) of every older op stay as they were.
    Attention(AttentionAttrs),
    /// (x): running sum along `axis` (ONNX CumSum, whose axis operand is folded into the attribute).
    /// `exclusive`: element i sums the elements before i only (the first is 0); `reverse`: sums run from the
    /// end of the axis. Floats accumulate in f64 and round once per element; integers wrap.
    CumSum { axis: usize, exclusive: bool, reverse: bool },
    /// (data, indices): ONNX GatherND. `indices` is `[b.., n.., k]` (integers; negative counts from the end);
    /// the first `batch_dims` dims of data and indices are batch dims and must agree. The output is
    /// `indices.shape[..-1] ++ data.shape[batch_dims + k..]`: each index tuple picks one slice of data.
    GatherND { batch_dims: usize },
    /// (data, indices, updates): ONNX ScatterND without reduction. The output is data with, for each index
    /// tuple `indices[i.., :]` (of length k, negative counts from the end), the slice
    /// `data[tuple]` replaced by `updates[i..]`. Tuples are applied in row-major order, so when two tuples are
    /// equal (which ONNX leaves undefined) the later one wins, on every backend.
    ScatterND,
    /// (x, w, [bias]) in channels-last layout (ONNX Runtime's `com.microsoft.NhwcConv`): x is `[N, spatial.., C]`,
    /// w `[M, k.., C/group]`, the output `[N, spatial.., M]`; attributes as [`Op::Conv`]'s. Made by the layout
    /// pass ([`crate::passes::layout`]) for `-layout=nhwc`; never imported.
    NhwcConv(ConvAttrs),
    /// (x) MaxPool in channels-last layout: x is `[N, spatial.., C]` (ONNX Runtime's `NhwcMaxPool`).
    NhwcMaxPool(PoolAttrs),
}

/// The permutation taking a channels-first value `[N, C, spatial..]` of rank `rank` to channels-last
/// `[N, spatial.., C]` (a Transpose's `perm`: output dim `i` is input dim `perm[i]`).
pub fn channels_last_perm(rank: usize) -> Vec<usize> {
    let mut p = vec![0];
    p.extend(2..rank);
    p.push(1);
    p
}

/// The inverse of [`channels_last_perm`]: channels-last `[N, spatial.., C]` to channels-first.
pub fn channels_first_perm(rank: usize) -> Vec<usize> {
    let mut p = vec![0, rank - 1];
    p.extend(1..rank - 1);
    p
}

/// `shape` permuted as a Transpose with `perm` permutes it.
pub fn permuted(shape: &[usize], perm: &[usize]) -> Vec<usize> {
    perm.iter().map(|&i| shape[i]).collect()
}

impl Op {
    /// The op's name as reports and errors show it (ONNX spelling where one exists).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Identity => "Identity",
            Op::Unary(u) => match u {
                UnaryOp::Relu => "Relu",
                UnaryOp::Sigmoid => "Sigmoid",
                UnaryOp::Tanh => "Tanh",
                UnaryOp::Erf => "Erf",
                UnaryOp::Sqrt => "Sqrt",
                UnaryOp::Exp => "Exp",
                UnaryOp::Log => "Log",
                UnaryOp::Neg => "Neg",
                UnaryOp::Reciprocal => "Reciprocal",
                UnaryOp::Abs => "Abs",
                UnaryOp::Floor => "Floor",
                UnaryOp::Ceil => "Ceil",
                UnaryOp::HardSwish => "HardSwish",
                UnaryOp::Not => "Not",
                UnaryOp::IsNaN => "IsNaN",
                UnaryOp::Cos => "Cos",
                UnaryOp::Sin => "Sin",
                UnaryOp::Tan => "Tan",
                UnaryOp::Acos => "Acos",
                UnaryOp::Asin => "Asin",
                UnaryOp::Atan => "Atan",
                UnaryOp::Cosh => "Cosh",
                UnaryOp::Sinh => "Sinh",
                UnaryOp::Asinh => "Asinh",
                UnaryOp::Acosh => "Acosh",
                UnaryOp::Atanh => "Atanh",
                UnaryOp::Round => "Round",
                UnaryOp::Softplus => "Softplus",
                UnaryOp::Mish => "Mish",
            },
            Op::LeakyRelu { .. } => "LeakyRelu",
            Op::HardSigmoid { .. } => "HardSigmoid",
            Op::Clip { .. } => "Clip",
            Op::Gelu { .. } => "Gelu",
            Op::Binary(b) => match b {
                BinaryOp::Add => "Add",
                BinaryOp::Sub => "Sub",
                BinaryOp::Mul => "Mul",
                BinaryOp::Div => "Div",
                BinaryOp::Pow => "Pow",
                BinaryOp::Min => "Min",
                BinaryOp::Max => "Max",
                BinaryOp::Mod => "Mod",
                BinaryOp::FMod => "FMod",
                BinaryOp::Equal => "Equal",
                BinaryOp::Less => "Less",
                BinaryOp::Greater => "Greater",
                BinaryOp::LessOrEqual => "LessOrEqual",
                BinaryOp::GreaterOrEqual => "GreaterOrEqual",
                BinaryOp::And => "And",
                BinaryOp::Or => "Or",
            },
            Op::Where => "Where",
            Op::Cast { .. } => "Cast",
            Op::MatMul => "MatMul",
            Op::Conv(_) => "Conv",
            Op::ConvTranspose(_) => "ConvTranspose",
            Op::BatchNorm { .. } => "BatchNormalization",
            Op::MaxPool(_) => "MaxPool",
            Op::AveragePool { .. } => "AveragePool",
            Op::GlobalAveragePool => "GlobalAveragePool",
            Op::Reduce { kind, .. } => match kind {
                ReduceKind::Sum => "ReduceSum",
                ReduceKind::Mean => "ReduceMean",
                ReduceKind::Max => "ReduceMax",
                ReduceKind::Min => "ReduceMin",
            },
            Op::Softmax { .. } => "Softmax",
            Op::LogSoftmax { .. } => "LogSoftmax",
            Op::LayerNorm { .. } => "LayerNormalization",
            Op::Reshape { .. } => "Reshape",
            Op::Transpose { .. } => "Transpose",
            Op::Concat { .. } => "Concat",
            Op::Split { .. } => "Split",
            Op::Slice { .. } => "Slice",
            Op::Gather { .. } => "Gather",
            Op::GatherElements { .. } => "GatherElements",
            Op::Expand { .. } => "Expand",
            Op::Pad { .. } => "Pad",
            Op::Tile { .. } => "Tile",
            Op::Attention(_) => "Attention",
            Op::CumSum { .. } => "CumSum",
            Op::GatherND { .. } => "GatherND",
            Op::ScatterND => "ScatterND",
            Op::NhwcConv(_) => "NhwcConv",
            Op::NhwcMaxPool(_) => "NhwcMaxPool",
        }
    }

    /// Elementwise ops (one output element depends on the same-index element of each broadcast input).
    pub fn is_elementwise(&self) -> bool {
        matches!(
            self,
            Op::Identity
                | Op::Unary(_)
                | Op::LeakyRelu { .. }
                | Op::HardSigmoid { .. }
                | Op::Clip { .. }
                | Op::Gelu { .. }
                | Op::Binary(_)
                | Op::Where
                | Op::Cast { .. }
        )
    }

    /// Number of outputs this op produces.
    pub fn num_outputs(&self) -> usize {
        match self {
            Op::Split { sizes, .. } => sizes.len(),
            _ => 1,
        }
    }
}
