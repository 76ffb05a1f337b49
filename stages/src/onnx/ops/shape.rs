//! Data-movement and shape ops, reductions, and the ops that only ever produce constants (Shape, Size,
//! ConstantOfShape, Constant, Range). Every shape-like operand must be constant once folded; it becomes an
//! attribute of the IR op in the normalized form documented on [`Op`].

use super::one;
use crate::ir::{BinaryOp, DType, Op, PadMode, ReduceKind, Tensor, TensorType, UnaryOp, ValueId};
use crate::onnx::attrs::{norm_axes, norm_axis};
use crate::onnx::error::{NResult, NodeError};
use crate::onnx::importer::{check_size, Importer, NodeCx};
use crate::onnx::ops::Converter;
use crate::onnx::tensor::tensor_from_proto;

pub const OPS: &[&str] = &[
    "Reshape", "Flatten", "Transpose", "Concat", "Split", "Slice", "Squeeze", "Unsqueeze", "Gather", "GatherElements",
    "Expand", "Pad", "Shape", "Size", "ConstantOfShape", "Constant", "Identity", "Range", "Tile", "ReduceMean",
    "ReduceSum", "ReduceMax", "ReduceMin", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSumExp",
];

pub fn converter(op: &str) -> Option<Converter> {
    Some(match op {
        "Reshape" => reshape,
        "Flatten" => flatten,
        "Transpose" => transpose,
        "Concat" => concat,
        "Split" => split,
        "Slice" => slice,
        "Squeeze" => squeeze,
        "Unsqueeze" => unsqueeze,
        "Gather" | "GatherElements" => gather,
        "Expand" => expand,
        "Pad" => pad,
        "Shape" => shape_of,
        "Size" => size,
        "ConstantOfShape" => constant_of_shape,
        "Constant" => constant,
        "Identity" => identity,
        "Range" => range,
        "Tile" => tile,
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceSumSquare" | "ReduceL1" | "ReduceL2"
        | "ReduceLogSumExp" => reduce,
        _ => return None,
    })
}

/// A constant 1-D (or scalar) integer operand as i64 values.
fn ints_of(t: &Tensor, what: &str) -> NResult<Vec<i64>> {
    if !t.dtype().is_int() || t.shape().len() > 1 {
        return Err(NodeError::invalid(format!("the {what} must be a 1-D integer tensor, got {}", t.ty)));
    }
    Ok(t.to_i64_vec())
}

fn reshape(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let spec = ints_of(&im.const_input(n, 1, "target shape")?, "target shape")?;
    let allowzero = n.attrs.int_or("allowzero", 0)? != 0;
    let xs = im.shape(x);
    let numel: usize = xs.iter().product();
    let mut out = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &s) in spec.iter().enumerate() {
        match s {
            0 if !allowzero => out.push(*xs.get(i).ok_or_else(|| {
                NodeError::invalid(format!("shape {spec:?} copies dimension {i} (0), but the input {xs:?} has rank {}", xs.len()))
            })?),
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            s if s >= 0 => out.push(s as usize),
            _ => return Err(NodeError::invalid(format!("invalid target shape {spec:?}"))),
        }
    }
    check_size("the target shape", &out, im.dtype(x)).map_err(|kind| NodeError { attribute: None, kind })?;
    if let Some(i) = infer {
        let known: usize = out.iter().product();
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(NodeError::invalid(format!("cannot reshape {xs:?} to {spec:?}")));
        }
        out[i] = numel / known;
    }
    if out.iter().product::<usize>() != numel {
        return Err(NodeError::invalid(format!("cannot reshape {xs:?} ({numel} elements) to {spec:?}")));
    }
    one(im.emit(n, Op::Reshape { shape: out }, &[x])?)
}

fn flatten(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let xs = im.shape(x);
    let r = xs.len() as i64;
    let axis = n.attrs.int_or("axis", 1)?;
    if axis < -r || axis > r {
        return Err(NodeError::attr("axis", format!("{axis} is out of range for rank {r}")));
    }
    let axis = if axis < 0 { axis + r } else { axis } as usize;
    let shape = vec![xs[..axis].iter().product(), xs[axis..].iter().product()];
    one(im.emit(n, Op::Reshape { shape }, &[x])?)
}

fn transpose(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let r = im.rank(x);
    let perm = match n.attrs.ints("perm")? {
        Some(p) => {
            let p = norm_axes(&p, r, "perm")?;
            if p.len() != r {
                return Err(NodeError::attr("perm", format!("{p:?} is not a permutation of {r} axes")));
            }
            p
        }
        None => (0..r).rev().collect(),
    };
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return one(im.emit(n, Op::Identity, &[x])?);
    }
    one(im.emit(n, Op::Transpose { perm }, &[x])?)
}

fn concat(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let xs = im.inputs(n)?;
    let Some(&first) = xs.first() else { return Err(NodeError::missing("Concat needs at least one input")) };
    let Some(axis) = n.attrs.int("axis")? else { return Err(NodeError::attr("axis", "required attribute is absent")) };
    let axis = norm_axis(axis, im.rank(first), "axis")?;
    one(im.emit(n, Op::Concat { axis }, &xs)?)
}

fn split(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let xs = im.shape(x);
    if xs.is_empty() {
        return Err(NodeError::invalid("cannot split a scalar"));
    }
    let axis = norm_axis(n.attrs.int_or("axis", 0)?, xs.len(), "axis")?;
    let dim = xs[axis];
    let given = if im.opset >= 13 {
        im.opt_const_input(n, 1, "split sizes")?.map(|t| ints_of(&t, "split sizes")).transpose()?
    } else {
        n.attrs.ints("split")?
    };
    let sizes: Vec<usize> = match given {
        Some(s) => {
            if s.iter().any(|&v| v < 0) {
                return Err(NodeError::invalid(format!("negative split size in {s:?}")));
            }
            s.iter().map(|&v| v as usize).collect()
        }
        None => {
            let count = match n.attrs.int("num_outputs")? {
                Some(k) if k > 0 => k as usize,
                Some(k) => return Err(NodeError::attr("num_outputs", format!("must be positive, got {k}"))),
                None => n.num_outputs(),
            };
            if count == 0 {
                return Err(NodeError::invalid("Split has no outputs"));
            }
            if n.attrs.has("num_outputs") {
                // Opset 18: chunks of ceil(dim / count), the last one smaller.
                let chunk = dim.div_ceil(count);
                let mut sizes = vec![chunk; count];
                let last = dim.checked_sub(chunk * (count - 1)).ok_or_else(|| {
                    NodeError::attr("num_outputs", format!("{count} outputs do not fit dimension {dim}"))
                })?;
                sizes[count - 1] = last;
                sizes
            } else {
                if !dim.is_multiple_of(count) {
                    return Err(NodeError::invalid(format!("dimension {dim} does not split evenly into {count} outputs")));
                }
                vec![dim / count; count]
            }
        }
    };
    if sizes.iter().sum::<usize>() != dim {
        return Err(NodeError::invalid(format!("split sizes {sizes:?} do not add up to dimension {dim}")));
    }
    if sizes.len() == 1 {
        return one(im.emit(n, Op::Identity, &[x])?);
    }
    im.emit_multi(n, Op::Split { axis, sizes }, &[x])
}

/// Clamps one axis of a slice the way ONNX does, producing the normalized form of [`Op::Slice`].
pub(crate) fn clamp_slice(start: i64, end: i64, step: i64, dim: usize) -> (i64, i64) {
    let d = dim as i64;
    let adj = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
    let (s, e) = (adj(start), adj(end));
    if step > 0 {
        (s.clamp(0, d), e.clamp(0, d))
    } else {
        (s.clamp(-1, d - 1), e.clamp(-1, d - 1))
    }
}

fn slice(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let xs = im.shape(x);
    let r = xs.len();
    let (starts, ends, axes, steps) = if im.opset < 10 {
        let starts = n.attrs.ints("starts")?.ok_or_else(|| NodeError::attr("starts", "required attribute is absent"))?;
        let ends = n.attrs.ints("ends")?.ok_or_else(|| NodeError::attr("ends", "required attribute is absent"))?;
        (starts, ends, n.attrs.ints("axes")?, None)
    } else {
        let get = |im: &Importer, i: usize, what: &str| -> NResult<Option<Vec<i64>>> {
            im.opt_const_input(n, i, what)?.map(|t| ints_of(&t, what)).transpose()
        };
        let starts = get(im, 1, "starts")?.ok_or_else(|| NodeError::missing("input 1 (starts) is absent"))?;
        let ends = get(im, 2, "ends")?.ok_or_else(|| NodeError::missing("input 2 (ends) is absent"))?;
        (starts, ends, get(im, 3, "axes")?, get(im, 4, "steps")?)
    };
    let axes = match axes {
        Some(a) => norm_axes(&a, r, "axes")?,
        None => (0..starts.len()).collect(),
    };
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if starts.len() != axes.len() || ends.len() != axes.len() || steps.len() != axes.len() {
        return Err(NodeError::invalid(format!(
            "starts {starts:?}, ends {ends:?}, axes {axes:?} and steps {steps:?} differ in length"
        )));
    }
    if axes.iter().any(|&a| a >= r) {
        return Err(NodeError::invalid(format!("axes {axes:?} out of range for rank {r}")));
    }
    let mut out = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..axes.len() {
        if steps[i] == 0 {
            return Err(NodeError::invalid("a slice step is 0"));
        }
        let (s, e) = clamp_slice(starts[i], ends[i], steps[i], xs[axes[i]]);
        // A whole-axis forward slice is a no-op: leave the axis out.
        if steps[i] == 1 && s == 0 && e == xs[axes[i]] as i64 {
            continue;
        }
        out.0.push(axes[i]);
        out.1.push(s);
        out.2.push(e);
        out.3.push(steps[i]);
    }
    if out.0.is_empty() {
        return one(im.emit(n, Op::Identity, &[x])?);
    }
    one(im.emit(n, Op::Slice { axes: out.0, starts: out.1, ends: out.2, steps: out.3 }, &[x])?)
}

fn axes_operand(im: &Importer, n: &NodeCx, from_input_at: i64) -> NResult<Option<Vec<i64>>> {
    if im.opset >= from_input_at {
        im.opt_const_input(n, 1, "axes")?.map(|t| ints_of(&t, "axes")).transpose()
    } else {
        n.attrs.ints("axes")
    }
}

fn squeeze(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let xs = im.shape(x);
    let axes = match axes_operand(im, n, 13)? {
        Some(a) => norm_axes(&a, xs.len(), "axes")?,
        None => (0..xs.len()).filter(|&i| xs[i] == 1).collect(),
    };
    for &a in &axes {
        if xs[a] != 1 {
            return Err(NodeError::invalid(format!("cannot squeeze axis {a} of size {} in {xs:?}", xs[a])));
        }
    }
    let shape: Vec<usize> = (0..xs.len()).filter(|i| !axes.contains(i)).map(|i| xs[i]).collect();
    one(im.emit(n, Op::Reshape { shape }, &[x])?)
}

fn unsqueeze(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let xs = im.shape(x);
    let Some(axes) = axes_operand(im, n, 13)? else {
        return Err(NodeError::missing("axes are absent"));
    };
    let out_rank = xs.len() + axes.len();
    let axes = norm_axes(&axes, out_rank, "axes")?;
    let mut rest = xs.iter();
    let shape: Vec<usize> = (0..out_rank).map(|i| if axes.contains(&i) { 1 } else { *rest.next().unwrap() }).collect();
    one(im.emit(n, Op::Reshape { shape }, &[x])?)
}

/// Gather and GatherElements. Constant indices are normalized to non-negative values (ONNX allows
/// negative ones, counting from the end) and checked against the dimension.
fn gather(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let mut idx = im.input(n, 1)?;
    let xs = im.shape(x);
    let axis = norm_axis(n.attrs.int_or("axis", 0)?, xs.len(), "axis")?;
    if let Some(t) = im.constant(idx) {
        if !t.dtype().is_int() {
            return Err(NodeError::invalid(format!("indices must be integers, got {}", t.ty)));
        }
        let d = xs[axis] as i64;
        let mut vals = t.to_i64_vec();
        for v in &mut vals {
            if *v < -d || *v >= d {
                return Err(NodeError::invalid(format!("index {v} is out of range for dimension {d}")));
            }
            if *v < 0 {
                *v += d;
            }
        }
        let fixed = Tensor::from_i64(t.shape().to_vec(), &vals);
        idx = im.konst(n, fixed);
    }
    let op = if n.op_type == "Gather" { Op::Gather { axis } } else { Op::GatherElements { axis } };
    one(im.emit(n, op, &[x, idx])?)
}

fn usize_list(v: &[i64], what: &str) -> NResult<Vec<usize>> {
    v.iter().map(|&x| usize::try_from(x).map_err(|_| NodeError::invalid(format!("negative value in the {what} {v:?}")))).collect()
}

fn expand(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let shape = usize_list(&ints_of(&im.const_input(n, 1, "target shape")?, "target shape")?, "target shape")?;
    one(im.emit(n, Op::Expand { shape }, &[x])?)
}

fn pad(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let r = im.rank(x);
    let mode = match n.attrs.string("mode")?.as_deref() {
        None | Some("constant") => PadMode::Constant,
        Some("reflect") => PadMode::Reflect,
        Some("edge") => PadMode::Edge,
        Some(m) => return Err(NodeError::unsupported_attr("mode", format!("Pad mode {m}"), format!("mode '{m}'"))),
    };
    let (pads, value) = if im.opset < 11 {
        let pads = n.attrs.ints("pads")?.ok_or_else(|| NodeError::attr("pads", "required attribute is absent"))?;
        (pads, n.attrs.float_or("value", 0.0)?)
    } else {
        let pads = ints_of(&im.const_input(n, 1, "pads")?, "pads")?;
        let value = match im.opt_const_input(n, 2, "constant value")? {
            Some(t) if t.numel() == 1 => t.to_f64_vec()[0] as f32,
            Some(t) => return Err(NodeError::invalid(format!("the constant value must be a scalar, got {}", t.ty))),
            None => 0.0,
        };
        let pads = match im.opt_const_input(n, 3, "axes")? {
            None => pads,
            Some(t) => {
                let axes = norm_axes(&ints_of(&t, "axes")?, r, "axes")?;
                if pads.len() != 2 * axes.len() {
                    return Err(NodeError::invalid(format!("{} pads for {} axes", pads.len(), axes.len())));
                }
                let mut full = vec![0; 2 * r];
                for (i, &a) in axes.iter().enumerate() {
                    full[a] = pads[i];
                    full[r + a] = pads[axes.len() + i];
                }
                full
            }
        };
        (pads, value)
    };
    if pads.len() != 2 * r {
        return Err(NodeError::attr("pads", format!("needs {} values for rank {r}, got {pads:?}", 2 * r)));
    }
    let xs = im.shape(x);
    for (i, &p) in pads.iter().enumerate() {
        if p.unsigned_abs() > crate::onnx::attrs::MAX_WINDOW_ATTR as u64 || (p < 0 && p.unsigned_abs() > xs[i % r] as u64) {
            return Err(NodeError::attr("pads", format!("pad {p} is out of range for the input {xs:?}")));
        }
    }
    if pads.iter().all(|&p| p == 0) {
        return one(im.emit(n, Op::Identity, &[x])?);
    }
    one(im.emit(n, Op::Pad { pads, mode, value }, &[x])?)
}

/// Shape of any value is a constant: every shape in the IR is static.
fn shape_of(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let xs = im.shape(x);
    let r = xs.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clamp(n.attrs.int_or("start", 0)?);
    let end = clamp(n.attrs.int("end")?.unwrap_or(r));
    let dims: Vec<i64> = xs[start..end.max(start)].iter().map(|&d| d as i64).collect();
    one(im.konst(n, Tensor::from_i64([dims.len()], &dims)))
}

fn size(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let numel = im.ty(x).numel() as i64;
    one(im.konst(n, Tensor::from_i64(Vec::<usize>::new(), &[numel])))
}

/// A tensor of `shape` filled with the one element of `value`.
fn filled(value: &Tensor, shape: Vec<usize>) -> Tensor {
    let ty = TensorType::new(value.dtype(), shape);
    let bytes = value.bytes().repeat(ty.numel());
    Tensor::from_bytes(ty, bytes).expect("repeated element matches the type")
}

fn constant_of_shape(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let shape = usize_list(&ints_of(&im.const_input(n, 0, "shape")?, "shape")?, "shape")?;
    let value = match n.attrs.tensor("value")? {
        Some(t) => {
            let t = tensor_from_proto(t, im.base_dir).map_err(|kind| NodeError { attribute: Some("value".into()), kind })?;
            if t.numel() != 1 {
                return Err(NodeError::attr("value", format!("must hold one element, got {}", t.ty)));
            }
            t
        }
        None => Tensor::scalar_f32(0.0),
    };
    im.check_folded("the output", &shape, value.dtype())?;
    one(im.konst(n, filled(&value, shape)))
}

fn constant(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let a = &n.attrs;
    let t = if let Some(t) = a.tensor("value")? {
        tensor_from_proto(t, im.base_dir).map_err(|kind| NodeError { attribute: Some("value".into()), kind })?
    } else if let Some(v) = a.float("value_float")? {
        Tensor::scalar_f32(v)
    } else if let Some(v) = a.floats("value_floats")? {
        Tensor::from_f32([v.len()], &v)
    } else if let Some(v) = a.int("value_int")? {
        Tensor::from_i64(Vec::<usize>::new(), &[v])
    } else if let Some(v) = a.ints("value_ints")? {
        Tensor::from_i64([v.len()], &v)
    } else if a.has("value_string") || a.has("value_strings") {
        return Err(NodeError::unsupported("dtype STRING", "string constants"));
    } else if a.has("sparse_value") {
        return Err(NodeError::unsupported_attr("sparse_value", "sparse constant", "sparse constants"));
    } else {
        return Err(NodeError::attr("value", "Constant has none of value, value_float(s), value_int(s)"));
    };
    one(im.konst(n, t))
}

fn identity(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    one(im.emit(n, Op::Identity, &[x])?)
}

/// Range of constant scalars: `start + i*delta` for `i < max(ceil((limit-start)/delta), 0)`.
fn range(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let scalar = |i: usize, what: &str| -> NResult<Tensor> {
        let t = im.const_input(n, i, what)?;
        if t.numel() != 1 {
            return Err(NodeError::invalid(format!("the {what} must be a scalar, got {}", t.ty)));
        }
        Ok(t)
    };
    let (start, limit, delta) = (scalar(0, "start")?, scalar(1, "limit")?, scalar(2, "delta")?);
    let dt = start.dtype();
    let t = if dt.is_int() {
        let (s, l, d) = (start.to_i64_vec()[0], limit.to_i64_vec()[0], delta.to_i64_vec()[0]);
        if d == 0 {
            return Err(NodeError::invalid("delta is 0"));
        }
        let count = range_count(im, (l as f64 - s as f64) / d as f64, dt)?;
        let vals: Vec<f64> = (0..count).map(|i| s.wrapping_add((i as i64).wrapping_mul(d)) as f64).collect();
        if dt == DType::I64 {
            Tensor::from_i64([count], &(0..count).map(|i| s.wrapping_add((i as i64).wrapping_mul(d))).collect::<Vec<_>>())
        } else {
            Tensor::from_f64_as(dt, [count], &vals)
        }
    } else if dt.is_float() {
        let (s, l, d) = (start.to_f64_vec()[0], limit.to_f64_vec()[0], delta.to_f64_vec()[0]);
        if d == 0.0 || !d.is_finite() || !s.is_finite() || !l.is_finite() {
            return Err(NodeError::invalid(format!("invalid range start {s}, limit {l}, delta {d}")));
        }
        let count = range_count(im, (l - s) / d, dt)?;
        Tensor::from_f64_as(dt, [count], &(0..count).map(|i| s + i as f64 * d).collect::<Vec<_>>())
    } else {
        return Err(NodeError::invalid(format!("Range of {dt}")));
    };
    one(im.konst(n, t))
}

/// The element count of a Range, `max(ceil(span), 0)`, bounded like any constant computed at import.
fn range_count(im: &Importer, span: f64, dt: DType) -> NResult<usize> {
    let count = span.ceil().max(0.0);
    if count > (im.fold_limit / dt.size()) as f64 {
        im.check_folded("Range's output", &[count as usize], dt)?;
    }
    Ok(count as usize)
}

fn tile(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let repeats = usize_list(&ints_of(&im.const_input(n, 1, "repeats")?, "repeats")?, "repeats")?;
    if repeats.iter().all(|&r| r == 1) && repeats.len() == im.rank(x) {
        return one(im.emit(n, Op::Identity, &[x])?);
    }
    one(im.emit(n, Op::Tile { repeats }, &[x])?)
}

/// The reductions. Axes come from the attribute before the op's version that made them an input (13 for
/// ReduceSum, 18 for the others), from input 1 after; empty axes reduce everything unless
/// `noop_with_empty_axes`. ReduceSumSquare, ReduceL1, ReduceL2 and ReduceLogSumExp are composed from Mul, Abs,
/// Sqrt, Exp, Log and ReduceSum as ONNX defines them.
fn reduce(im: &mut Importer, n: &NodeCx) -> NResult<Vec<ValueId>> {
    let x = im.input(n, 0)?;
    let r = im.rank(x);
    let from = if n.op_type == "ReduceSum" { 13 } else { 18 };
    let given = if im.opset >= from {
        im.opt_const_input(n, 1, "axes")?.map(|t| ints_of(&t, "axes")).transpose()?
    } else {
        n.attrs.ints("axes")?
    };
    let keepdims = n.attrs.int_or("keepdims", 1)? != 0;
    let noop = n.attrs.int_or("noop_with_empty_axes", 0)? != 0;
    let mut axes = match given {
        Some(a) if !a.is_empty() => norm_axes(&a, r, "axes")?,
        _ if noop => Vec::new(),
        _ => (0..r).collect(),
    };
    axes.sort_unstable();
    let (kind, pre): (ReduceKind, Option<Op>) = match n.op_type {
        "ReduceMean" => (ReduceKind::Mean, None),
        "ReduceSum" => (ReduceKind::Sum, None),
        "ReduceMax" => (ReduceKind::Max, None),
        "ReduceMin" => (ReduceKind::Min, None),
        "ReduceSumSquare" | "ReduceL2" => (ReduceKind::Sum, Some(Op::Binary(BinaryOp::Mul))),
        "ReduceL1" => (ReduceKind::Sum, Some(Op::Unary(UnaryOp::Abs))),
        "ReduceLogSumExp" => (ReduceKind::Sum, Some(Op::Unary(UnaryOp::Exp))),
        other => unreachable!("reduce called for {other}"),
    };
    let v = match pre {
        Some(op @ Op::Binary(_)) => im.emit(n, op, &[x, x])?,
        Some(op) => im.emit(n, op, &[x])?,
        None => x,
    };
    // ReduceMax/ReduceMin of bool (opset 20) are any/all: exact through i32, which the IR reduces.
    let as_bool = im.dtype(v) == DType::Bool && matches!(kind, ReduceKind::Max | ReduceKind::Min);
    let v = if as_bool { im.cast(n, v, DType::I32)? } else { v };
    let mut y = if axes.is_empty() { im.emit(n, Op::Identity, &[v])? } else { im.emit(n, Op::Reduce { kind, axes, keepdims }, &[v])? };
    if as_bool {
        y = im.cast(n, y, DType::Bool)?;
    }
    match n.op_type {
        "ReduceL2" => y = im.emit(n, Op::Unary(UnaryOp::Sqrt), &[y])?,
        "ReduceLogSumExp" => y = im.emit(n, Op::Unary(UnaryOp::Log), &[y])?,
        _ => {}
    }
    one(y)
}

#[cfg(test)]
#[path = "shape_tests.rs"]
mod tests;
