//! Reductions and normalizations: one block per output row, threads striding the row, warp-shuffle and
//! shared-memory combining (`tsr_block_*` in the prelude). Reduce{Sum,Mean,Max,Min}, GlobalAveragePool,
//! Softmax, LogSoftmax and LayerNorm; BatchNorm (inference) is one thread per element.

use crate::backend::{refuse, Refusal};
use super::kernel::{coords, is_float, ld, offset, st, Kernel};
use crate::backend::lowering::cexpr::f32_lit;
use crate::backend::lowering::nest::{broadcast, contiguous, Nest};
use crate::ir::{DType, NodeId, ReduceKind};

/// Threads of a block reducing rows of `len` elements: whole warps, at most 256.
fn row_threads(len: usize) -> u32 {
    (len.div_ceil(32) * 32).clamp(32, 256) as u32
}

/// The float dtype every operand of `node` has (fp32, or fp16 storage computed in fp32).
fn float_only(k: &Kernel, node: NodeId) -> Result<DType, Refusal> {
    let nd = k.g.node(node);
    let d = k.g.ty(nd.outputs[0]).dtype;
    match nd.inputs.iter().chain(&nd.outputs).find(|&&v| k.g.ty(v).dtype != d || !is_float(d)) {
        Some(&v) => Err(refuse!("{} on {} is not supported by the cuda backend", nd.op.name(), k.g.ty(v).dtype)),
        None => Ok(d),
    }
}

/// Reduce over `axes`: block `b` computes output element `b`.
pub fn reduce(k: &mut Kernel, node: NodeId, kind: ReduceKind, axes: &[usize]) -> Result<(), Refusal> {
    let d = float_only(k, node)?;
    let nd = k.g.node(node);
    let xs = k.g.ty(nd.inputs[0]).shape.clone();
    let own = contiguous(&xs);
    let kept: Vec<usize> = (0..xs.len()).filter(|d| !axes.contains(d)).collect();
    let kept_dims: Vec<usize> = kept.iter().map(|&d| xs[d]).collect();
    let red_dims: Vec<usize> = axes.iter().map(|&d| xs[d]).collect();
    let outs: usize = kept_dims.iter().product();
    let len: usize = red_dims.iter().product();
    let (x, y) = (k.buf(nd.inputs[0], false), k.buf(nd.outputs[0], true));
    let kept_nest = Nest::new(&kept_dims, &[kept.iter().map(|&d| own[d]).collect()]);
    let red_nest = Nest::new(&red_dims, &[axes.iter().map(|&d| own[d]).collect()]);
    let (init, step, combine) = match kind {
        ReduceKind::Sum | ReduceKind::Mean => ("0.0f", "acc += v;", "tsr_block_sum"),
        ReduceKind::Max => ("-__int_as_float(0x7f800000)", "acc = tsr_maxf(acc, v);", "tsr_block_max"),
        ReduceKind::Min => ("__int_as_float(0x7f800000)", "acc = tsr_minf(acc, v);", "tsr_block_min"),
    };
    let mut b = String::from("__shared__ float sh[32];\nconst unsigned o = blockIdx.x;\n");
    b.push_str(&coords(&kept_nest.dims, "o", "k", &vec![true; kept_nest.dims.len()]));
    b.push_str(&format!("const unsigned base = {};\nfloat acc = {init};\n", offset("k", &kept_nest.strides[0])));
    b.push_str(&format!("for (unsigned r = threadIdx.x; r < {len}u; r += blockDim.x) {{\n"));
    b.push_str(&coords(&red_nest.dims, "r", "q", &vec![true; red_nest.dims.len()]));
    b.push_str(&format!("const float v = {};\n{step}\n}}\nacc = {combine}(acc, sh);\n", ld(d, &x, &format!("base + {}", offset("q", &red_nest.strides[0])))));
    let result = if kind == ReduceKind::Mean { format!("acc / {}", f32_lit(len as f32)) } else { "acc".to_string() };
    b.push_str(&format!("if (threadIdx.x == 0) {y}[o] = {};\n", st(d, &result)));
    k.body.push_str(&b);
    k.grid = [outs.max(1) as u32, 1, 1];
    k.block = [row_threads(len), 1, 1];
    Ok(())
}

/// Softmax (or LogSoftmax) along `axis`: a block per row of `len` elements `inner` apart.
pub fn softmax(k: &mut Kernel, node: NodeId, axis: usize, log: bool) -> Result<(), Refusal> {
    let d = float_only(k, node)?;
    let nd = k.g.node(node);
    let xs = k.g.ty(nd.inputs[0]).shape.clone();
    let len = xs[axis];
    let inner: usize = xs[axis + 1..].iter().product();
    let rows: usize = xs.iter().product::<usize>() / len.max(1);
    let (x, y) = (k.buf(nd.inputs[0], false), k.buf(nd.outputs[0], true));
    let mut b = format!(
        "__shared__ float sh[32];\nconst unsigned r = blockIdx.x;\nconst unsigned base = (r / {inner}u) * {} + r % {inner}u;\n",
        len * inner
    );
    let xj = ld(d, &x, &format!("base + j * {inner}u"));
    b.push_str(&format!("float m = -__int_as_float(0x7f800000);\nfor (unsigned j = threadIdx.x; j < {len}u; j += blockDim.x) m = tsr_maxf(m, {xj});\n\
        m = tsr_block_max(m, sh);\n"));
    b.push_str(&format!("float s = 0.0f;\nfor (unsigned j = threadIdx.x; j < {len}u; j += blockDim.x) s += expf({xj} - m);\ns = tsr_block_sum(s, sh);\n"));
    let out = st(d, if log { "(v - m) - logf(s)" } else { "expf(v - m) / s" });
    b.push_str(&format!("for (unsigned j = threadIdx.x; j < {len}u; j += blockDim.x) {{\nconst float v = {xj};\n{y}[base + j * {inner}u] = {out};\n}}\n"));
    k.body.push_str(&b);
    k.grid = [rows.max(1) as u32, 1, 1];
    k.block = [row_threads(len), 1, 1];
    Ok(())
}

/// LayerNorm over dims `axis..`: a block per row; mean, then the variance around it, then the output.
pub fn layer_norm(k: &mut Kernel, node: NodeId, axis: usize, eps: f32) -> Result<(), Refusal> {
    let d = float_only(k, node)?;
    let nd = k.g.node(node);
    let xs = k.g.ty(nd.inputs[0]).shape.clone();
    let norm = xs[axis..].to_vec();
    let len: usize = norm.iter().product();
    let rows: usize = xs[..axis].iter().product();
    let x = k.buf(nd.inputs[0], false);
    let sc = k.buf(nd.inputs[1], false);
    let bias = if nd.inputs.len() > 2 { Some(k.buf(nd.inputs[2], false)) } else { None };
    let y = k.buf(nd.outputs[0], true);
    let mut strides = vec![contiguous(&norm), broadcast(&k.g.ty(nd.inputs[1]).shape, &norm)];
    if nd.inputs.len() > 2 {
        strides.push(broadcast(&k.g.ty(nd.inputs[2]).shape, &norm));
    }
    let nest = Nest::new(&norm, &strides);
    let mut b = format!("__shared__ float sh[32];\nconst unsigned base = blockIdx.x * {len}u;\n");
    let xj = ld(d, &x, "base + j");
    b.push_str(&format!("float s = 0.0f;\nfor (unsigned j = threadIdx.x; j < {len}u; j += blockDim.x) s += {xj};\n\
        const float mean = tsr_block_sum(s, sh) / {};\n", f32_lit(len as f32)));
    b.push_str(&format!("float q = 0.0f;\nfor (unsigned j = threadIdx.x; j < {len}u; j += blockDim.x) {{\nconst float t = {xj} - mean;\nq += t * t;\n\
        }}\nconst float inv = rsqrtf(tsr_block_sum(q, sh) / {} + {});\n", f32_lit(len as f32), f32_lit(eps)));
    b.push_str(&format!("for (unsigned j = threadIdx.x; j < {len}u; j += blockDim.x) {{\n"));
    b.push_str(&coords(&nest.dims, "j", "c", &vec![true; nest.dims.len()]));
    let add = match &bias {
        Some(bi) => format!(" + {}", ld(d, bi, &offset("c", &nest.strides[2]))),
        None => String::new(),
    };
    let v = format!("({xj} - mean) * inv * {}{add}", ld(d, &sc, &offset("c", &nest.strides[1])));
    b.push_str(&format!("{y}[base + j] = {};\n}}\n", st(d, &v)));
    k.body.push_str(&b);
    k.grid = [rows.max(1) as u32, 1, 1];
    k.block = [row_threads(len), 1, 1];
    Ok(())
}

/// Inference BatchNorm, one thread per element: `y = x * a + (bias - mean * a)`, `a = scale / sqrt(var + eps)`.
pub fn batch_norm(k: &mut Kernel, node: NodeId, eps: f32) -> Result<(), Refusal> {
    let d = float_only(k, node)?;
    let nd = k.g.node(node);
    let xs = k.g.ty(nd.inputs[0]).shape.clone();
    let c = xs[1];
    let sp: usize = xs[2..].iter().product();
    let x = k.buf(nd.inputs[0], false);
    let [sc, bi, mean, var] = [1, 2, 3, 4].map(|i| k.buf(nd.inputs[i], false));
    let y = k.buf(nd.outputs[0], true);
    let [sc, bi, mean, var, x] = [&sc, &bi, &mean, &var, &x].map(|p| ld(d, p, if p == &x { "i" } else { "ch" }));
    k.body.push_str(&format!(
        "const unsigned ch = (i / {}u) % {c}u;\nconst float a = {sc} / sqrtf({var} + {});\n{y}[i] = {};\n",
        sp.max(1),
        f32_lit(eps),
        st(d, &format!("{x} * a + ({bi} - {mean} * a)"))
    ));
    k.per_element(xs.iter().product());
    Ok(())
}
