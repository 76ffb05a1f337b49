//! Attention as loops the C compiler vectorizes, per batch matrix and per query row. K is first laid out as
//! `[D, Sk]` in scratch (unless it already is), so a row's scores accumulate one key dimension at a time over
//! all keys at once (`s[j] += q[t] * Kt[t][j]`: contiguous in `j`, and each score still sums its products in
//! the reference's order), where a dot product per key is a chain of dependent adds. Then the scale, the keep
//! mask and the additive mask as the reference applies them, the softmax as the Softmax item computes it
//! (NaN-propagating max, the prelude's float exp, so a row of -inf scores is 0/0 = NaN and `Sk = 0` is an
//! empty sum, 0; with `nan_to_zero` a row whose sum is not positive, which is all NaN, weighs by 0), and the
//! probability-weighted sum of V's rows into a row accumulator (contiguous in V's
//! columns). Scores never leave the item's scratch.

use crate::backend::lowering::cexpr::f32_lit;
use crate::backend::{refuse, Refusal};
use super::func::{Func, PARALLEL_GRAIN, ROW_STACK_BYTES};
use crate::backend::lowering::nest::{broadcast, row_offset};
use crate::ir::{attention_dims, AttentionAttrs, DType, NodeId};

/// Strides over the batch dims with which an operand of `shape` (`[lead.., rows, cols]`) is read, in elements.
fn matrix_strides(shape: &[usize], batch: &[usize]) -> Vec<i64> {
    let r = shape.len();
    let size = (shape[r - 2] * shape[r - 1]) as i64;
    broadcast(&shape[..r - 2], batch).iter().map(|s| s * size).collect()
}

pub fn attention(f: &mut Func, node: NodeId, a: &AttentionAttrs) -> Result<(), Refusal> {
    let g = f.g;
    let nd = g.node(node);
    if let Some(&v) = nd.inputs.iter().chain(&nd.outputs).find(|&&v| !matches!(g.ty(v).dtype, DType::F32 | DType::Bool)) {
        return Err(refuse!("Attention on {} is not supported by the c backend", g.ty(v).dtype));
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
    // A row's scores, exponentials and output accumulator live on its thread's stack where they fit in
    // ROW_STACK_BYTES, and the query rows run in parallel; longer rows run in order through the item's scratch.
    let parallel = (2 * sk + dv) * 4 <= ROW_STACK_BYTES;
    let (s, e, acc) = if parallel {
        ("s".to_string(), "e".to_string(), "acc".to_string())
    } else {
        (f.temp(sk, "float", 4), f.temp(sk, "float", 4), f.temp(dv, "float", 4))
    };
    // K laid out as [D, Sk] for every batch matrix, before the rows (which read it from any thread).
    let kt = (!a.k_transposed).then(|| f.temp(batch * d * sk, "float", 4));

    let mut c = String::new();
    let operand = |i: usize, bi: &str| {
        let st = matrix_strides(&g.ty(nd.inputs[i]).shape, &dims.batch);
        format!("{} + {}", ops[i], row_offset(&dims.batch, &st, bi))
    };
    if let Some(kt) = &kt {
        let transpose = format!(
            "const float* kb = {};\nfloat* ktb = {kt} + bi * {};\nfor (long j = 0; j < {sk}; j++) for (long t = 0; t < {d}; t++) ktb[t * {sk} + j] = kb[j * {d} + t];\n",
            operand(1, "bi"),
            d * sk
        );
        // Each batch matrix's own part of the scratch: the matrices transpose in parallel too.
        c.push_str(&f.parallel_for(batch, PARALLEL_GRAIN.div_ceil((d * sk).max(1)), "bi", &transpose));
    }
    // One query row: (batch matrix bi, row r) of row i.
    let mut row = format!("const long bi = i / {sq}, r = i % {sq};\n");
    row.push_str(&format!("const float* qr = {} + r * {d};\n", operand(0, "bi")));
    row.push_str(&format!("const float* vb = {};\n", operand(2, "bi")));
    for m in add.iter().chain(&keep) {
        row.push_str(&format!("const {}* {} = {} + {};\n", m.ty, m.name, m.buf, row_offset(&dims.batch, &m.batch, "bi")));
    }
    match &kt {
        Some(kt) => row.push_str(&format!("const float* ktb = {kt} + bi * {};\n", d * sk)),
        None => row.push_str(&format!("const float* ktb = {};\n", operand(1, "bi"))),
    }
    row.push_str(&format!("float* yr = {y} + i * {dv};\n"));
    if parallel {
        row.push_str(&format!("float s[{sk}], e[{sk}], acc[{dv}];\n"));
    }
    row.push_str(&format!("for (long j = 0; j < {sk}; j++) {s}[j] = 0.0f;\n"));
    row.push_str(&format!("for (long t = 0; t < {d}; t++) {{\nconst float qd = qr[t];\nconst float* kt = ktb + t * {sk};\nfor (long j = 0; j < {sk}; j++) {s}[j] += qd * kt[j];\n}}\n"));
    row.push_str(&format!("for (long j = 0; j < {sk}; j++) {s}[j] *= {};\n", f32_lit(a.scale)));
    // Element (r, j) of a mask.
    let at = |m: &Mask| {
        let mut terms: Vec<String> = Vec::new();
        terms.extend((m.row != 0).then(|| format!("r * {}", m.row)));
        terms.extend((m.key != 0).then(|| format!("j * {}", m.key)));
        format!("{}[{}]", m.name, if terms.is_empty() { "0".to_string() } else { terms.join(" + ") })
    };
    // The keep mask first (Where), then the additive mask, as the op defines.
    if let (Some(fill), Some(m)) = (a.keep_fill, &keep) {
        row.push_str(&format!("for (long j = 0; j < {sk}; j++) {s}[j] = {} ? {s}[j] : {};\n", at(m), f32_lit(fill)));
    }
    if let Some(m) = &add {
        row.push_str(&format!("for (long j = 0; j < {sk}; j++) {s}[j] += {};\n", at(m)));
    }
    row.push_str(&format!("const float m = tsr_row_max({s}, {sk});\n"));
    row.push_str(&format!("for (long j = 0; j < {sk}; j++) {e}[j] = tsr_expf({s}[j] - m);\n"));
    row.push_str(&format!("const float sum = tsr_row_sum({e}, {sk});\n"));
    row.push_str(&format!("for (long o = 0; o < {dv}; o++) {acc}[o] = 0.0f;\n"));
    // The NaN guard: a softmax row is all NaN exactly where its sum is 0 (every score -inf) or NaN.
    let p = if a.nan_to_zero { format!("sum > 0.0f ? {e}[j] / sum : 0.0f") } else { format!("{e}[j] / sum") };
    row.push_str(&format!("for (long j = 0; j < {sk}; j++) {{\nconst float p = {p};\nconst float* vj = vb + j * {dv};\nfor (long o = 0; o < {dv}; o++) {acc}[o] += p * vj[o];\n}}\n"));
    row.push_str(&format!("for (long o = 0; o < {dv}; o++) yr[o] = {acc}[o];\n"));
    let rows = batch * sq;
    if parallel {
        // A range holds at least PARALLEL_GRAIN multiply-adds.
        let grain = PARALLEL_GRAIN.div_ceil((sk * (d + dv)).max(1));
        c.push_str(&f.parallel_for(rows, grain, "i", &row));
    } else {
        c.push_str(&format!("for (long i = 0; i < {rows}; i++) {{\n{row}}}\n"));
    }
    f.body.push_str(&c);
    Ok(())
}
