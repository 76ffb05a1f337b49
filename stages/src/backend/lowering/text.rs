//! Source text the code generators share: the scalar math both preludes (`c`'s `prelude.h`, `cuda`'s
//! `prelude.cuh`) splice in, and the indentation of generated bodies.

/// The scalar math the C and CUDA preludes share (`scalar.h` beside this file: erf, softplus, Mish,
/// HardSwish, NaN-propagating min/max, integer division and powers, float -> integer conversions).
pub const SCALAR: &str = include_str!("scalar.h");

/// `prelude` with [`SCALAR`] in place of its line `#include "scalar.h"` (a module is one self-contained
/// source: NVRTC compiles it without headers, and the C toolchain from a temporary file).
pub fn with_scalar(prelude: &str) -> String {
    const LINE: &str = "#include \"scalar.h\"\n";
    assert_eq!(prelude.matches(LINE).count(), 1, "a prelude includes the scalar math once");
    prelude.replacen(LINE, SCALAR, 1)
}

/// Indents every line by four spaces per open brace (the generated code is brace-structured, one statement
/// or brace per line), so the source stays readable.
pub fn indent(code: &str) -> String {
    let mut out = String::with_capacity(code.len() * 2);
    let mut depth: usize = 1;
    for line in code.lines() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let closes = t.starts_with('}');
        if closes {
            depth = depth.saturating_sub(1);
        }
        for _ in 0..depth {
            out.push_str("    ");
        }
        out.push_str(t);
        out.push('\n');
        let opens = t.matches('{').count();
        let shut = t.matches('}').count();
        // The leading brace of a closing line was already counted.
        depth = (depth + opens).saturating_sub(shut - closes as usize);
    }
    out
}
