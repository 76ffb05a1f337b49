//! Reductions and normalizations as dedicated loops: Reduce{Sum,Mean,Max,Min}, GlobalAveragePool, Softmax,
//! LogSoftmax, LayerNorm, BatchNorm. Sums, means, variances and softmax denominators accumulate in double
//! and are rounded once, as in the reference.

use crate::backend::lowering::cexpr::{f32_lit, mem_type};
use crate::backend::Refusal;
use super::func::{Func, PARALLEL_GRAIN, ROW_STACK_BYTES};
use crate::backend::lowering::nest::{broadcast, contiguous, Nest};
use crate::ir::{DType, NodeId, ReduceKind};

/// Reduce over `axes` (keepdims does not change the layout). The input and output are walked by one
/// jointly coalesced nest in which the output has stride 0 on reduced dims: loops outside the first reduced
/// dim pick an output region; inside it, each element accumulates into a scalar (reduced dims innermost) or
/// into a region-sized accumulator array (kept dims nested inside reduced ones).
pub fn reduce(f: &mut Func, node: NodeId, kind: ReduceKind, axes: &[usize]) -> Result<(), Refusal> {
    let g = f.g;
    let nd = g.node(node);
    let xs = g.ty(nd.inputs[0]).shape.clone();
    let d = g.ty(nd.inputs[0]).dtype;
    let kept: Vec<usize> = (0..xs.len()).filter(|a| !axes.contains(a)).map(|a| xs[a]).collect();
    let kst = contiguous(&kept);
    let mut ost = Vec::new();
    let mut ki = 0;
    for a in 0..xs.len() {
        if axes.contains(&a) {
            ost.push(0);
        } else {
            ost.push(kst[ki]);
            ki += 1;
        }
    }
    let count: usize = axes.iter().map(|&a| xs[a]).product();
    let x = f.buf(nd.inputs[0], false);
    let y = f.buf(nd.outputs[0], true);
    let nest = Nest::new(&xs, &[contiguous(&xs), ost]);
    let Some(f0) = nest.strides[1].iter().position(|&s| s == 0) else {
        // Every reduced axis has size 1: each output is its single input element.
        f.body.push_str(&nest.emit("i", |o| format!("{y}[{}] = {x}[{}];\n", o[1], o[0])));
        return Ok(());
    };
    let n = nest.rank();
    let region: usize = (f0..n).filter(|&k| nest.strides[1][k] != 0).map(|k| nest.dims[k]).product();
    let float = d == DType::F32;
    let acc_ty = match (float, kind) {
        (true, ReduceKind::Sum | ReduceKind::Mean) => "double",
        (true, _) => "float",
        _ => "int64_t",
    };
    let init = match (float, kind) {
        (true, ReduceKind::Sum | ReduceKind::Mean) => "0.0".to_string(),
        (true, ReduceKind::Max) => "(-__builtin_inff())".to_string(),
        (true, ReduceKind::Min) => "__builtin_inff()".to_string(),
        (false, ReduceKind::Sum | ReduceKind::Mean) => "0".to_string(),
        (false, ReduceKind::Max) => "INT64_MIN".to_string(),
        (false, ReduceKind::Min) => "INT64_MAX".to_string(),
    };
    let step = |acc: &str, v: &str| -> String {
        match (float, kind) {
            (true, ReduceKind::Sum | ReduceKind::Mean) => format!("{acc} += (double){v};\n"),
            (true, ReduceKind::Max) => format!("{acc} = tsr_maxf({acc}, {v});\n"),
            (true, ReduceKind::Min) => format!("{acc} = tsr_minf({acc}, {v});\n"),
            (false, ReduceKind::Sum | ReduceKind::Mean) => format!("{acc} = TSR_WADD({acc}, {v});\n"),
            (false, ReduceKind::Max) => format!("{acc} = tsr_imax({acc}, {v});\n"),
            (false, ReduceKind::Min) => format!("{acc} = tsr_imin({acc}, {v});\n"),
        }
    };
    let fin = |acc: &str| -> String {
        match (float, kind) {
            (true, ReduceKind::Sum) => format!("(float){acc}"),
            (true, ReduceKind::Mean) => format!("(float)({acc} / {count}.0)"),
            (true, _) => acc.to_string(),
            (false, ReduceKind::Mean) if count == 0 => "0".to_string(),
            (false, ReduceKind::Mean) => format!("({})({acc} / {count})", mem_type(d)),
            (false, _) => format!("({}){acc}", mem_type(d)),
        }
    };
    let scalar_max = float && matches!(kind, ReduceKind::Max | ReduceKind::Min) && region == 1;
    // Kept dims nested inside reduced ones accumulate into a scratch array (never a stack array: it can be large).
    let acc_arr = if region > 1 { f.temp(region, acc_ty, 8) } else { String::new() };
    let base = vec!["0".to_string(), "0".to_string()];
    let code = nest.emit_range(0, f0, "i", &base, |outer| {
        let mut s = String::new();
        if region == 1 {
            s.push_str(&format!("{acc_ty} acc = {init};\n"));
            if scalar_max {
                // Vectorizable form: plain max/min plus a NaN flag (NaN wins, as in the reference).
                s.push_str("int nan = 0;\n");
            }
            let inner_base = vec![outer[0].clone(), "0".to_string()];
            s.push_str(&nest.emit_range(f0, n, "i", &inner_base, |inner| {
                if scalar_max {
                    let cmp = if kind == ReduceKind::Max { ">" } else { "<" };
                    format!("const float v = {x}[{}];\nnan |= v != v;\nacc = v {cmp} acc ? v : acc;\n", inner[0])
                } else {
                    step("acc", &format!("{x}[{}]", inner[0]))
                }
            }));
            let val = if scalar_max { "(nan ? __builtin_nanf(\"\") : acc)".to_string() } else { fin("acc") };
            s.push_str(&format!("{y}[{}] = {val};\n", outer[1]));
        } else {
            s.push_str(&format!("{acc_ty}* restrict acc = {acc_arr};\nfor (long q = 0; q < {region}; q++) acc[q] = {init};\n"));
            let inner_base = vec![outer[0].clone(), "0".to_string()];
            s.push_str(&nest.emit_range(f0, n, "i", &inner_base, |inner| step(&format!("acc[{}]", inner[1]), &format!("{x}[{}]", inner[0]))));
            s.push_str(&format!("for (long q = 0; q < {region}; q++) {y}[{} + q] = {};\n", outer[1], fin("acc[q]")));
        }
        s
    });
    f.body.push_str(&code);
    Ok(())
}

/// Softmax / LogSoftmax over `axis`, seen as [outer, D, inner], in float with the prelude's vectorizing
/// exp. Inner == 1: per row, the NaN-propagating max and the sum of the exponentials by the prelude's
/// lane-parallel row helpers, the exponentials kept in a row buffer between the passes. Otherwise the D loop
/// runs outside the inner loop with per-column max and sum arrays, so memory is walked contiguously and the
/// inner loops vectorize.
pub fn softmax(f: &mut Func, node: NodeId, axis: usize, log: bool) -> Result<(), Refusal> {
    let g = f.g;
    let nd = g.node(node);
    let s = g.ty(nd.inputs[0]).shape.clone();
    let outer: usize = s[..axis].iter().product();
    let d = s[axis];
    let inner: usize = s[axis + 1..].iter().product();
    let x = f.buf(nd.inputs[0], false);
    let y = f.buf(nd.outputs[0], true);
    let mut c = String::new();
    if inner == 1 && d * 4 <= ROW_STACK_BYTES {
        // Rows in parallel, each with its exponentials on its own stack.
        let row = format!("float e[{d}];\n{}", softmax_row(&x, &y, d, "e", log));
        c.push_str(&f.parallel_for(outer, PARALLEL_GRAIN.div_ceil(d.max(1)), "o", &row));
    } else if inner == 1 {
        // Rows too long for the stack, in order, sharing one scratch row.
        let e = f.temp(d, "float", 4);
        c.push_str(&format!("for (long o = 0; o < {outer}; o++) {{\n{}}}\n", softmax_row(&x, &y, d, &e, log)));
    } else {
        let m = f.temp(inner, "float", 4);
        let sm = f.temp(inner, "float", 4);
        c.push_str(&format!("for (long o = 0; o < {outer}; o++) {{\nconst float* xo = {x} + o * {};\nfloat* yo = {y} + o * {};\n", d * inner, d * inner));
        c.push_str(&format!("for (long i = 0; i < {inner}; i++) {{ {m}[i] = -__builtin_inff(); {sm}[i] = 0.0f; }}\n"));
        c.push_str(&format!("for (long k = 0; k < {d}; k++) {{\nfor (long i = 0; i < {inner}; i++) {{\nconst float v = xo[k * {inner} + i];\n{m}[i] = (v != v || {m}[i] != {m}[i]) ? __builtin_nanf(\"\") : (v > {m}[i] ? v : {m}[i]);\n}}\n}}\n"));
        c.push_str(&format!("for (long k = 0; k < {d}; k++) {{\nfor (long i = 0; i < {inner}; i++) {sm}[i] += tsr_expf(xo[k * {inner} + i] - {m}[i]);\n}}\n"));
        if log {
            c.push_str(&format!("for (long i = 0; i < {inner}; i++) {sm}[i] = tsr_logf({sm}[i]);\n"));
        }
        let val = if log { format!("(xo[k * {inner} + i] - {m}[i]) - {sm}[i]") } else { format!("tsr_expf(xo[k * {inner} + i] - {m}[i]) / {sm}[i]") };
        c.push_str(&format!("for (long k = 0; k < {d}; k++) {{\nfor (long i = 0; i < {inner}; i++) yo[k * {inner} + i] = {val};\n}}\n}}\n"));
    }
    f.body.push_str(&c);
    Ok(())
}

/// The statements of softmax row `o` (`x` and `y` its input and output buffers, `d` its length): max, the
/// exponentials into the row buffer `e`, their sum, and the output.
fn softmax_row(x: &str, y: &str, d: usize, e: &str, log: bool) -> String {
    let mut row = format!("const float* xr = {x} + o * {d};\nfloat* yr = {y} + o * {d};\n");
    row.push_str(&format!("const float m = tsr_row_max(xr, {d});\n"));
    row.push_str(&format!("for (long k = 0; k < {d}; k++) {e}[k] = tsr_expf(xr[k] - m);\n"));
    row.push_str(&format!("const float s = tsr_row_sum({e}, {d});\n"));
    if log {
        row.push_str(&format!("const float ls = tsr_logf(s);\nfor (long k = 0; k < {d}; k++) yr[k] = (xr[k] - m) - ls;\n"));
    } else {
        row.push_str(&format!("for (long k = 0; k < {d}; k++) yr[k] = {e}[k] / s;\n"));
    }
    row
}

/// LayerNorm over `axis..rank`: per row, mean and variance (two passes, double), then
/// `((x - mean) * inv * scale + bias)` in double with scale and bias broadcast to the normalized shape.
pub fn layer_norm(f: &mut Func, node: NodeId, axis: usize, eps: f32) -> Result<(), Refusal> {
    let g = f.g;
    let nd = g.node(node);
    let xs = g.ty(nd.inputs[0]).shape.clone();
    let norm = xs[axis..].to_vec();
    let inner: usize = norm.iter().product();
    let outer: usize = xs[..axis].iter().product();
    let x = f.buf(nd.inputs[0], false);
    let sc = f.buf(nd.inputs[1], false);
    let bias = if nd.inputs.len() > 2 { Some(f.buf(nd.inputs[2], false)) } else { None };
    let y = f.buf(nd.outputs[0], true);
    let mut strides = vec![contiguous(&norm), broadcast(&g.ty(nd.inputs[1]).shape, &norm)];
    if bias.is_some() {
        strides.push(broadcast(&g.ty(nd.inputs[2]).shape, &norm));
    }
    let nest = Nest::new(&norm, &strides);
    let mut c = format!("const float* xr = {x} + o * {inner};\nfloat* yr = {y} + o * {inner};\n");
    c.push_str(&format!("double mean = 0.0;\nfor (long k = 0; k < {inner}; k++) mean += (double)xr[k];\nmean /= {inner}.0;\n"));
    c.push_str(&format!("double var = 0.0;\nfor (long k = 0; k < {inner}; k++) {{\nconst double t = (double)xr[k] - mean;\nvar += t * t;\n}}\nvar /= {inner}.0;\n"));
    c.push_str(&format!("const double inv = 1.0 / sqrt(var + (double){});\n", f32_lit(eps)));
    c.push_str(&nest.emit("k", |o| {
        let b = match &bias {
            Some(b) => format!(" + (double){b}[{}]", o[2]),
            None => String::new(),
        };
        format!("yr[{0}] = (float)(((double)xr[{0}] - mean) * inv * (double){sc}[{1}]{b});\n", o[0], o[1])
    }));
    let rows = f.parallel_for(outer, PARALLEL_GRAIN.div_ceil(inner.max(1)), "o", &c);
    f.body.push_str(&rows);
    Ok(())
}

/// Inference BatchNorm: per channel `a = scale / sqrt(var + eps)`, `b = bias - mean * a` (double), then one
/// multiply-add per element in double.
pub fn batch_norm(f: &mut Func, node: NodeId, eps: f32) -> Result<(), Refusal> {
    let g = f.g;
    let nd = g.node(node);
    let xs = g.ty(nd.inputs[0]).shape.clone();
    let (n, c) = (xs[0], xs[1]);
    let sp: usize = xs[2..].iter().product();
    let x = f.buf(nd.inputs[0], false);
    let [sc, bi, mean, var] = [1, 2, 3, 4].map(|i| f.buf(nd.inputs[i], false));
    let y = f.buf(nd.outputs[0], true);
    f.body.push_str(&format!(
        "for (long bb = 0; bb < {n}; bb++) {{\nfor (long k = 0; k < {c}; k++) {{\nconst double a = (double){sc}[k] / sqrt((double){var}[k] + (double){eps});\nconst double off = (double){bi}[k] - (double){mean}[k] * a;\nconst float* xp = {x} + (bb * {c} + k) * {sp};\nfloat* yp = {y} + (bb * {c} + k) * {sp};\nfor (long i = 0; i < {sp}; i++) yp[i] = (float)((double)xp[i] * a + off);\n}}\n}}\n",
        eps = f32_lit(eps),
    ));
    Ok(())
}
