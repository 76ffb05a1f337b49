//! MaxPool and AveragePool over any number of spatial dims: per output position, the valid tap range of each
//! dim is computed once (no per-tap bounds checks). MaxPool starts from the lowest finite float and lets NaN
//! win; AveragePool sums in double and divides by the taps inside the input (or inside the padded extent with
//! count_include_pad), as the reference does.

#![allow(clippy::needless_range_loop)]

use super::func::Func;
use super::nest::contiguous;
use crate::ir::{NodeId, PoolAttrs};

pub fn pool(f: &mut Func, node: NodeId, p: &PoolAttrs, avg: Option<bool>) -> Result<(), String> {
    let g = f.g;
    let nd = g.node(node);
    let xs = g.ty(nd.inputs[0]).shape.clone();
    let ys = g.ty(nd.outputs[0]).shape.clone();
    let sp = xs.len() - 2;
    let planes = xs[0] * xs[1];
    let in_sp = &xs[2..];
    let out_sp = &ys[2..];
    let isz: usize = in_sp.iter().product();
    let osz: usize = out_sp.iter().product();
    let (in_st, out_st) = (contiguous(in_sp), contiguous(out_sp));
    let x = f.buf(nd.inputs[0], false);
    let y = f.buf(nd.outputs[0], true);
    let mut c = format!("for (long pl = 0; pl < {planes}; pl++) {{\nconst float* xp = {x} + pl * {isz};\nfloat* yp = {y} + pl * {osz};\n");
    for d in 0..sp {
        let (st, pad, dil, k, size, pe) = (p.strides[d], p.pads[d], p.dilations[d], p.kernel[d], in_sp[d], p.pads[sp + d]);
        c.push_str(&format!(
            "for (long o{d} = 0; o{d} < {}; o{d}++) {{\nconst long i{d} = o{d} * {st} - {pad};\nconst long lo{d} = i{d} < 0 ? (-i{d} + {dm}) / {dil} : 0;\nlong hi{d} = {size} - i{d} <= 0 ? 0 : ({size} - i{d} + {dm}) / {dil};\nif (hi{d} > {k}) hi{d} = {k};\n",
            out_sp[d],
            dm = dil - 1
        ));
        if avg == Some(true) {
            // Taps inside the padded extent [-pad_begin, size + pad_end): all from 0 (i >= -pad_begin always).
            c.push_str(&format!("long ph{d} = {e} - i{d} <= 0 ? 0 : ({e} - i{d} + {dm}) / {dil};\nif (ph{d} > {k}) ph{d} = {k};\n", e = size + pe, dm = dil - 1));
        }
    }
    let oi: Vec<String> = (0..sp).map(|d| format!("o{d} * {}", out_st[d])).collect();
    let xi: Vec<String> = (0..sp).map(|d| format!("(i{d} + k{d} * {}) * {}", p.dilations[d], in_st[d])).collect();
    match avg {
        None => c.push_str("float m = -0x1.fffffep+127f;\nint nan = 0;\n"),
        Some(_) => c.push_str("double s = 0.0;\n"),
    }
    for d in 0..sp {
        c.push_str(&format!("for (long k{d} = lo{d}; k{d} < hi{d}; k{d}++) {{\n"));
    }
    match avg {
        None => c.push_str(&format!("const float v = xp[{}];\nnan |= v != v;\nm = v > m ? v : m;\n", xi.join(" + "))),
        Some(_) => c.push_str(&format!("s += (double)xp[{}];\n", xi.join(" + "))),
    }
    for _ in 0..sp {
        c.push_str("}\n");
    }
    match avg {
        None => c.push_str(&format!("yp[{}] = nan ? __builtin_nanf(\"\") : m;\n", oi.join(" + "))),
        Some(include_pad) => {
            let counts: Vec<String> = (0..sp).map(|d| if include_pad { format!("ph{d}") } else { format!("(hi{d} - lo{d})") }).collect();
            c.push_str(&format!(
                "const long cnt = {};\nyp[{}] = cnt <= 0 ? 0.0f : (float)(s / (double)cnt);\n",
                counts.iter().map(|t| format!("({t} > 0 ? {t} : 0)")).collect::<Vec<_>>().join(" * "),
                oi.join(" + ")
            ));
        }
    }
    for _ in 0..sp {
        c.push_str("}\n");
    }
    c.push_str("}\n");
    f.body.push_str(&c);
    Ok(())
}
