//! MaxPool and AveragePool over any number of spatial dims, one thread per output element looping over its
//! window (a window is a handful of taps: the work per output is small and the reads are shared through L1).
//! MaxPool lets NaN win; AveragePool divides by the taps inside the input, or inside the padded extent with
//! count_include_pad, as the reference does. Channels-last (`NhwcMaxPool`), consecutive threads take consecutive
//! channels of one position, so a warp's reads of each tap are contiguous.

use crate::backend::{refuse, Refusal};
use super::kernel::{is_float, ld, mem_type, st, Kernel};
use crate::backend::lowering::nest::contiguous;
use crate::ir::{NodeId, PoolAttrs};

/// Statements placing the window of spatial dim `d` for the output position `r` (flat over the output's spatial
/// dims; `stride`, `size`: of dim `d` in them): the output coordinate `o{d}`, the window's first input coordinate
/// `i{d}` and the taps inside the input, `lo{d}..hi{d}`.
fn window(p: &PoolAttrs, d: usize, stride: i64, size: usize, in_size: usize) -> String {
    let (st, pad, dil, kk) = (p.strides[d], p.pads[d], p.dilations[d], p.kernel[d]);
    format!(
        "const int o{d} = (int)((r / {stride}u) % {size}u);\nconst int i{d} = o{d} * {st} - {pad};\n\
            const int lo{d} = i{d} < 0 ? (-i{d} + {dm}) / {dil} : 0;\nint hi{d} = {in_size} - i{d} <= 0 ? 0 : ({in_size} - i{d} + {dm}) / {dil};\n\
            if (hi{d} > {kk}) hi{d} = {kk};\n",
        dm = dil - 1
    )
}

/// A pool (`avg`: None for MaxPool, else AveragePool's count_include_pad); `channels_last`: the image is
/// `[N, spatial.., C]`.
pub fn pool(k: &mut Kernel, node: NodeId, p: &PoolAttrs, avg: Option<bool>, channels_last: bool) -> Result<(), Refusal> {
    let g = k.g;
    let nd = g.node(node);
    let xs = g.ty(nd.inputs[0]).shape.clone();
    let ys = g.ty(nd.outputs[0]).shape.clone();
    let sp = xs.len() - 2;
    let (in_sp, out_sp) = if channels_last { (&xs[1..=sp], &ys[1..=sp]) } else { (&xs[2..], &ys[2..]) };
    let isz: usize = in_sp.iter().product();
    let osz: usize = out_sp.iter().product();
    let (in_st, out_st) = (contiguous(in_sp), contiguous(out_sp));
    let d = g.ty(nd.outputs[0]).dtype;
    if !is_float(d) {
        return Err(refuse!("{} on {d} is not supported by the cuda backend", nd.op.name()));
    }
    let x = k.buf(nd.inputs[0], false);
    let y = k.buf(nd.outputs[0], true);
    // The thread's window origin `xp` and output position `r`; taps `c` elements apart channels-last.
    let (mut b, c) = if channels_last {
        let c = xs[sp + 1];
        let (o, oc) = (osz.max(1), (osz * c).max(1));
        (format!("const unsigned ch = i % {c}u, r = (i / {c}u) % {o}u, img = i / {oc}u;\n\
            const {}* xp = {x} + img * {}u + ch;\n", mem_type(d), isz * c), c as i64)
    } else {
        (format!("const unsigned pl = i / {}u;\nconst unsigned r = i % {}u;\nconst {}* xp = {x} + pl * {isz}u;\n", osz.max(1), osz.max(1), mem_type(d)), 1)
    };
    for d in 0..sp {
        let (dil, kk, size, pe) = (p.dilations[d], p.kernel[d], in_sp[d], p.pads[sp + d]);
        b.push_str(&window(p, d, out_st[d], out_sp[d], size));
        if avg == Some(true) {
            b.push_str(&format!("int ph{d} = {e} - i{d} <= 0 ? 0 : ({e} - i{d} + {dm}) / {dil};\n\
                if (ph{d} > {kk}) ph{d} = {kk};\n", e = size + pe, dm = dil - 1));
        }
    }
    match avg {
        None => b.push_str("float m = -0x1.fffffep+127f;\nbool nan = false;\n"),
        Some(_) => b.push_str("float s = 0.0f;\n"),
    }
    for d in 0..sp {
        b.push_str(&format!("for (int k{d} = lo{d}; k{d} < hi{d}; k{d}++) {{\n"));
    }
    let xi: Vec<String> = (0..sp).map(|d| format!("(i{d} + k{d} * {}) * {}", p.dilations[d], in_st[d] * c)).collect();
    match avg {
        None => b.push_str(&format!("const float v = {};\nnan |= v != v;\nm = v > m ? v : m;\n", ld(d, "xp", &xi.join(" + ")))),
        Some(_) => b.push_str(&format!("s += {};\n", ld(d, "xp", &xi.join(" + ")))),
    }
    for _ in 0..sp {
        b.push_str("}\n");
    }
    match avg {
        None => b.push_str(&format!("{y}[i] = {};\n", st(d, "(nan ? TSR_NAN : m)"))),
        Some(include_pad) => {
            let counts: Vec<String> = (0..sp).map(|d| if include_pad { format!("ph{d}") } else { format!("(hi{d} - lo{d})") }).collect();
            b.push_str(&format!("const int cnt = {};\n{y}[i] = {};\n", counts.join(" * "), st(d, "(cnt <= 0 ? 0.0f : s / (float)cnt)")));
        }
    }
    k.body.push_str(&b);
    k.per_element(ys.iter().product());
    Ok(())
}
