//! Neural-network ops: convolutions and pools (auto_pad resolved to explicit pads), normalizations, Gemm and
//! MatMul, the softmax family, LRN, Dropout (inference: identity).

use super::one;
use crate::ir::{BinaryOp, ConvAttrs, ConvTransposeAttrs, Op, PoolAttrs, ReduceKind, UnaryOp, ValueId};
use crate::onnx::attrs::norm_axis;
use crate::onnx::error::{NResult, NodeError};
use crate::onnx::importer::{Importer, NodeCx};
use crate::onnx::ops::Converter;

pub const OPS: &[&str] = &[
    "Conv", "ConvTranspose", "BatchNormalization", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
    "Gemm", "MatMul", "Softmax", "LogSoftmax", "LayerNormalization", "LRN", "InstanceNormalization", "Dropout",
];

pub fn converter(op: &str) -> Option<Converter> {
    Some(match op {
        "Conv" => conv,
        "ConvTranspose" => conv_transpose,
        "BatchNormalization" => batch_norm,
        "MaxPool" => max_pool,
        "AveragePool" => average_pool,
        "GlobalAveragePool" => global_average_pool,
        "GlobalMaxPool" => global_max_pool,
        "Gemm" => gemm,
        "MatMul" => matmul,
        "Softmax" | "LogSoftmax" => softmax,
        "LayerNormalization" => layer_norm,
        "LRN" => lrn,
        "InstanceNormalization" => instance_norm,
        "Dropout" => dropout,
        _ => return None,
    })
}

/// The window attributes shared by Conv and the pools, with auto_pad resolved against the static input shape.
struct Window {
    strides: Vec<usize>,
    pads: Vec<usize>,
    dilations: Vec<usize>,
}

fn window(n: &NodeCx, spatial: &[usize], kernel: &[usize]) -> NResult<Window> {
    let k = spatial.len();
    let get = |name: &str| -> NResult<Vec<usize>> {
        let v = n.attrs.positive(name)?.unwrap_or_else(|| vec![1; k]);
        if v.len() != k {
            return Err(NodeError::attr(name, format!("needs {k} values for {k} spatial dimensions, got {v:?}")));
        }
        Ok(v)
    };
    let strides = get("strides")?;
    let dilations = get("dilations")?;
    let explicit = n.attrs.usizes("pads")?;
    if let Some(p) = &explicit {
        if p.len() != 2 * k {
            return Err(NodeError::attr("pads", format!("needs {} values, got {p:?}", 2 * k)));
        }
    }
    let auto_pad = n.attrs.string("auto_pad")?.unwrap_or_else(|| "NOTSET".into());
    let pads = match auto_pad.as_str() {
        "NOTSET" => explicit.unwrap_or_else(|| vec![0; 2 * k]),
        "VALID" => vec![0; 2 * k],
        "SAME_UPPER" | "SAME_LOWER" => {
            if explicit.as_ref().is_some_and(|p| p.iter().any(|&x| x != 0)) {
                return Err(NodeError::attr("pads", format!("explicit pads cannot be combined with auto_pad {auto_pad}")));
            }
            let mut pads = vec![0; 2 * k];
            for d in 0..k {
                let out = spatial[d].div_ceil(strides[d]);
                let need = (out.max(1) - 1) * strides[d] + (kernel[d] - 1) * dilations[d] + 1;
                let total = need.saturating_sub(spatial[d]);
                let small = total / 2;
                let (begin, end) = if auto_pad == "SAME_UPPER" { (small, total - small) } else { (total - small, small) };
                pads[d] = begin;
                pads[k + d] = end;
            }
            pads
        }
        other => return Err(NodeError::attr("auto_pad", format!("expected NOTSET, SAME_UPPER, SAME_LOWER or VALID, got '{other}'"))),
    };
    Ok(Window { strides, pads, dilations })
}

fn check_kernel_attr(n: &NodeCx, kernel: &[usize]) -> NResult<()> {
    if let Some(ks) = n.attrs.usizes("kernel_shape")? {
        if ks != kernel {
            return Err(NodeError::attr("kernel_shape", format!("{ks:?} disagrees with the weight's spatial shape {kernel:?}")));
        }
    }
    Ok(())
}

fn group(n: &NodeCx) -> NResult<usize> {
    let g = n.attrs.int_or("group", 1)?;
    usize::try_from(g).ok().filter(|&g| g > 0).ok_or_else(|| NodeError::attr("group", format!("must be positive, got {g}")))
}

fn conv(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let w = im.input(n, 1)?;
    let b = im.opt_input(n, 2)?;
    let (xs, ws) = (im.shape(x), im.shape(w));
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(NodeError::invalid(format!("input {xs:?} and weight {ws:?} must have the same rank, at least 3")));
    }
    let kernel = &ws[2..];
    if kernel.contains(&0) || xs[2..].contains(&0) {
        return Err(NodeError::invalid(format!("empty spatial dimensions in input {xs:?} or weight {ws:?}")));
    }
    check_kernel_attr(n, kernel)?;
    let win = window(n, &xs[2..], kernel)?;
    let attrs = ConvAttrs { strides: win.strides, pads: win.pads, dilations: win.dilations, group: group(n)? };
    let mut inputs = vec![x, w];
    inputs.extend(b);
    one(im.emit(n, Op::Conv(attrs), &inputs)?)
}

/// ConvTranspose, with `output_shape` and auto_pad turned into explicit pads (ONNX's formula: total padding =
/// stride*(in-1) + output_padding + (k-1)*dilation + 1 - out, split by auto_pad's rule).
fn conv_transpose(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let w = im.input(n, 1)?;
    let b = im.opt_input(n, 2)?;
    let (xs, ws) = (im.shape(x), im.shape(w));
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(NodeError::invalid(format!("input {xs:?} and weight {ws:?} must have the same rank, at least 3")));
    }
    let k = xs.len() - 2;
    let kernel = ws[2..].to_vec();
    if kernel.contains(&0) || xs[2..].contains(&0) {
        return Err(NodeError::invalid(format!("empty spatial dimensions in input {xs:?} or weight {ws:?}")));
    }
    check_kernel_attr(n, &kernel)?;
    let get = |name: &str, default: usize| -> NResult<Vec<usize>> {
        let v = n.attrs.usizes(name)?.unwrap_or_else(|| vec![default; k]);
        if v.len() != k {
            return Err(NodeError::attr(name, format!("needs {k} values, got {v:?}")));
        }
        Ok(v)
    };
    let strides = get("strides", 1)?;
    let dilations = get("dilations", 1)?;
    let output_padding = get("output_padding", 0)?;
    if strides.contains(&0) || dilations.contains(&0) {
        return Err(NodeError::attr("strides", "strides and dilations must be positive"));
    }
    let auto_pad = n.attrs.string("auto_pad")?.unwrap_or_else(|| "NOTSET".into());
    let output_shape = match n.attrs.usizes("output_shape")? {
        Some(s) => {
            // output_shape may list only the spatial dims or the full shape.
            let s = if s.len() == xs.len() { s[2..].to_vec() } else { s };
            if s.len() != k {
                return Err(NodeError::attr("output_shape", format!("needs {k} spatial values, got {s:?}")));
            }
            Some(s)
        }
        None if auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER" => Some((0..k).map(|d| xs[2 + d] * strides[d]).collect()),
        None => None,
    };
    let pads = match output_shape {
        Some(out) => {
            let mut pads = vec![0; 2 * k];
            for d in 0..k {
                let full = strides[d] * (xs[2 + d] - 1) + output_padding[d] + (kernel[d] - 1) * dilations[d] + 1;
                if full < out[d] {
                    return Err(NodeError::unsupported_attr(
                        "output_shape",
                        "ConvTranspose output_shape beyond the full output",
                        format!("output_shape {out:?} is larger than the full output size {full} along axis {d}"),
                    ));
                }
                let total = full - out[d];
                let half = total / 2;
                let (begin, end) = if auto_pad == "SAME_UPPER" { (half, total - half) } else { (total - half, half) };
                pads[d] = begin;
                pads[k + d] = end;
            }
            pads
        }
        None => match auto_pad.as_str() {
            "NOTSET" => {
                let p = n.attrs.usizes("pads")?.unwrap_or_else(|| vec![0; 2 * k]);
                if p.len() != 2 * k {
                    return Err(NodeError::attr("pads", format!("needs {} values, got {p:?}", 2 * k)));
                }
                p
            }
            "VALID" => vec![0; 2 * k],
            other => return Err(NodeError::attr("auto_pad", format!("unknown value '{other}'"))),
        },
    };
    let attrs = ConvTransposeAttrs { strides, pads, dilations, group: group(n)?, output_padding };
    let mut inputs = vec![x, w];
    inputs.extend(b);
    one(im.emit(n, Op::ConvTranspose(attrs), &inputs)?)
}

fn batch_norm(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    if n.attrs.int_or("training_mode", 0)? != 0 {
        return Err(NodeError::unsupported_attr("training_mode", "BatchNormalization training", "training_mode=1 (only inference is supported)"));
    }
    if n.attrs.int_or("spatial", 1)? != 1 {
        return Err(NodeError::unsupported_attr("spatial", "BatchNormalization spatial=0", "spatial=0 (per-activation statistics)"));
    }
    let inputs = (0..5).map(|i| im.input(n, i)).collect::<NResult<Vec<_>>>()?;
    let epsilon = n.attrs.float_or("epsilon", 1e-5)?;
    for i in 1..n.num_outputs() {
        im.decline_output(n, i, "is only defined in training mode");
    }
    one(im.emit(n, Op::BatchNorm { epsilon }, &inputs)?)
}

fn pool_attrs(im: &Importer, n: &NodeCx, x: ValueId) -> NResult<PoolAttrs> {
    let xs = im.shape(x);
    if xs.len() < 3 {
        return Err(NodeError::invalid(format!("input must have rank >= 3, got {xs:?}")));
    }
    let Some(kernel) = n.attrs.positive("kernel_shape")? else {
        return Err(NodeError::attr("kernel_shape", "required attribute is absent"));
    };
    if kernel.len() != xs.len() - 2 {
        return Err(NodeError::attr("kernel_shape", format!("needs {} values, got {kernel:?}", xs.len() - 2)));
    }
    let win = window(n, &xs[2..], &kernel)?;
    let ceil_mode = n.attrs.int_or("ceil_mode", 0)? != 0;
    Ok(PoolAttrs { kernel, strides: win.strides, pads: win.pads, dilations: win.dilations, ceil_mode })
}

fn max_pool(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let p = pool_attrs(im, n, x)?;
    im.decline_output(n, 1, "(the argmax indices) is not supported");
    one(im.emit(n, Op::MaxPool(p), &[x])?)
}

fn average_pool(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let pool = pool_attrs(im, n, x)?;
    let count_include_pad = n.attrs.int_or("count_include_pad", 0)? != 0;
    one(im.emit(n, Op::AveragePool { pool, count_include_pad }, &[x])?)
}

fn global_average_pool(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    one(im.emit(n, Op::GlobalAveragePool, &[x])?)
}

/// ReduceMax over the spatial axes, keeping them.
fn global_max_pool(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let r = im.rank(x);
    if r < 3 {
        return Err(NodeError::invalid(format!("input must have rank >= 3, got {:?}", im.shape(x))));
    }
    one(im.emit(n, Op::Reduce { kind: ReduceKind::Max, axes: (2..r).collect(), keepdims: true }, &[x])?)
}

/// `alpha * A' B' + beta * C` as MatMul, Transpose, Mul and Add. Transposes and alpha of a constant B are
/// folded into the weight (eager folding evaluates them), so a Linear layer is one MatMul with a constant.
fn gemm(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let mut a = im.input(n, 0)?;
    let mut b = im.input(n, 1)?;
    let c = im.opt_input(n, 2)?;
    if im.rank(a) != 2 || im.rank(b) != 2 {
        return Err(NodeError::invalid(format!("A and B must be matrices, got {:?} and {:?}", im.shape(a), im.shape(b))));
    }
    let alpha = n.attrs.float_or("alpha", 1.0)?;
    let beta = n.attrs.float_or("beta", 1.0)?;
    if n.attrs.int_or("transA", 0)? != 0 {
        a = im.emit(n, Op::Transpose { perm: vec![1, 0] }, &[a])?;
    }
    if n.attrs.int_or("transB", 0)? != 0 {
        b = im.emit(n, Op::Transpose { perm: vec![1, 0] }, &[b])?;
    }
    let dt = im.dtype(a);
    let b_const = im.constant(b).is_some();
    if alpha != 1.0 && b_const {
        let s = im.scalar(n, dt, alpha as f64);
        b = im.emit(n, Op::Binary(BinaryOp::Mul), &[b, s])?;
    }
    let mut y = im.emit(n, Op::MatMul, &[a, b])?;
    if alpha != 1.0 && !b_const {
        let s = im.scalar(n, dt, alpha as f64);
        y = im.emit(n, Op::Binary(BinaryOp::Mul), &[y, s])?;
    }
    if let Some(mut c) = c {
        if beta != 0.0 {
            if beta != 1.0 {
                let s = im.scalar(n, dt, beta as f64);
                c = im.emit(n, Op::Binary(BinaryOp::Mul), &[c, s])?;
            }
            let out_shape = im.shape(y);
            y = im.emit(n, Op::Binary(BinaryOp::Add), &[y, c])?;
            if im.shape(y) != out_shape {
                return Err(NodeError::invalid(format!("C does not broadcast to the output shape {out_shape:?}")));
            }
        }
    }
    one(y)
}

fn matmul(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let a = im.input(n, 0)?;
    let b = im.input(n, 1)?;
    one(im.emit(n, Op::MatMul, &[a, b])?)
}

/// Softmax and LogSoftmax. From opset 13 they normalize along `axis` (default -1). Before, the input is
/// coerced to 2-D at `axis` (default 1) and normalized over the flattened trailing block, which becomes
/// Reshape, Softmax over axis 1, Reshape (or a plain Softmax when `axis` is the last axis, where both agree).
fn softmax(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let shape = im.shape(x);
    let r = shape.len();
    if r == 0 {
        return Err(NodeError::invalid("input must have rank >= 1"));
    }
    let log = n.op_type == "LogSoftmax";
    let make = |axis: usize| if log { Op::LogSoftmax { axis } } else { Op::Softmax { axis } };
    if im.opset >= 13 {
        let axis = norm_axis(n.attrs.int_or("axis", -1)?, r, "axis")?;
        return one(im.emit(n, make(axis), &[x])?);
    }
    let axis = norm_axis(n.attrs.int_or("axis", 1)?, r, "axis")?;
    if axis == r - 1 {
        return one(im.emit(n, make(axis), &[x])?);
    }
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis..].iter().product();
    let flat = im.reshape(n, x, vec![outer, inner])?;
    let y = im.emit(n, make(1), &[flat])?;
    one(im.reshape(n, y, shape)?)
}

fn layer_norm(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let scale = im.input(n, 1)?;
    let bias = im.opt_input(n, 2)?;
    let axis = norm_axis(n.attrs.int_or("axis", -1)?, im.rank(x), "axis")?;
    let epsilon = n.attrs.float_or("epsilon", 1e-5)?;
    for i in 1..n.num_outputs() {
        im.decline_output(n, i, "(a training statistic) is not supported");
    }
    let mut inputs = vec![x, scale];
    inputs.extend(bias);
    one(im.emit(n, Op::LayerNorm { axis, epsilon }, &inputs)?)
}

/// Local response normalization across channels:
/// `y = x / (bias + alpha/size * sum_{window of size channels} x^2) ^ beta`. The windowed sum divided by `size`
/// is an AveragePool (count_include_pad) of x^2 viewed as `[N, 1, C, rest]` with a `[size, 1]` kernel and
/// ONNX's asymmetric window (floor((size-1)/2) channels before, ceil((size-1)/2) after).
fn lrn(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let shape = im.shape(x);
    if shape.len() < 2 {
        return Err(NodeError::invalid(format!("input must have rank >= 2, got {shape:?}")));
    }
    let Some(size) = n.attrs.int("size")? else {
        return Err(NodeError::attr("size", "required attribute is absent"));
    };
    let size = usize::try_from(size).ok().filter(|&s| s > 0).ok_or_else(|| NodeError::attr("size", format!("must be positive, got {size}")))?;
    let alpha = n.attrs.float_or("alpha", 1e-4)? as f64;
    let beta = n.attrs.float_or("beta", 0.75)? as f64;
    let bias = n.attrs.float_or("bias", 1.0)? as f64;
    let dt = im.dtype(x);
    let rest: usize = shape[2..].iter().product();
    let sq = im.emit(n, Op::Binary(BinaryOp::Mul), &[x, x])?;
    let view = im.reshape(n, sq, vec![shape[0], 1, shape[1], rest])?;
    let before = (size - 1) / 2;
    let pool = PoolAttrs {
        kernel: vec![size, 1],
        strides: vec![1, 1],
        pads: vec![before, 0, size - 1 - before, 0],
        dilations: vec![1, 1],
        ceil_mode: false,
    };
    let avg = im.emit(n, Op::AveragePool { pool, count_include_pad: true }, &[view])?;
    let avg = im.reshape(n, avg, shape)?;
    let (a, k, b) = (im.scalar(n, dt, alpha), im.scalar(n, dt, bias), im.scalar(n, dt, beta));
    let scaled = im.emit(n, Op::Binary(BinaryOp::Mul), &[avg, a])?;
    let base = im.emit(n, Op::Binary(BinaryOp::Add), &[scaled, k])?;
    let denom = im.emit(n, Op::Binary(BinaryOp::Pow), &[base, b])?;
    one(im.emit(n, Op::Binary(BinaryOp::Div), &[x, denom])?)
}

/// `(x - mean) / sqrt(var + epsilon) * scale + bias`, statistics per sample and channel over the spatial axes.
fn instance_norm(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let scale = im.input(n, 1)?;
    let bias = im.input(n, 2)?;
    let shape = im.shape(x);
    let r = shape.len();
    if r < 3 {
        return Err(NodeError::invalid(format!("input must have rank >= 3, got {shape:?}")));
    }
    let epsilon = n.attrs.float_or("epsilon", 1e-5)? as f64;
    let dt = im.dtype(x);
    let axes: Vec<usize> = (2..r).collect();
    let mut cshape = vec![shape[1]];
    cshape.resize(r - 1, 1);
    let scale = im.reshape(n, scale, cshape.clone())?;
    let bias = im.reshape(n, bias, cshape)?;
    let mean = im.emit(n, Op::Reduce { kind: ReduceKind::Mean, axes: axes.clone(), keepdims: true }, &[x])?;
    let d = im.emit(n, Op::Binary(BinaryOp::Sub), &[x, mean])?;
    let d2 = im.emit(n, Op::Binary(BinaryOp::Mul), &[d, d])?;
    let var = im.emit(n, Op::Reduce { kind: ReduceKind::Mean, axes, keepdims: true }, &[d2])?;
    let eps = im.scalar(n, dt, epsilon);
    let ve = im.emit(n, Op::Binary(BinaryOp::Add), &[var, eps])?;
    let sd = im.emit(n, Op::Unary(UnaryOp::Sqrt), &[ve])?;
    let norm = im.emit(n, Op::Binary(BinaryOp::Div), &[d, sd])?;
    let scaled = im.emit(n, Op::Binary(BinaryOp::Mul), &[norm, scale])?;
    one(im.emit(n, Op::Binary(BinaryOp::Add), &[scaled, bias])?)
}

/// Inference-mode Dropout is the identity; a constant `training_mode` of true is rejected, the mask output
/// is not produced.
fn dropout(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    if let Some(t) = im.opt_const_input(n, 2, "training_mode")? {
        if t.to_i64_vec().first().copied().unwrap_or(0) != 0 {
            return Err(NodeError::unsupported("Dropout training", "training_mode is true (only inference is supported)"));
        }
    }
    im.decline_output(n, 1, "(the dropout mask) is not supported");
    one(im.emit(n, Op::Identity, &[x])?)
}
