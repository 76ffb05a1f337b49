//! MatMul, Conv and ConvTranspose.
//!
//! f32 MatMul and Conv run the prelude's blocked GEMM (packed B panels, register-tile micro-kernel) with the
//! loop nest and the tile write-back generated here, so a fused epilogue (the anchored group: bias,
//! activation, residual...) is applied to each output element straight from the accumulator tile. When K
//! spans several KC blocks, partial sums wait in the output's own buffer (or the first stored f32 member of
//! the epilogue; scratch only if neither exists) and the epilogue runs on the last block.
//!
//! Conv: im2col of one (batch, group) into scratch and the GEMM `W_g [M/g, C/g·k] x cols [C/g·k, out]`, the
//! 1x1/stride-1/unpadded case multiplying the input in place; depthwise and other small reductions
//! (`C/g · k < DIRECT_MAX`) use direct loops instead. ConvTranspose scatters products into a double
//! accumulator per output plane (the reference sums taps in f64 too).

// Code is generated per spatial dim; indexing several per-dim arrays by `d` reads best.
#![allow(clippy::needless_range_loop)]

use crate::backend::Refusal;
use super::ew::{self, Operand};
use super::func::Func;
use crate::backend::lowering::nest::{broadcast, contiguous, flat_stride, row_offset};
use crate::backend::lowering::plan::Group;
use crate::ir::{ConvAttrs, ConvTransposeAttrs, NodeId};

/// Must match the prelude's TSR_KC / TSR_NC; NR is taken at its widest (16) for scratch sizing.
const KC: usize = 256;
const NC: usize = 512;
const NR_MAX: usize = 16;

/// Convolutions whose per-output reduction (C/g · kernel taps) is below this use direct loops.
pub const DIRECT_MAX: usize = 32;

/// The epilogue of a GEMM-like item: code run per output element with the accumulated value.
pub struct Epilogue<'g> {
    pub grp: Option<&'g Group>,
    /// Row dims and column dims of the (logical) output domain.
    pub row_dims: Vec<usize>,
    pub cols: usize,
    /// Per loaded operand: strides over the row dims and its single column stride.
    pub row_strides: Vec<Vec<i64>>,
    pub col_stride: Vec<i64>,
    pub ops: Vec<(crate::ir::ValueId, Operand)>,
    /// Where the anchor's raw output goes when it is stored and there is no group (or the group stores it).
    pub anchor_store: Option<String>,
    /// A per-row addend (conv bias): C expression of the row index `R`.
    pub bias: Option<String>,
}

impl Epilogue<'_> {
    /// Statements run once per output row `R` (row offsets of the loaded operands).
    fn row_prelude(&self) -> String {
        let mut s = String::new();
        for (k, rs) in self.row_strides.iter().enumerate() {
            s.push_str(&format!("const long ro{k} = {};\n", row_offset(&self.row_dims, rs, "R")));
        }
        s
    }

    /// Statements for the element at (R, j) whose accumulated value is `v`.
    fn element(&self, f: &mut Func, v: &str) -> Result<String, Refusal> {
        let val = match &self.bias {
            Some(b) => format!("{v} + {b}"),
            None => v.to_string(),
        };
        let out = format!("R * {} + j", self.cols);
        match self.grp {
            Some(grp) => {
                let cs = self.col_stride.clone();
                let idx = move |k: usize| match cs[k] {
                    0 => format!("ro{k}"),
                    1 => format!("ro{k} + j"),
                    s => format!("ro{k} + j * {s}"),
                };
                ew::element(f, grp, &self.ops, &idx, Some(&val), &out)
            }
            None => Ok(match &self.anchor_store {
                Some(p) => format!("{p}[{out}] = {val};\n"),
                None => String::new(),
            }),
        }
    }
}

/// Builds the epilogue of an anchored group (or of a bare anchor) over the logical domain `row_dims x cols`;
/// `logical` maps an operand's broadcast strides over the group domain to strides over `row_dims ++ [cols]`
/// flattened columns.
fn epilogue<'g>(
    f: &mut Func,
    anchor: NodeId,
    grp: Option<&'g Group>,
    row_dims: Vec<usize>,
    col_dims: Vec<usize>,
    logical: &dyn Fn(Vec<i64>) -> Vec<i64>,
) -> Result<Epilogue<'g>, Refusal> {
    let g = f.g;
    let m = g.node(anchor).outputs[0];
    let nr = row_dims.len();
    let cols: usize = col_dims.iter().product();
    let (ops, loaded) = match grp {
        Some(grp) if !grp.nodes.is_empty() => ew::operands(g, grp),
        _ => (Vec::new(), Vec::new()),
    };
    let mut row_strides = Vec::new();
    let mut col_stride = Vec::new();
    for &v in &loaded {
        let st = logical(broadcast(&g.ty(v).shape, &grp.expect("loaded operands come from a group").domain));
        row_strides.push(st[..nr].to_vec());
        col_stride.push(flat_stride(&col_dims, &st[nr..]).ok_or("epilogue operand walks the columns in more than one run")?);
    }
    let grp = grp.filter(|gr| !gr.nodes.is_empty());
    let anchor_store = if f.plan.materialized[m.index()] && grp.is_none() { Some(f.buf(m, true)) } else { None };
    Ok(Epilogue { grp, row_dims, cols, row_strides, col_stride, ops, anchor_store, bias: None })
}

/// The buffer that holds partial sums between KC blocks when K needs several.
fn partial_buffer(f: &mut Func, anchor: NodeId, grp: Option<&Group>, elems: usize) -> String {
    let g = f.g;
    let m = g.node(anchor).outputs[0];
    if f.plan.materialized[m.index()] {
        return f.buf(m, true);
    }
    if let Some(grp) = grp {
        for &n in &grp.nodes {
            let o = g.node(n).outputs[0];
            if f.plan.materialized[o.index()] && g.ty(o).dtype == crate::ir::DType::F32 {
                return f.buf(o, true);
            }
        }
    }
    f.temp(elems, "float", 4)
}

/// Emits one GEMM `C[R = row0 + i, j] = sum_p A[i, p] B[p, j]` with the epilogue applied per element.
#[allow(clippy::too_many_arguments)]
fn gemm(f: &mut Func, epi: &Epilogue, m: usize, n: usize, k: usize, a: &str, lda: usize, b: &str, ldb: usize, row0: &str, pack: &str, partial: Option<&str>) -> Result<String, Refusal> {
    let mut s = String::new();
    s.push_str(&format!("for (long jc = 0; jc < {n}; jc += TSR_NC) {{\n"));
    s.push_str(&format!("const long nc = {n} - jc < TSR_NC ? {n} - jc : TSR_NC;\n"));
    s.push_str("long pc = 0;\ndo {\n");
    s.push_str(&format!("const long kc = {k} - pc < TSR_KC ? {k} - pc : TSR_KC;\n"));
    s.push_str(&format!("tsr_pack_b(kc, nc, {b} + pc * {ldb} + jc, {ldb}, {pack});\n"));
    s.push_str(&format!("for (long ic = 0; ic < {m}; ic += TSR_MR) {{\n"));
    s.push_str(&format!("const long mr = {m} - ic < TSR_MR ? {m} - ic : TSR_MR;\n"));
    s.push_str("for (long jr = 0; jr < nc; jr += TSR_NR) {\n");
    s.push_str("const long nr = nc - jr < TSR_NR ? nc - jr : TSR_NR;\n");
    s.push_str("float acc[TSR_MR * TSR_NR];\n");
    s.push_str(&format!("tsr_micro(kc, {a} + ic * {lda} + pc, {lda}, mr, {pack} + jr * kc, acc);\n"));
    s.push_str("for (long r = 0; r < mr; r++) {\n");
    s.push_str(&format!("const long R = {row0} + ic + r;\n"));
    s.push_str(&epi.row_prelude());
    s.push_str("for (long c = 0; c < nr; c++) {\n");
    s.push_str("const long j = jc + jr + c;\n");
    s.push_str("float v = acc[r * TSR_NR + c];\n");
    if let Some(p) = partial {
        let at = format!("R * {} + j", epi.cols);
        s.push_str(&format!("if (pc > 0) v += {p}[{at}];\n"));
        s.push_str(&format!("if (pc + kc < {k}) {{\n{p}[{at}] = v;\ncontinue;\n}}\n"));
    }
    s.push_str(&epi.element(f, "v")?);
    s.push_str("}\n}\n}\n}\n");
    s.push_str("pc += TSR_KC;\n} while (pc < ");
    s.push_str(&format!("{k});\n}}\n"));
    Ok(s)
}

fn pack_floats(k: usize, n: usize) -> usize {
    k.clamp(1, KC) * n.min(NC).div_ceil(NR_MAX).max(1) * NR_MAX
}

/// f32 MatMul (NumPy semantics) with an optional fused epilogue group.
pub fn matmul(f: &mut Func, node: NodeId, grp: Option<&Group>) -> Result<(), Refusal> {
    let g = f.g;
    let nd = g.node(node);
    let (sa, sb) = (g.ty(nd.inputs[0]).shape.clone(), g.ty(nd.inputs[1]).shape.clone());
    let a2: Vec<usize> = if sa.len() == 1 { vec![1, sa[0]] } else { sa.clone() };
    let b2: Vec<usize> = if sb.len() == 1 { vec![sb[0], 1] } else { sb.clone() };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let n = b2[b2.len() - 1];
    let (ba, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let batch = crate::ir::broadcast_shapes(ba, bb).map_err(|e| e.to_string())?;
    let nb: usize = batch.iter().product();
    let sta: Vec<i64> = broadcast(ba, &batch).iter().map(|s| s * (m * k) as i64).collect();
    let stb: Vec<i64> = broadcast(bb, &batch).iter().map(|s| s * (k * n) as i64).collect();
    let nbat = batch.len();
    let (a_rank1, b_rank1) = (sa.len() == 1, sb.len() == 1);
    let logical = move |st: Vec<i64>| -> Vec<i64> {
        // Group domain = out shape; insert the dims rank-1 promotion removed (size 1, stride 0).
        let mut v = st[..nbat].to_vec();
        let mut rest = st[nbat..].iter().copied();
        v.push(if a_rank1 { 0 } else { rest.next().unwrap_or(0) });
        v.push(if b_rank1 { 0 } else { rest.next().unwrap_or(0) });
        v
    };
    let mut row_dims = batch.clone();
    row_dims.push(m);
    let epi = epilogue(f, node, grp, row_dims, vec![n], &logical)?;
    let a = f.buf(nd.inputs[0], false);
    let b = f.buf(nd.inputs[1], false);
    let pack = f.temp(pack_floats(k, n), "float", 4);
    let partial = if k > KC { Some(partial_buffer(f, node, grp, nb * m * n)) } else { None };
    // One B for every batch and A's batches contiguous: the batches stack into one tall GEMM.
    let tall = stb.iter().all(|&s| s == 0) && sta == contiguous(&batch).iter().map(|s| s * (m * k) as i64).collect::<Vec<_>>();
    let code = if tall || nb == 1 {
        gemm(f, &epi, nb * m, n, k, &a, k, &b, n, "0", &pack, partial.as_deref())?
    } else {
        let body = gemm(f, &epi, m, n, k, "ab", k, "bb", n, &format!("bi * {m}"), &pack, partial.as_deref())?;
        format!(
            "for (long bi = 0; bi < {nb}; bi++) {{\nconst float* ab = {a} + {};\nconst float* bb = {b} + {};\n{body}}}\n",
            row_offset(&batch, &sta, "bi"),
            row_offset(&batch, &stb, "bi")
        )
    };
    f.body.push_str(&code);
    Ok(())
}

/// Integer MatMul: a wrapping i64 triple loop (only ever on small shape data).
pub fn matmul_int(f: &mut Func, node: NodeId) -> Result<(), Refusal> {
    let g = f.g;
    let nd = g.node(node);
    let (sa, sb) = (g.ty(nd.inputs[0]).shape.clone(), g.ty(nd.inputs[1]).shape.clone());
    let a2: Vec<usize> = if sa.len() == 1 { vec![1, sa[0]] } else { sa.clone() };
    let b2: Vec<usize> = if sb.len() == 1 { vec![sb[0], 1] } else { sb.clone() };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let n = b2[b2.len() - 1];
    let (ba, bb) = (&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
    let batch = crate::ir::broadcast_shapes(ba, bb).map_err(|e| e.to_string())?;
    let nb: usize = batch.iter().product();
    let sta: Vec<i64> = broadcast(ba, &batch).iter().map(|s| s * (m * k) as i64).collect();
    let stb: Vec<i64> = broadcast(bb, &batch).iter().map(|s| s * (k * n) as i64).collect();
    let a = f.buf(nd.inputs[0], false);
    let b = f.buf(nd.inputs[1], false);
    let y = f.buf(nd.outputs[0], true);
    let narrow = if g.ty(nd.outputs[0]).dtype == crate::ir::DType::I32 { "(int32_t)" } else { "" };
    f.body.push_str(&format!(
        "for (long bi = 0; bi < {nb}; bi++) {{\nconst long oa = {}, ob = {};\nfor (long i = 0; i < {m}; i++) {{\nfor (long j = 0; j < {n}; j++) {{\nint64_t s = 0;\nfor (long p = 0; p < {k}; p++) s = TSR_WADD(s, TSR_WMUL({a}[oa + i * {k} + p], {b}[ob + p * {n} + j]));\n{y}[(bi * {m} + i) * {n} + j] = {narrow}s;\n}}\n}}\n}}\n",
        row_offset(&batch, &sta, "bi"),
        row_offset(&batch, &stb, "bi"),
    ));
    Ok(())
}

/// Valid kernel-tap range along one dim for output coordinate `o` (C statements defining `{p}lo`, `{p}hi`,
/// `{p}i0`): taps `k` with `0 <= i0 + k*dil < size`, where `i0 = o*stride - pad`.
fn tap_range(p: &str, o: &str, stride: usize, pad: usize, dil: usize, kernel: usize, size: usize) -> String {
    format!(
        "const long {p}i0 = {o} * {stride} - {pad};\nconst long {p}lo = {p}i0 < 0 ? (-{p}i0 + {dm}) / {dil} : 0;\nlong {p}hi = {size} - {p}i0 <= 0 ? 0 : ({size} - {p}i0 + {dm}) / {dil};\nif ({p}hi > {kernel}) {p}hi = {kernel};\n",
        dm = dil - 1
    )
}

/// f32 Conv with an optional fused epilogue group.
pub fn conv(f: &mut Func, node: NodeId, a: &ConvAttrs, grp: Option<&Group>) -> Result<(), Refusal> {
    let g = f.g;
    let nd = g.node(node);
    let xs = g.ty(nd.inputs[0]).shape.clone();
    let ws = g.ty(nd.inputs[1]).shape.clone();
    let ys = g.ty(nd.outputs[0]).shape.clone();
    let sp = xs.len() - 2;
    let (nbatch, c, mo) = (xs[0], xs[1], ws[0]);
    let gr = a.group;
    let (cg, mg) = (c / gr, mo / gr);
    let kernel = &ws[2..];
    let kk: usize = kernel.iter().product();
    let isz: usize = xs[2..].iter().product();
    let ps: usize = ys[2..].iter().product();
    let in_sp = &xs[2..];
    let out_sp = &ys[2..];
    let mut epi = epilogue(f, node, grp, vec![nbatch, mo], out_sp.to_vec(), &|st| st)?;
    let x = f.buf(nd.inputs[0], false);
    let w = f.buf(nd.inputs[1], false);
    if nd.inputs.len() > 2 {
        let bias = f.buf(nd.inputs[2], false);
        epi.bias = Some(format!("{bias}[R % {mo}]"));
    }
    let pointwise = kk == 1 && a.strides.iter().all(|&s| s == 1) && a.pads.iter().all(|&p| p == 0);
    let mut s = String::new();
    if !pointwise && cg * kk < DIRECT_MAX {
        // Direct loops, one output row (last spatial dim) at a time: the row accumulates in scratch, each
        // tap adding a scaled, shifted input row over its valid range (a contiguous, vectorizable loop at
        // stride 1). Per element, taps are summed in (channel, kernel position) order.
        let in_st = contiguous(in_sp);
        let k_st = contiguous(kernel);
        let out_st = contiguous(out_sp);
        let l = sp - 1;
        let (ow, s_l, dil_l, pad_l, iw, kl) = (out_sp[l], a.strides[l], a.dilations[l], a.pads[l], in_sp[l], kernel[l]);
        let row = f.temp(ow, "float", 4);
        s.push_str(&format!("for (long bb = 0; bb < {nbatch}; bb++) {{\nfor (long m = 0; m < {mo}; m++) {{\n"));
        s.push_str(&format!("const long R = bb * {mo} + m;\n{}", epi.row_prelude()));
        s.push_str(&format!("const float* xb = {x} + (bb * {c} + (m / {mg}) * {cg}) * {isz};\nconst float* wm = {w} + m * {};\n", cg * kk));
        for d in 0..l {
            s.push_str(&format!("for (long o{d} = 0; o{d} < {}; o{d}++) {{\n", out_sp[d]));
            s.push_str(&tap_range(&format!("d{d}"), &format!("o{d}"), a.strides[d], a.pads[d], a.dilations[d], kernel[d], in_sp[d]));
        }
        s.push_str(&format!("for (long q = 0; q < {ow}; q++) {row}[q] = 0.0f;\nfor (long ci = 0; ci < {cg}; ci++) {{\n"));
        for d in 0..l {
            s.push_str(&format!("for (long k{d} = d{d}lo; k{d} < d{d}hi; k{d}++) {{\n"));
        }
        let mut xi: Vec<String> = vec![format!("ci * {isz}")];
        xi.extend((0..l).map(|d| format!("(d{d}i0 + k{d} * {}) * {}", a.dilations[d], in_st[d])));
        let mut wi: Vec<String> = vec![format!("ci * {kk}")];
        wi.extend((0..l).map(|d| format!("k{d} * {}", k_st[d])));
        s.push_str(&format!("const float* xr = xb + {};\nconst float* wr = wm + {};\n", xi.join(" + "), wi.join(" + ")));
        s.push_str(&format!(
            "for (long kq = 0; kq < {kl}; kq++) {{\nconst float wv = wr[kq];\nconst long off = kq * {dil_l} - {pad_l};\nconst long qlo = off >= 0 ? 0 : (-off + {sm}) / {s_l};\nlong qhi = {iw} - off <= 0 ? 0 : ({iw} - off + {sm}) / {s_l};\nif (qhi > {ow}) qhi = {ow};\nfor (long q = qlo; q < qhi; q++) {row}[q] += xr[q * {s_l} + off] * wv;\n}}\n",
            sm = s_l - 1
        ));
        for _ in 0..l {
            s.push_str("}\n");
        }
        s.push_str("}\n");
        let mut j: Vec<String> = (0..l).map(|d| format!("o{d} * {}", out_st[d])).collect();
        j.push("q".into());
        s.push_str(&format!("for (long q = 0; q < {ow}; q++) {{\nconst long j = {};\n", j.join(" + ")));
        s.push_str(&epi.element(f, &format!("{row}[q]"))?);
        s.push_str("}\n");
        for _ in 0..l {
            s.push_str("}\n");
        }
        s.push_str("}\n}\n");
        f.body.push_str(&s);
        return Ok(());
    }
    let pack = f.temp(pack_floats(cg * kk, ps), "float", 4);
    let partial = if cg * kk > KC { Some(partial_buffer(f, node, grp, nbatch * mo * ps)) } else { None };
    s.push_str(&format!("for (long bb = 0; bb < {nbatch}; bb++) {{\nfor (long gg = 0; gg < {gr}; gg++) {{\n"));
    s.push_str(&format!("const float* xg = {x} + (bb * {c} + gg * {cg}) * {isz};\n"));
    let bsrc = if pointwise {
        "xg".to_string()
    } else {
        let cols = f.temp(cg * kk * ps, "float", 4);
        s.push_str(&im2col(&cols, cg, in_sp, out_sp, kernel, a));
        cols
    };
    let row0 = format!("bb * {mo} + gg * {mg}");
    let wg = format!("({w} + gg * {})", mg * cg * kk);
    s.push_str(&gemm(f, &epi, mg, ps, cg * kk, &wg, cg * kk, &bsrc, ps, &row0, &pack, partial.as_deref())?);
    s.push_str("}\n}\n");
    f.body.push_str(&s);
    Ok(())
}

/// im2col of `xg` (cg channel planes) into `cols` [cg · taps, out positions]; padding taps are 0.
fn im2col(cols: &str, cg: usize, in_sp: &[usize], out_sp: &[usize], kernel: &[usize], a: &ConvAttrs) -> String {
    let sp = in_sp.len();
    let isz: usize = in_sp.iter().product();
    let ps: usize = out_sp.iter().product();
    let in_st = contiguous(in_sp);
    let out_st = contiguous(out_sp);
    let last = sp - 1;
    let mut s = String::new();
    s.push_str(&format!("{{\nfloat* dst = {cols};\nfor (long ci = 0; ci < {cg}; ci++) {{\nconst float* xc = xg + ci * {isz};\n"));
    for d in 0..sp {
        s.push_str(&format!("for (long k{d} = 0; k{d} < {}; k{d}++) {{\n", kernel[d]));
    }
    // Outer output dims: skip rows of the plane whose input coordinate is in the padding.
    for d in 0..last {
        s.push_str(&format!(
            "for (long o{d} = 0; o{d} < {}; o{d}++) {{\nconst long i{d} = o{d} * {} + k{d} * {} - {};\n",
            out_sp[d], a.strides[d], a.dilations[d], a.pads[d]
        ));
    }
    let base: Vec<String> = (0..last).map(|d| format!("o{d} * {}", out_st[d])).collect();
    let base = if base.is_empty() { "0".to_string() } else { base.join(" + ") };
    let inside: Vec<String> = (0..last).map(|d| format!("(i{d} >= 0 && i{d} < {})", in_sp[d])).collect();
    let src: Vec<String> = (0..last).map(|d| format!("i{d} * {}", in_st[d])).collect();
    let src = if src.is_empty() { "0".to_string() } else { src.join(" + ") };
    let ow = out_sp[last];
    s.push_str(&format!("float* row = dst + {base};\n"));
    if !inside.is_empty() {
        s.push_str(&format!("if (!({})) {{\nfor (long q = 0; q < {ow}; q++) row[q] = 0.0f;\ncontinue;\n}}\n", inside.join(" && ")));
    }
    s.push_str(&format!("const float* xr = xc + {src};\n"));
    let (st, dil, pad, size) = (a.strides[last], a.dilations[last], a.pads[last], in_sp[last]);
    s.push_str(&format!("for (long q = 0; q < {ow}; q++) {{\nconst long iq = q * {st} + k{last} * {dil} - {pad};\nrow[q] = (iq >= 0 && iq < {size}) ? xr[iq] : 0.0f;\n}}\n"));
    for _ in 0..last {
        s.push_str("}\n");
    }
    s.push_str(&format!("dst += {ps};\n"));
    for _ in 0..sp {
        s.push_str("}\n");
    }
    s.push_str("}\n}\n");
    s
}

/// ConvTranspose: per output plane, scatter every input-tap product into a double accumulator.
pub fn conv_transpose(f: &mut Func, node: NodeId, a: &ConvTransposeAttrs) -> Result<(), Refusal> {
    let g = f.g;
    let nd = g.node(node);
    let xs = g.ty(nd.inputs[0]).shape.clone();
    let ws = g.ty(nd.inputs[1]).shape.clone();
    let ys = g.ty(nd.outputs[0]).shape.clone();
    let sp = xs.len() - 2;
    let (nbatch, c) = (xs[0], xs[1]);
    let gr = a.group;
    let cg = c / gr;
    let mg = ws[1];
    let mo = mg * gr;
    let kernel = &ws[2..];
    let kk: usize = kernel.iter().product();
    let in_sp = &xs[2..];
    let out_sp = &ys[2..];
    let isz: usize = in_sp.iter().product();
    let osz: usize = out_sp.iter().product();
    let (in_st, out_st, k_st) = (contiguous(in_sp), contiguous(out_sp), contiguous(kernel));
    let x = f.buf(nd.inputs[0], false);
    let w = f.buf(nd.inputs[1], false);
    let bias = if nd.inputs.len() > 2 { Some(f.buf(nd.inputs[2], false)) } else { None };
    let y = f.buf(nd.outputs[0], true);
    let acc = f.temp(osz, "double", 8);
    let mut s = format!("for (long bb = 0; bb < {nbatch}; bb++) {{\nfor (long m = 0; m < {mo}; m++) {{\nconst long gg = m / {mg}, co = m % {mg};\nfor (long q = 0; q < {osz}; q++) {acc}[q] = 0.0;\nfor (long ci = 0; ci < {cg}; ci++) {{\nconst float* xc = {x} + (bb * {c} + gg * {cg} + ci) * {isz};\nconst float* wc = {w} + ((gg * {cg} + ci) * {mg} + co) * {kk};\n");
    for d in 0..sp {
        s.push_str(&format!("for (long i{d} = 0; i{d} < {}; i{d}++) {{\n", in_sp[d]));
    }
    let xi: Vec<String> = (0..sp).map(|d| format!("i{d} * {}", in_st[d])).collect();
    s.push_str(&format!("const double xv = xc[{}];\n", xi.join(" + ")));
    for d in 0..sp {
        s.push_str(&format!(
            "for (long k{d} = 0; k{d} < {}; k{d}++) {{\nconst long o{d} = i{d} * {} + k{d} * {} - {};\nif (o{d} < 0 || o{d} >= {}) continue;\n",
            kernel[d], a.strides[d], a.dilations[d], a.pads[d], out_sp[d]
        ));
    }
    let oi: Vec<String> = (0..sp).map(|d| format!("o{d} * {}", out_st[d])).collect();
    let wi: Vec<String> = (0..sp).map(|d| format!("k{d} * {}", k_st[d])).collect();
    s.push_str(&format!("{acc}[{}] += xv * (double)wc[{}];\n", oi.join(" + "), wi.join(" + ")));
    for _ in 0..2 * sp {
        s.push_str("}\n");
    }
    s.push_str("}\n");
    let b = match &bias {
        Some(b) => format!(" + (double){b}[m]"),
        None => String::new(),
    };
    s.push_str(&format!("float* yp = {y} + (bb * {mo} + m) * {osz};\nfor (long q = 0; q < {osz}; q++) yp[q] = (float)({acc}[q]{b});\n}}\n}}\n"));
    f.body.push_str(&s);
    Ok(())
}
