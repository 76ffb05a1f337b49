//! Attention as loops the C compiler vectorizes, per batch matrix and per query row. K is first laid out as
//! `[D, Sk]` in scratch (unless it already is), so a row's scores accumulate one key dimension at a time over
//! all keys at once (`s[j] += q[t] * Kt[t][j]`: contiguous in `j`, and each score still sums its products in
//! the reference's order), where a dot product per key is a chain of dependent adds. Then the scale, the keep
//! mask and the additive mask as the reference applies them, the softmax as the Softmax item computes it
//! (NaN-propagating max, the prelude's float exp, so a row of -inf scores is 0/0 = NaN and `Sk = 0` is an
//! empty sum, 0), and the probability-weighted sum of V's rows into a row accumulator (contiguous in V's
//! columns). Scores never leave the item's scratch.

use super::cexpr::f32_lit;
use super::func::Func;
use super::nest::{broadcast, row_offset};
use crate::ir::{attention_dims, AttentionAttrs, DType, NodeId};

/// Strides over the batch dims with which an operand of `shape` (`[lead.., rows, cols]`) is read, in elements.
fn matrix_strides(shape: &[usize], batch: &[usize]) -> Vec<i64> {
    let r = shape.len();
    let size = (shape[r - 2] * shape[r - 1]) as i64;
    broadcast(&shape[..r - 2], batch).iter().map(|s| s * size).collect()
}

pub fn attention(f: &mut Func, node: NodeId, a: &AttentionAttrs) -> Result<(), String> {
    let g = f.g;
    let nd = g.node(node);
    if let Some(&v) = nd.inputs.iter().chain(&nd.outputs).find(|&&v| !matches!(g.ty(v).dtype, DType::F32 | DType::Bool)) {
        return Err(format!("Attention on {} is not supported by the c backend", g.ty(v).dtype));
    }
    let types: Vec<_> = nd.inputs.iter().map(|&v| g.ty(v)).collect();
    let dims = attention_dims(a, &types).map_err(|e| e.0)?;
    let (sq, sk, d, dv) = (dims.sq, dims.sk, dims.d, dims.dv);
    let batch: usize = dims.batch.iter().product();
    let scores_shape = dims.scores_shape();
    let nb = dims.batch.len();
    let ops: Vec<String> = (0..3).map(|i| f.buf(nd.inputs[i], false)).collect();
    // A mask operand: its pointer name, buffer, C element type, and strides over the batch, rows and keys
    // (its broadcast to the scores' shape).
    struct Mask {
        name: &'static str,
        buf: String,
        ty: &'static str,
        batch: Vec<i64>,
        row: i64,
        key: i64,
    }
    let mut mask = |i: Option<usize>, name: &'static str, ty: &'static str| {
        i.map(|i| {
            let st = broadcast(&g.ty(nd.inputs[i]).shape, &scores_shape);
            Mask { name, buf: f.buf(nd.inputs[i], false), ty, batch: st[..nb].to_vec(), row: st[nb], key: st[nb + 1] }
        })
    };
    let add = mask(a.mask_index(), "mb", "float");
    let keep = mask(a.keep_index(), "kp", "uint8_t");
    let y = f.buf(nd.outputs[0], true);
    let s = f.temp(sk, "float", 4);
    let e = f.temp(sk, "float", 4);
    let acc = f.temp(dv, "float", 4);
    let kt = (!a.k_transposed).then(|| f.temp(d * sk, "float", 4));

    let mut c = format!("for (long bi = 0; bi < {batch}; bi++) {{\n");
    for (i, name) in ["qb", "kb", "vb"].into_iter().enumerate() {
        let st = matrix_strides(&g.ty(nd.inputs[i]).shape, &dims.batch);
        c.push_str(&format!("const float* {name} = {} + {};\n", ops[i], row_offset(&dims.batch, &st, "bi")));
    }
    for m in add.iter().chain(&keep) {
        c.push_str(&format!("const {}* {} = {} + {};\n", m.ty, m.name, m.buf, row_offset(&dims.batch, &m.batch, "bi")));
    }
    match &kt {
        Some(kt) => {
            c.push_str(&format!("for (long j = 0; j < {sk}; j++) for (long t = 0; t < {d}; t++) {kt}[t * {sk} + j] = kb[j * {d} + t];\n"));
            c.push_str(&format!("const float* ktb = {kt};\n"));
        }
        None => c.push_str("const float* ktb = kb;\n"),
    }
    c.push_str(&format!("float* yb = {y} + bi * {};\n", sq * dv));
    c.push_str(&format!("for (long r = 0; r < {sq}; r++) {{\nconst float* qr = qb + r * {d};\n"));
    c.push_str(&format!("for (long j = 0; j < {sk}; j++) {s}[j] = 0.0f;\n"));
    c.push_str(&format!("for (long t = 0; t < {d}; t++) {{\nconst float qd = qr[t];\nconst float* kt = ktb + t * {sk};\nfor (long j = 0; j < {sk}; j++) {s}[j] += qd * kt[j];\n}}\n"));
    c.push_str(&format!("for (long j = 0; j < {sk}; j++) {s}[j] *= {};\n", f32_lit(a.scale)));
    // Element (r, j) of a mask.
    let at = |m: &Mask| {
        let mut terms: Vec<String> = Vec::new();
        terms.extend((m.row != 0).then(|| format!("r * {}", m.row)));
        terms.extend((m.key != 0).then(|| format!("j * {}", m.key)));
        format!("{}[{}]", m.name, if terms.is_empty() { "0".to_string() } else { terms.join(" + ") })
    };
    // The keep mask first (Where), then the additive mask, as the op defines.
    if let (Some(fill), Some(m)) = (a.keep_fill, &keep) {
        c.push_str(&format!("for (long j = 0; j < {sk}; j++) {s}[j] = {} ? {s}[j] : {};\n", at(m), f32_lit(fill)));
    }
    if let Some(m) = &add {
        c.push_str(&format!("for (long j = 0; j < {sk}; j++) {s}[j] += {};\n", at(m)));
    }
    c.push_str(&format!("const float m = tsr_row_max({s}, {sk});\n"));
    c.push_str(&format!("for (long j = 0; j < {sk}; j++) {e}[j] = tsr_expf({s}[j] - m);\n"));
    c.push_str(&format!("const float sum = tsr_row_sum({e}, {sk});\n"));
    c.push_str(&format!("for (long o = 0; o < {dv}; o++) {acc}[o] = 0.0f;\n"));
    c.push_str(&format!("for (long j = 0; j < {sk}; j++) {{\nconst float p = {e}[j] / sum;\nconst float* vj = vb + j * {dv};\nfor (long o = 0; o < {dv}; o++) {acc}[o] += p * vj[o];\n}}\n"));
    c.push_str(&format!("for (long o = 0; o < {dv}; o++) yb[r * {dv} + o] = {acc}[o];\n}}\n}}\n"));
    f.body.push_str(&c);
    Ok(())
}
