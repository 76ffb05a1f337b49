//! MatMul and convolution on the GPU.
//!
//! Both run as one tiled GEMM kernel (fp32, SIMT): a block computes a `BM x BN` tile of C through `BK`-deep
//! slices of A and B staged in shared memory, each thread a `TM x TN` register tile. Convolution is an
//! implicit GEMM (rows: output channels of a group; columns: images x output positions; depth: input
//! channels of the group x kernel taps), its B tile gathered from the input with the padding as zeros, so
//! no im2col buffer exists. The output tile leaves registers through the partition's fused epilogue (bias,
//! activation, residual, ...). The tile shape is a [`Tiles`] value with defaults, the knobs the tune stage
//! will search.
//!
//! Convolutions with few output channels per group (depthwise) would waste a row tile: they run one thread
//! per output element over their few taps instead, as do ConvTranspose and integer MatMul (rare, small).

use super::ew;
use super::kernel::{coords, Kernel};
use crate::backend::c::cexpr::mem_type;
use crate::backend::c::nest::{broadcast, contiguous};
use crate::backend::c::plan::Group;
use crate::ir::{ConvAttrs, ConvTransposeAttrs, DType, NodeId};

/// Tile shape of the GEMM kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tiles {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub tm: u32,
    pub tn: u32,
}

impl Default for Tiles {
    fn default() -> Tiles {
        Tiles { bm: 64, bn: 64, bk: 16, tm: 4, tn: 4 }
    }
}

impl Tiles {
    fn threads(&self) -> u32 {
        (self.bm / self.tm) * (self.bn / self.tn)
    }
}

/// The pieces of one GEMM problem, as code: `load_a(m, k)`, `load_b(k, n)` (with `z` the batch or group in
/// scope, after `prep`), and the flat output index of `(m, n)`.
struct Problem {
    m: usize,
    n: usize,
    k: usize,
    z: usize,
    prep: String,
    load_a: String,
    load_b: String,
    out_index: String,
    /// Added to the accumulator before the epilogue (a conv bias).
    bias: Option<String>,
}

fn tiled(k: &mut Kernel, p: Problem, grp: Option<&Group>, t: Tiles) -> Result<(), String> {
    if p.z > 65535 {
        return Err(format!("{} GEMMs in one batch (at most 65535)", p.z));
    }
    let Tiles { bm, bn, bk, tm, tn } = t;
    let threads = t.threads();
    let cols = bn / tn;
    let mut b = format!("__shared__ float As[{bk}][{bm}];\n__shared__ float Bs[{bk}][{}];\n", bn + 4);
    b.push_str(&format!("const unsigned z = blockIdx.z;\nconst int m0 = blockIdx.y * {bm}, n0 = blockIdx.x * {bn};\nconst int tx = threadIdx.x % {cols}, ty = threadIdx.x / {cols};\n"));
    b.push_str(&p.prep);
    b.push_str(&format!("float acc[{tm}][{tn}];\n#pragma unroll\nfor (int a = 0; a < {tm}; a++)\n#pragma unroll\nfor (int c = 0; c < {tn}; c++) acc[a][c] = 0.0f;\n"));
    b.push_str(&format!("for (int k0 = 0; k0 < {K}; k0 += {bk}) {{\n", K = p.k));
    b.push_str(&format!(
        "for (int e = threadIdx.x; e < {}; e += {threads}) {{\nconst int kk = e % {bk}, mm = e / {bk};\nconst int m = m0 + mm, k = k0 + kk;\nAs[kk][mm] = (m < {M} && k < {K}) ? ({la}) : 0.0f;\n}}\n",
        bm * bk,
        M = p.m,
        K = p.k,
        la = p.load_a
    ));
    b.push_str(&format!(
        "for (int e = threadIdx.x; e < {}; e += {threads}) {{\nconst int nn = e % {bn}, kk = e / {bn};\nconst int n = n0 + nn, k = k0 + kk;\nBs[kk][nn] = (n < {N} && k < {K}) ? ({lb}) : 0.0f;\n}}\n",
        bn * bk,
        N = p.n,
        K = p.k,
        lb = p.load_b
    ));
    b.push_str(&format!(
        "__syncthreads();\n#pragma unroll\nfor (int kk = 0; kk < {bk}; kk++) {{\nfloat ra[{tm}], rb[{tn}];\n#pragma unroll\nfor (int a = 0; a < {tm}; a++) ra[a] = As[kk][ty * {tm} + a];\n#pragma unroll\nfor (int c = 0; c < {tn}; c++) rb[c] = Bs[kk][tx * {tn} + c];\n#pragma unroll\nfor (int a = 0; a < {tm}; a++)\n#pragma unroll\nfor (int c = 0; c < {tn}; c++) acc[a][c] = fmaf(ra[a], rb[c], acc[a][c]);\n}}\n__syncthreads();\n}}\n"
    ));
    // Epilogue.
    b.push_str(&format!("#pragma unroll\nfor (int a = 0; a < {tm}; a++) {{\n#pragma unroll\nfor (int c = 0; c < {tn}; c++) {{\nconst int m = m0 + ty * {tm} + a, n = n0 + tx * {tn} + c;\nif (m < {} && n < {}) {{\nconst unsigned f = {};\n", p.m, p.n, p.out_index));
    let value = match &p.bias {
        Some(bias) => format!("acc[a][c] + {bias}"),
        None => "acc[a][c]".to_string(),
    };
    match grp {
        Some(grp) if !grp.nodes.is_empty() || grp.anchor.is_some() => {
            let loaded = ew::loaded_operands(k, grp);
            b.push_str(&ew::operand_offsets(k, &grp.domain, &loaded, "f"));
            b.push_str(&ew::element(k, grp, &loaded, &|o| format!("o{o}"), Some(&value), "f")?);
        }
        _ => return Err("a GEMM needs its output group".into()),
    }
    b.push_str("}\n}\n}\n");
    k.body.push_str(&b);
    k.grid = [p.n.div_ceil(bn as usize).max(1) as u32, p.m.div_ceil(bm as usize).max(1) as u32, p.z.max(1) as u32];
    if k.grid[1] > 65535 {
        return Err(format!("a GEMM with {} rows (at most {} row tiles)", p.m, 65535));
    }
    k.block = [threads, 1, 1];
    Ok(())
}

/// An f32 MatMul (NumPy semantics: batched, broadcast batch dims, rank-1 operands) as a tiled GEMM; `grp` is
/// the group anchored on it (its epilogue).
pub fn matmul(k: &mut Kernel, node: NodeId, grp: &Group, t: Tiles) -> Result<(), String> {
    let g = k.g;
    let nd = g.node(node);
    let (a, bv, o) = (nd.inputs[0], nd.inputs[1], nd.outputs[0]);
    let (sa, sb) = (g.ty(a).shape.clone(), g.ty(bv).shape.clone());
    let (m, kd) = if sa.len() == 1 { (1, sa[0]) } else { (sa[sa.len() - 2], sa[sa.len() - 1]) };
    let n = if sb.len() == 1 { 1 } else { sb[sb.len() - 1] };
    let abatch: Vec<usize> = if sa.len() > 2 { sa[..sa.len() - 2].to_vec() } else { Vec::new() };
    let bbatch: Vec<usize> = if sb.len() > 2 { sb[..sb.len() - 2].to_vec() } else { Vec::new() };
    let rank = abatch.len().max(bbatch.len());
    let mut obatch = vec![1usize; rank];
    for (d, ob) in obatch.iter_mut().enumerate() {
        let pick = |s: &[usize]| if d + s.len() >= rank { s[d + s.len() - rank] } else { 1 };
        *ob = pick(&abatch).max(pick(&bbatch));
    }
    let z: usize = obatch.iter().product();
    let ast = broadcast(&abatch, &obatch);
    let bst = broadcast(&bbatch, &obatch);
    let mut prep = coords(&obatch, "z", "zb", &vec![true; rank]);
    let term = |st: &[i64], per: usize| -> String {
        let t: Vec<String> = st.iter().enumerate().filter(|(_, &s)| s != 0).map(|(d, &s)| format!("zb{d} * {}u", s as usize * per)).collect();
        if t.is_empty() {
            "0u".into()
        } else {
            t.join(" + ")
        }
    };
    prep.push_str(&format!("const unsigned abase = {};\nconst unsigned bbase = {};\n", term(&ast, m * kd), term(&bst, kd * n)));
    let pa = k.buf(a, false);
    let pb = k.buf(bv, false);
    let _ = o;
    let p = Problem {
        m,
        n,
        k: kd,
        z,
        prep,
        load_a: format!("{pa}[abase + m * {kd}u + k]"),
        load_b: format!("{pb}[bbase + k * {n}u + n]"),
        out_index: format!("z * {}u + m * {n}u + n", m * n),
        bias: None,
    };
    tiled(k, p, Some(grp), t)
}

/// Geometry of a convolution's spatial dims.
struct ConvGeom {
    sp: usize,
    in_sp: Vec<usize>,
    out_sp: Vec<usize>,
    kernel: Vec<usize>,
}

fn conv_geom(k: &Kernel, node: NodeId) -> ConvGeom {
    let nd = k.g.node(node);
    let xs = k.g.ty(nd.inputs[0]).shape.clone();
    let ws = k.g.ty(nd.inputs[1]).shape.clone();
    let ys = k.g.ty(nd.outputs[0]).shape.clone();
    ConvGeom { sp: xs.len() - 2, in_sp: xs[2..].to_vec(), out_sp: ys[2..].to_vec(), kernel: ws[2..].to_vec() }
}

/// Statements computing, from output position `q` (flat over the output's spatial dims) and kernel tap
/// `r` (flat over the kernel), the input offset `xo` within a channel plane and whether it is inside
/// (`ok`).
fn conv_tap(geo: &ConvGeom, a: &ConvAttrs, q: &str, r: &str) -> String {
    let (in_st, out_st, k_st) = (contiguous(&geo.in_sp), contiguous(&geo.out_sp), contiguous(&geo.kernel));
    let mut s = String::from("bool ok = true;\nint xo = 0;\n");
    for d in 0..geo.sp {
        s.push_str(&format!(
            "{{\nconst int od = (int)(({q} / {}u) % {}u), kd = (int)(({r} / {}u) % {}u);\nconst int id = od * {} - {} + kd * {};\nok = ok && id >= 0 && id < {};\nxo += id * {};\n}}\n",
            out_st[d], geo.out_sp[d], k_st[d], geo.kernel[d], a.strides[d], a.pads[d], a.dilations[d], geo.in_sp[d], in_st[d]
        ));
    }
    s
}

/// An f32 convolution: a tiled implicit GEMM per group, or one thread per output for depthwise-like shapes.
pub fn conv(k: &mut Kernel, node: NodeId, a: &ConvAttrs, grp: &Group, t: Tiles) -> Result<(), String> {
    let g = k.g;
    let nd = g.node(node);
    let xs = g.ty(nd.inputs[0]).shape.clone();
    let ws = g.ty(nd.inputs[1]).shape.clone();
    let geo = conv_geom(k, node);
    let (nimg, cin, cout) = (xs[0], xs[1], ws[0]);
    let (gr, cg) = (a.group, ws[1]);
    let mg = cout / gr;
    let taps: usize = geo.kernel.iter().product();
    let isz: usize = geo.in_sp.iter().product();
    let osz: usize = geo.out_sp.iter().product();
    let kd = cg * taps;
    let x = k.buf(nd.inputs[0], false);
    let w = k.buf(nd.inputs[1], false);
    let bias = if nd.inputs.len() > 2 { Some(k.buf(nd.inputs[2], false)) } else { None };
    if mg < 8 {
        return conv_direct(k, node, a, grp, &geo, (x, w, bias));
    }
    let tap = conv_tap(&geo, a, "q", "r");
    let load_b = format!(
        "[&]() -> float {{\nconst unsigned img = n / {osz}u, q = n % {osz}u;\nconst unsigned ci = k / {taps}u, r = k % {taps}u;\n{tap}return ok ? {x}[(img * {cin}u + z * {cg}u + ci) * {isz}u + xo] : 0.0f;\n}}()"
    );
    let p = Problem {
        m: mg,
        n: nimg * osz,
        k: kd,
        z: gr,
        prep: String::new(),
        load_a: format!("{w}[(z * {mg}u + m) * {kd}u + k]"),
        load_b,
        out_index: format!("((n / {osz}u) * {cout}u + z * {mg}u + m) * {osz}u + n % {osz}u"),
        bias: bias.map(|b| format!("{b}[z * {mg}u + m]")),
    };
    tiled(k, p, Some(grp), t)
}

/// One thread per output element, looping over its group's input channels and the kernel taps.
fn conv_direct(k: &mut Kernel, node: NodeId, a: &ConvAttrs, grp: &Group, geo: &ConvGeom, (x, w, bias): (String, String, Option<String>)) -> Result<(), String> {
    let g = k.g;
    let nd = g.node(node);
    let xs = g.ty(nd.inputs[0]).shape.clone();
    let ws = g.ty(nd.inputs[1]).shape.clone();
    let ys = g.ty(nd.outputs[0]).shape.clone();
    let (cin, cout, cg) = (xs[1], ws[0], ws[1]);
    let mg = cout / a.group;
    let taps: usize = geo.kernel.iter().product();
    let isz: usize = geo.in_sp.iter().product();
    let osz: usize = geo.out_sp.iter().product();
    let tap = conv_tap(geo, a, "q", "r");
    let mut b = format!(
        "const unsigned q = i % {osz}u, co = (i / {osz}u) % {cout}u, img = i / {};\nconst unsigned gg = co / {mg}u;\nfloat s = 0.0f;\nfor (unsigned ci = 0; ci < {cg}u; ci++) {{\nconst float* xc = {x} + (img * {cin}u + gg * {cg}u + ci) * {isz}u;\nconst float* wc = {w} + (co * {cg}u + ci) * {taps}u;\n#pragma unroll 3\nfor (unsigned r = 0; r < {taps}u; r++) {{\n{tap}if (ok) s = fmaf(xc[xo], wc[r], s);\n}}\n}}\n",
        osz * cout
    );
    let value = match bias {
        Some(bb) => format!("s + {bb}[co]"),
        None => "s".to_string(),
    };
    let loaded = ew::loaded_operands(k, grp);
    b.push_str(&ew::operand_offsets(k, &grp.domain, &loaded, "i"));
    b.push_str(&ew::element(k, grp, &loaded, &|o| format!("o{o}"), Some(&value), "i")?);
    k.body.push_str(&b);
    k.per_element(ys.iter().product());
    Ok(())
}

/// ConvTranspose, one thread per output element gathering the inputs that reach it.
pub fn conv_transpose(k: &mut Kernel, node: NodeId, a: &ConvTransposeAttrs) -> Result<(), String> {
    let g = k.g;
    let nd = g.node(node);
    let xs = g.ty(nd.inputs[0]).shape.clone();
    let ws = g.ty(nd.inputs[1]).shape.clone();
    let ys = g.ty(nd.outputs[0]).shape.clone();
    let sp = xs.len() - 2;
    let (c, gr) = (xs[1], a.group);
    let cg = c / gr;
    let mg = ws[1];
    let mo = mg * gr;
    let kernel = &ws[2..];
    let taps: usize = kernel.iter().product();
    let (in_sp, out_sp) = (&xs[2..], &ys[2..]);
    let isz: usize = in_sp.iter().product();
    let osz: usize = out_sp.iter().product();
    let (in_st, out_st, k_st) = (contiguous(in_sp), contiguous(out_sp), contiguous(kernel));
    let x = k.buf(nd.inputs[0], false);
    let w = k.buf(nd.inputs[1], false);
    let bias = if nd.inputs.len() > 2 { Some(k.buf(nd.inputs[2], false)) } else { None };
    let y = k.buf(nd.outputs[0], true);
    let mut b = format!("const unsigned q = i % {osz}u, m = (i / {osz}u) % {mo}u, img = i / {};\nconst unsigned gg = m / {mg}u, co = m % {mg}u;\nfloat s = 0.0f;\n", osz * mo);
    b.push_str(&format!("for (unsigned r = 0; r < {taps}u; r++) {{\nbool ok = true;\nint xo = 0;\n"));
    for d in 0..sp {
        b.push_str(&format!(
            "{{\nconst int od = (int)((q / {}u) % {}u), kd = (int)((r / {}u) % {}u);\nconst int t = od + {} - kd * {};\nconst int id = t / {};\nok = ok && t >= 0 && t % {} == 0 && id < {};\nxo += id * {};\n}}\n",
            out_st[d], out_sp[d], k_st[d], kernel[d], a.pads[d], a.dilations[d], a.strides[d], a.strides[d], in_sp[d], in_st[d]
        ));
    }
    b.push_str(&format!("if (!ok) continue;\nfor (unsigned ci = 0; ci < {cg}u; ci++) s = fmaf({x}[(img * {c}u + gg * {cg}u + ci) * {isz}u + xo], {w}[((gg * {cg}u + ci) * {mg}u + co) * {taps}u + r], s);\n}}\n"));
    let add = bias.map(|bb| format!(" + {bb}[m]")).unwrap_or_default();
    b.push_str(&format!("{y}[i] = s{add};\n"));
    k.body.push_str(&b);
    k.per_element(ys.iter().product());
    Ok(())
}

/// An integer MatMul (shape arithmetic that survived folding): one thread per output, wrapping i64 sums.
pub fn matmul_int(k: &mut Kernel, node: NodeId) -> Result<(), String> {
    let g = k.g;
    let nd = g.node(node);
    let (a, bv, o) = (nd.inputs[0], nd.inputs[1], nd.outputs[0]);
    let (sa, sb) = (g.ty(a).shape.clone(), g.ty(bv).shape.clone());
    if sa.len() != 2 || sb.len() != 2 {
        return Err("integer MatMul of rank other than 2 is not supported by the cuda backend".into());
    }
    let d = g.ty(o).dtype;
    if !matches!(d, DType::I64 | DType::I32) {
        return Err(format!("MatMul on {d} is not supported by the cuda backend"));
    }
    let (m, kd, n) = (sa[0], sa[1], sb[1]);
    let (pa, pb, y) = (k.buf(a, false), k.buf(bv, false), k.buf(o, true));
    k.body.push_str(&format!(
        "const unsigned r = i / {n}u, c = i % {n}u;\nunsigned long long s = 0;\nfor (unsigned q = 0; q < {kd}u; q++) s += (unsigned long long)(long long){pa}[r * {kd}u + q] * (unsigned long long)(long long){pb}[q * {n}u + c];\n{y}[i] = ({})(long long)s;\n",
        mem_type(d)
    ));
    k.per_element(m * n);
    Ok(())
}
