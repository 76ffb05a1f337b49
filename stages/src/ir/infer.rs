//! Shape and dtype inference: the output types of an op from its input types.
//!
//! Every node added to a [`crate::ir::Graph`] goes through here, so a graph that exists is well-typed.

use super::dtype::DType;
use super::op::{channels_first_perm, channels_last_perm, permuted, AttentionAttrs, BinaryOp, ConvAttrs, ConvTransposeAttrs, Op, PoolAttrs, UnaryOp};
use super::tensor::TensorType;

/// Why inference rejected an op (wrapped with the node name by the graph builder).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct InferError(pub String);

impl InferError {
    pub fn new(msg: impl Into<String>) -> Self {
        InferError(msg.into())
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, InferError> {
    Err(InferError::new(msg))
}

fn arity(op: &Op, inputs: &[&TensorType], min: usize, max: usize) -> Result<(), InferError> {
    if inputs.len() < min || inputs.len() > max {
        if min == max {
            return err(format!("{} takes {} inputs, got {}", op.name(), min, inputs.len()));
        }
        return err(format!("{} takes {}..={} inputs, got {}", op.name(), min, max, inputs.len()));
    }
    Ok(())
}

/// NumPy broadcasting of two shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>, InferError> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank { a[i + a.len() - rank] } else { 1 };
        let db = if i + b.len() >= rank { b[i + b.len() - rank] } else { 1 };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return err(format!("shapes {a:?} and {b:?} do not broadcast")),
        };
    }
    Ok(out)
}

fn same_dtype(op: &Op, inputs: &[&TensorType]) -> Result<DType, InferError> {
    let d = inputs[0].dtype;
    for t in &inputs[1..] {
        if t.dtype != d {
            return err(format!("{} inputs must share a dtype, got {} and {}", op.name(), d, t.dtype));
        }
    }
    Ok(d)
}

fn need_float(op: &Op, t: &TensorType) -> Result<(), InferError> {
    if !t.dtype.is_float() {
        return err(format!("{} needs a float input, got {}", op.name(), t.dtype));
    }
    Ok(())
}

fn check_axis(op: &Op, axis: usize, rank: usize) -> Result<(), InferError> {
    if axis >= rank {
        return err(format!("{}: axis {} out of range for rank {}", op.name(), axis, rank));
    }
    Ok(())
}

/// Output size of a sliding window along one dimension.
fn window_out(input: usize, kernel: usize, stride: usize, pad_begin: usize, pad_end: usize, dilation: usize, ceil: bool) -> Result<usize, InferError> {
    if stride == 0 || dilation == 0 || kernel == 0 {
        return err("kernel, stride and dilation must be positive");
    }
    let eff = dilation * (kernel - 1) + 1;
    let padded = input + pad_begin + pad_end;
    if padded < eff {
        return err(format!("window of {eff} does not fit in padded size {padded}"));
    }
    let span = padded - eff;
    let mut out = if ceil { span.div_ceil(stride) + 1 } else { span / stride + 1 };
    // ONNX/PyTorch rule: with ceil_mode the last window must start inside the input or left padding.
    if ceil && (out - 1) * stride >= input + pad_begin {
        out -= 1;
    }
    Ok(out)
}

fn check_spatial(name: &str, n: usize, strides: &[usize], pads: &[usize], dilations: &[usize]) -> Result<(), InferError> {
    if strides.len() != n || dilations.len() != n || pads.len() != 2 * n {
        return err(format!(
            "{name}: {n} spatial dims need {n} strides, {n} dilations and {} pads (got {}, {}, {})",
            2 * n,
            strides.len(),
            dilations.len(),
            pads.len()
        ));
    }
    Ok(())
}

fn infer_conv(op: &Op, a: &ConvAttrs, inputs: &[&TensorType]) -> Result<TensorType, InferError> {
    arity(op, inputs, 2, 3)?;
    let (x, w) = (inputs[0], inputs[1]);
    let dtype = same_dtype(op, inputs)?;
    need_float(op, x)?;
    if x.rank() < 3 || w.rank() != x.rank() {
        return err(format!("Conv needs input rank >= 3 and weight of the same rank, got {} and {}", x, w));
    }
    let n = x.rank() - 2;
    check_spatial("Conv", n, &a.strides, &a.pads, &a.dilations)?;
    let (c_in, c_out) = (x.shape[1], w.shape[0]);
    if a.group == 0 || c_in % a.group != 0 || c_out % a.group != 0 || w.shape[1] * a.group != c_in {
        return err(format!("Conv: input channels {c_in}, weight {w}, group {} are inconsistent", a.group));
    }
    if let Some(b) = inputs.get(2) {
        if b.shape != [c_out] {
            return err(format!("Conv: bias must be [{c_out}], got {b}"));
        }
    }
    let mut shape = vec![x.shape[0], c_out];
    for d in 0..n {
        shape.push(window_out(x.shape[2 + d], w.shape[2 + d], a.strides[d], a.pads[d], a.pads[n + d], a.dilations[d], false)?);
    }
    Ok(TensorType::new(dtype, shape))
}

fn infer_conv_transpose(op: &Op, a: &ConvTransposeAttrs, inputs: &[&TensorType]) -> Result<TensorType, InferError> {
    arity(op, inputs, 2, 3)?;
    let (x, w) = (inputs[0], inputs[1]);
    let dtype = same_dtype(op, inputs)?;
    need_float(op, x)?;
    if x.rank() < 3 || w.rank() != x.rank() {
        return err(format!("ConvTranspose needs input rank >= 3 and weight of the same rank, got {} and {}", x, w));
    }
    let n = x.rank() - 2;
    check_spatial("ConvTranspose", n, &a.strides, &a.pads, &a.dilations)?;
    if a.output_padding.len() != n {
        return err(format!("ConvTranspose: output_padding needs {n} entries"));
    }
    if a.group == 0 || w.shape[0] != x.shape[1] || x.shape[1] % a.group != 0 {
        return err(format!("ConvTranspose: input {x}, weight {w}, group {} are inconsistent", a.group));
    }
    let c_out = w.shape[1] * a.group;
    if let Some(b) = inputs.get(2) {
        if b.shape != [c_out] {
            return err(format!("ConvTranspose: bias must be [{c_out}], got {b}"));
        }
    }
    let mut shape = vec![x.shape[0], c_out];
    for d in 0..n {
        let full = a.strides[d] * (x.shape[2 + d] - 1) + a.output_padding[d] + (w.shape[2 + d] - 1) * a.dilations[d] + 1;
        let pads = a.pads[d] + a.pads[n + d];
        if full <= pads {
            return err("ConvTranspose: padding removes the whole output");
        }
        shape.push(full - pads);
    }
    Ok(TensorType::new(dtype, shape))
}

fn infer_pool(op: &Op, p: &PoolAttrs, inputs: &[&TensorType]) -> Result<TensorType, InferError> {
    arity(op, inputs, 1, 1)?;
    let x = inputs[0];
    need_float(op, x)?;
    if x.rank() < 3 {
        return err(format!("{} needs rank >= 3, got {x}", op.name()));
    }
    let n = x.rank() - 2;
    check_spatial(op.name(), n, &p.strides, &p.pads, &p.dilations)?;
    if p.kernel.len() != n {
        return err(format!("{}: kernel needs {n} entries", op.name()));
    }
    let mut shape = x.shape[..2].to_vec();
    for d in 0..n {
        if p.pads[d] >= p.kernel[d] || p.pads[n + d] >= p.kernel[d] {
            return err(format!("{}: padding must be smaller than the kernel", op.name()));
        }
        shape.push(window_out(x.shape[2 + d], p.kernel[d], p.strides[d], p.pads[d], p.pads[n + d], p.dilations[d], p.ceil_mode)?);
    }
    Ok(TensorType::new(x.dtype, shape))
}

/// A channels-last op's output: its channels-first twin's, on its operands read channels-first (a weight
/// `[M, k.., C]` reads as `[M, C, k..]` by the same permutation), permuted back to channels-last.
fn infer_channels_last(op: &Op, inputs: &[&TensorType]) -> Result<TensorType, InferError> {
    let first: Vec<TensorType> = inputs
        .iter()
        .map(|t| if t.rank() >= 3 { TensorType::new(t.dtype, permuted(&t.shape, &channels_first_perm(t.rank()))) } else { (*t).clone() })
        .collect();
    let refs: Vec<&TensorType> = first.iter().collect();
    let out = match op {
        Op::NhwcConv(a) => infer_conv(op, a, &refs)?,
        Op::NhwcMaxPool(p) => infer_pool(op, p, &refs)?,
        _ => unreachable!("{} is not a channels-last op", op.name()),
    };
    let perm = channels_last_perm(out.rank());
    Ok(TensorType::new(out.dtype, permuted(&out.shape, &perm)))
}

fn infer_matmul(op: &Op, inputs: &[&TensorType]) -> Result<TensorType, InferError> {
    arity(op, inputs, 2, 2)?;
    let dtype = same_dtype(op, inputs)?;
    if dtype == DType::Bool {
        return err("MatMul on bool");
    }
    let (a, b) = (&inputs[0].shape, &inputs[1].shape);
    if a.is_empty() || b.is_empty() {
        return err("MatMul operands must have rank >= 1");
    }
    let a2: Vec<usize> = if a.len() == 1 { vec![1, a[0]] } else { a.clone() };
    let b2: Vec<usize> = if b.len() == 1 { vec![b[0], 1] } else { b.clone() };
    let (m, k1) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k1 != k2 {
        return err(format!("MatMul inner dimensions differ: {a:?} x {b:?}"));
    }
    let mut shape = broadcast_shapes(&a2[..a2.len() - 2], &b2[..b2.len() - 2])?;
    if a.len() > 1 {
        shape.push(m);
    }
    if b.len() > 1 {
        shape.push(n);
    }
    Ok(TensorType::new(dtype, shape))
}

/// The length `k` of the index tuples of a GatherND or ScatterND (the last dim of `idx`), checked: integer
/// indices of rank >= 1 with `batch_dims` leading dims equal to data's, and `1 <= k <= rank - batch_dims`.
pub fn nd_tuple_len(op: &Op, data: &TensorType, idx: &TensorType, batch_dims: usize) -> Result<usize, InferError> {
    let name = op.name();
    if !idx.dtype.is_int() || idx.rank() == 0 {
        return err(format!("{name}: indices must be integers of rank >= 1, got {idx}"));
    }
    if batch_dims >= data.rank().min(idx.rank()) {
        return err(format!("{name}: batch_dims {batch_dims} must be below the ranks of data ({data}) and indices ({idx})"));
    }
    if data.shape[..batch_dims] != idx.shape[..batch_dims] {
        return err(format!("{name}: the {batch_dims} batch dims of data ({data}) and indices ({idx}) differ"));
    }
    let k = idx.shape[idx.rank() - 1];
    if k == 0 || k > data.rank() - batch_dims {
        return err(format!("{name}: index tuples of length {k} for data {data} with {batch_dims} batch dims"));
    }
    Ok(k)
}

/// The shapes an [`Op::Attention`] works on, from its input types (checked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionDims {
    /// Broadcast leading (batch, head) dims of q, k and v.
    pub batch: Vec<usize>,
    pub sq: usize,
    pub sk: usize,
    pub d: usize,
    pub dv: usize,
}

impl AttentionDims {
    /// `[batch.., Sq, Sk]`, what the mask and keep inputs broadcast to.
    pub fn scores_shape(&self) -> Vec<usize> {
        let mut s = self.batch.clone();
        s.extend([self.sq, self.sk]);
        s
    }

    pub fn out_shape(&self) -> Vec<usize> {
        let mut s = self.batch.clone();
        s.extend([self.sq, self.dv]);
        s
    }
}

/// Checks an Attention's inputs against its attributes and returns its dims.
pub fn attention_dims(a: &AttentionAttrs, inputs: &[&TensorType]) -> Result<AttentionDims, InferError> {
    if inputs.len() != a.arity() {
        return err(format!(
            "Attention (mask: {}, keep: {}) takes {} inputs, got {}",
            a.mask,
            a.keep_fill.is_some(),
            a.arity(),
            inputs.len()
        ));
    }
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    need_float(&Op::Attention(a.clone()), q)?;
    for (name, t) in [("k", k), ("v", v)] {
        if t.dtype != q.dtype {
            return err(format!("Attention: {name} is {}, q is {}", t.dtype, q.dtype));
        }
    }
    if q.rank() < 2 || k.rank() < 2 || v.rank() < 2 {
        return err(format!("Attention: q, k and v need rank >= 2, got {q}, {k}, {v}"));
    }
    let two = |t: &TensorType| (t.shape[t.rank() - 2], t.shape[t.rank() - 1]);
    let (sq, d) = two(q);
    let (sk, dk) = if a.k_transposed { let (x, y) = two(k); (y, x) } else { two(k) };
    let (sv, dv) = two(v);
    if dk != d {
        return err(format!("Attention: q {q} and k {k} (transposed: {}) differ in the head dim", a.k_transposed));
    }
    if sv != sk {
        return err(format!("Attention: k {k} has {sk} keys, v {v} has {sv}"));
    }
    let lead = |t: &TensorType| t.shape[..t.rank() - 2].to_vec();
    let batch = broadcast_shapes(&broadcast_shapes(&lead(q), &lead(k))?, &lead(v))?;
    let dims = AttentionDims { batch, sq, sk, d, dv };
    let scores = dims.scores_shape();
    if let Some(i) = a.mask_index() {
        let m = inputs[i];
        if m.dtype != q.dtype {
            return err(format!("Attention: mask is {}, q is {}", m.dtype, q.dtype));
        }
        if m.rank() > scores.len() || broadcast_shapes(&scores, &m.shape).ok().as_deref() != Some(&scores[..]) {
            return err(format!("Attention: mask {m} must broadcast to the scores' shape {scores:?}"));
        }
    }
    if let Some(i) = a.keep_index() {
        let m = inputs[i];
        if m.dtype != DType::Bool {
            return err(format!("Attention: keep mask must be bool, got {}", m.dtype));
        }
        if m.rank() > scores.len() || broadcast_shapes(&scores, &m.shape).ok().as_deref() != Some(&scores[..]) {
            return err(format!("Attention: keep mask {m} must broadcast to the scores' shape {scores:?}"));
        }
    }
    Ok(dims)
}

/// Output types of `op` applied to inputs of the given types.
pub fn infer_op(op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, InferError> {
    let one = |t: TensorType| Ok(vec![t]);
    match op {
        Op::Identity => {
            arity(op, inputs, 1, 1)?;
            one(inputs[0].clone())
        }
        Op::Unary(u) => {
            arity(op, inputs, 1, 1)?;
            let x = inputs[0];
            match u {
                UnaryOp::Not => {
                    if x.dtype != DType::Bool {
                        return err(format!("Not needs bool, got {}", x.dtype));
                    }
                    one(x.clone())
                }
                UnaryOp::IsNaN => {
                    need_float(op, x)?;
                    one(TensorType::new(DType::Bool, x.shape.clone()))
                }
                UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Relu => {
                    if x.dtype == DType::Bool {
                        return err(format!("{} on bool", op.name()));
                    }
                    one(x.clone())
                }
                _ => {
                    need_float(op, x)?;
                    one(x.clone())
                }
            }
        }
        Op::LeakyRelu { .. } | Op::HardSigmoid { .. } | Op::Gelu { .. } => {
            arity(op, inputs, 1, 1)?;
            need_float(op, inputs[0])?;
            one(inputs[0].clone())
        }
        Op::Clip { min, max } => {
            arity(op, inputs, 1, 1)?;
            if inputs[0].dtype == DType::Bool {
                return err("Clip on bool");
            }
            if min > max {
                return err(format!("Clip: min {min} > max {max}"));
            }
            one(inputs[0].clone())
        }
        Op::Binary(b) => {
            arity(op, inputs, 2, 2)?;
            let dtype = same_dtype(op, inputs)?;
            let shape = broadcast_shapes(&inputs[0].shape, &inputs[1].shape)?;
            match b {
                BinaryOp::And | BinaryOp::Or if dtype != DType::Bool => return err(format!("{} needs bool", op.name())),
                BinaryOp::And | BinaryOp::Or | BinaryOp::Equal => {}
                _ if dtype == DType::Bool => return err(format!("{} on bool", op.name())),
                _ => {}
            }
            one(TensorType::new(if b.returns_bool() { DType::Bool } else { dtype }, shape))
        }
        Op::Where => {
            arity(op, inputs, 3, 3)?;
            if inputs[0].dtype != DType::Bool {
                return err(format!("Where: condition must be bool, got {}", inputs[0].dtype));
            }
            same_dtype(op, &inputs[1..])?;
            let s = broadcast_shapes(&inputs[0].shape, &inputs[1].shape)?;
            let s = broadcast_shapes(&s, &inputs[2].shape)?;
            one(TensorType::new(inputs[1].dtype, s))
        }
        Op::Cast { to } => {
            arity(op, inputs, 1, 1)?;
            one(TensorType::new(*to, inputs[0].shape.clone()))
        }
        Op::MatMul => Ok(vec![infer_matmul(op, inputs)?]),
        Op::Conv(a) => Ok(vec![infer_conv(op, a, inputs)?]),
        Op::ConvTranspose(a) => Ok(vec![infer_conv_transpose(op, a, inputs)?]),
        Op::BatchNorm { .. } => {
            arity(op, inputs, 5, 5)?;
            let x = inputs[0];
            need_float(op, x)?;
            if x.rank() < 2 {
                return err("BatchNormalization needs rank >= 2");
            }
            for p in &inputs[1..] {
                if p.shape != [x.shape[1]] {
                    return err(format!("BatchNormalization: parameters must be [{}], got {}", x.shape[1], p));
                }
            }
            one(x.clone())
        }
        Op::MaxPool(p) => Ok(vec![infer_pool(op, p, inputs)?]),
        Op::NhwcConv(_) | Op::NhwcMaxPool(_) => Ok(vec![infer_channels_last(op, inputs)?]),
        Op::AveragePool { pool, .. } => Ok(vec![infer_pool(op, pool, inputs)?]),
        Op::GlobalAveragePool => {
            arity(op, inputs, 1, 1)?;
            let x = inputs[0];
            need_float(op, x)?;
            if x.rank() < 3 {
                return err("GlobalAveragePool needs rank >= 3");
            }
            let mut s = x.shape[..2].to_vec();
            s.extend(std::iter::repeat_n(1, x.rank() - 2));
            one(TensorType::new(x.dtype, s))
        }
        Op::Reduce { axes, keepdims, .. } => {
            arity(op, inputs, 1, 1)?;
            let x = inputs[0];
            if x.dtype == DType::Bool {
                return err(format!("{} on bool", op.name()));
            }
            if axes.is_empty() || axes.windows(2).any(|w| w[0] >= w[1]) {
                return err(format!("{}: axes must be non-empty, sorted and unique, got {axes:?}", op.name()));
            }
            for &a in axes {
                check_axis(op, a, x.rank())?;
            }
            let mut s = Vec::new();
            for (i, &d) in x.shape.iter().enumerate() {
                if axes.contains(&i) {
                    if *keepdims {
                        s.push(1);
                    }
                } else {
                    s.push(d);
                }
            }
            one(TensorType::new(x.dtype, s))
        }
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            arity(op, inputs, 1, 1)?;
            need_float(op, inputs[0])?;
            check_axis(op, *axis, inputs[0].rank())?;
            one(inputs[0].clone())
        }
        Op::LayerNorm { axis, .. } => {
            arity(op, inputs, 2, 3)?;
            let x = inputs[0];
            need_float(op, x)?;
            check_axis(op, *axis, x.rank())?;
            let norm = &x.shape[*axis..];
            for p in &inputs[1..] {
                if broadcast_shapes(norm, &p.shape).ok().as_deref() != Some(norm) {
                    return err(format!("LayerNormalization: scale/bias {p} must broadcast to {norm:?}"));
                }
            }
            one(x.clone())
        }
        Op::Reshape { shape } => {
            arity(op, inputs, 1, 1)?;
            let x = inputs[0];
            if shape.iter().product::<usize>() != x.numel() {
                return err(format!("Reshape of {x} to {shape:?} changes the element count"));
            }
            one(TensorType::new(x.dtype, shape.clone()))
        }
        Op::Transpose { perm } => {
            arity(op, inputs, 1, 1)?;
            let x = inputs[0];
            let mut seen = vec![false; x.rank()];
            if perm.len() != x.rank() || perm.iter().any(|&p| p >= x.rank() || std::mem::replace(&mut seen[p], true)) {
                return err(format!("Transpose: {perm:?} is not a permutation of rank {}", x.rank()));
            }
            one(TensorType::new(x.dtype, perm.iter().map(|&p| x.shape[p]).collect::<Vec<_>>()))
        }
        Op::Concat { axis } => {
            if inputs.is_empty() {
                return err("Concat needs at least one input");
            }
            let dtype = same_dtype(op, inputs)?;
            let r = inputs[0].rank();
            check_axis(op, *axis, r)?;
            let mut s = inputs[0].shape.clone();
            s[*axis] = 0;
            for t in inputs {
                if t.rank() != r || t.shape.iter().enumerate().any(|(i, &d)| i != *axis && d != inputs[0].shape[i]) {
                    return err(format!("Concat: {} does not match {} outside axis {axis}", t, inputs[0]));
                }
                s[*axis] += t.shape[*axis];
            }
            one(TensorType::new(dtype, s))
        }
        Op::Split { axis, sizes } => {
            arity(op, inputs, 1, 1)?;
            let x = inputs[0];
            check_axis(op, *axis, x.rank())?;
            if sizes.iter().sum::<usize>() != x.shape[*axis] {
                return err(format!("Split: sizes {sizes:?} do not add up to dimension {}", x.shape[*axis]));
            }
            Ok(sizes
                .iter()
                .map(|&n| {
                    let mut s = x.shape.clone();
                    s[*axis] = n;
                    TensorType::new(x.dtype, s)
                })
                .collect())
        }
        Op::Slice { axes, starts, ends, steps } => {
            arity(op, inputs, 1, 1)?;
            let x = inputs[0];
            if starts.len() != axes.len() || ends.len() != axes.len() || steps.len() != axes.len() {
                return err("Slice: axes, starts, ends and steps differ in length");
            }
            let mut s = x.shape.clone();
            for i in 0..axes.len() {
                let a = axes[i];
                check_axis(op, a, x.rank())?;
                let (st, en, sp) = (starts[i], ends[i], steps[i]);
                let dim = x.shape[a] as i64;
                if sp == 0 {
                    return err("Slice: step 0");
                }
                let valid = if sp > 0 {
                    (0..=dim).contains(&st) && (0..=dim).contains(&en)
                } else {
                    (-1..dim).contains(&st) && (-1..dim).contains(&en)
                };
                if !valid {
                    return err(format!("Slice: start {st}, end {en}, step {sp} not normalized for dimension {dim}"));
                }
                let len = if sp > 0 { ((en - st).max(0) + sp - 1) / sp } else { ((st - en).max(0) - sp - 1) / -sp };
                s[a] = len as usize;
            }
            one(TensorType::new(x.dtype, s))
        }
        Op::Gather { axis } => {
            arity(op, inputs, 2, 2)?;
            let (x, idx) = (inputs[0], inputs[1]);
            check_axis(op, *axis, x.rank())?;
            if !idx.dtype.is_int() {
                return err(format!("Gather: indices must be integers, got {}", idx.dtype));
            }
            let mut s = x.shape[..*axis].to_vec();
            s.extend_from_slice(&idx.shape);
            s.extend_from_slice(&x.shape[*axis + 1..]);
            one(TensorType::new(x.dtype, s))
        }
        Op::GatherElements { axis } => {
            arity(op, inputs, 2, 2)?;
            let (x, idx) = (inputs[0], inputs[1]);
            check_axis(op, *axis, x.rank())?;
            if !idx.dtype.is_int() || idx.rank() != x.rank() {
                return err(format!("GatherElements: indices must be integers of rank {}, got {}", x.rank(), idx));
            }
            one(TensorType::new(x.dtype, idx.shape.clone()))
        }
        Op::Expand { shape } => {
            arity(op, inputs, 1, 1)?;
            let s = broadcast_shapes(&inputs[0].shape, shape)?;
            one(TensorType::new(inputs[0].dtype, s))
        }
        Op::Pad { pads, .. } => {
            arity(op, inputs, 1, 1)?;
            let x = inputs[0];
            if pads.len() != 2 * x.rank() {
                return err(format!("Pad: {} pads for rank {}", pads.len(), x.rank()));
            }
            let mut s = Vec::new();
            for (i, &d) in x.shape.iter().enumerate() {
                let n = (d as i64).checked_add(pads[i]).and_then(|n| n.checked_add(pads[x.rank() + i]));
                match n {
                    Some(n) if n >= 0 => s.push(n as usize),
                    Some(_) => return err("Pad: negative output dimension"),
                    None => return err(format!("Pad: dimension {i} ({d} padded by {} and {}) overflows", pads[i], pads[x.rank() + i])),
                }
            }
            one(TensorType::new(x.dtype, s))
        }
        Op::Attention(a) => {
            let dims = attention_dims(a, inputs)?;
            one(TensorType::new(inputs[0].dtype, dims.out_shape()))
        }
        Op::CumSum { axis, .. } => {
            arity(op, inputs, 1, 1)?;
            let x = inputs[0];
            check_axis(op, *axis, x.rank())?;
            if x.dtype == DType::Bool {
                return err("CumSum on bool");
            }
            one(x.clone())
        }
        Op::GatherND { batch_dims } => {
            arity(op, inputs, 2, 2)?;
            let (data, idx) = (inputs[0], inputs[1]);
            let k = nd_tuple_len(op, data, idx, *batch_dims)?;
            let mut s = idx.shape[..idx.rank() - 1].to_vec();
            s.extend_from_slice(&data.shape[batch_dims + k..]);
            one(TensorType::new(data.dtype, s))
        }
        Op::ScatterND => {
            arity(op, inputs, 3, 3)?;
            let (data, idx, upd) = (inputs[0], inputs[1], inputs[2]);
            let k = nd_tuple_len(op, data, idx, 0)?;
            let mut want = idx.shape[..idx.rank() - 1].to_vec();
            want.extend_from_slice(&data.shape[k..]);
            if upd.dtype != data.dtype || upd.shape != want {
                return err(format!("ScatterND: updates must be {}, got {upd}", TensorType::new(data.dtype, want)));
            }
            one(data.clone())
        }
        Op::Tile { repeats } => {
            arity(op, inputs, 1, 1)?;
            let x = inputs[0];
            if repeats.len() != x.rank() {
                return err(format!("Tile: {} repeats for rank {}", repeats.len(), x.rank()));
            }
            let mut s = Vec::with_capacity(repeats.len());
            for (i, (&d, &r)) in x.shape.iter().zip(repeats).enumerate() {
                match d.checked_mul(r) {
                    Some(n) => s.push(n),
                    None => return err(format!("Tile: dimension {i} ({d} repeated {r} times) overflows")),
                }
            }
            one(TensorType::new(x.dtype, s))
        }
    }
}

#[cfg(test)]
#[path = "infer_tests.rs"]
mod tests;
