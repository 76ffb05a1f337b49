//! One generated item function: its typed, `restrict`-qualified parameters and its body.
//!
//! Every item of a kernel (a fused loop, a GEMM, a reduction...) becomes a `static void` function whose
//! parameters are the buffers it touches. Passing them as `restrict` parameters tells the C compiler the
//! buffers do not overlap (true by construction: an item never reads a buffer that shares scratch memory
//! with one it writes), which it needs to vectorize; the kernel's entry point calls the items in order.

use super::cexpr::mem_type;
use super::plan::Plan;
use crate::ir::{Graph, ValueId};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Param {
    /// A value's buffer (by alias root).
    Buf { root: ValueId, write: bool },
    /// Item-private scratch of this many bytes.
    Temp { bytes: u64 },
    /// Kernel output `index` (for copies into outputs).
    Out { index: usize },
}

pub struct Func<'a> {
    pub g: &'a Graph,
    pub plan: &'a Plan,
    pub params: Vec<Param>,
    decls: Vec<String>,
    pub body: String,
}

impl<'a> Func<'a> {
    pub fn new(g: &'a Graph, plan: &'a Plan) -> Self {
        Func { g, plan, params: Vec::new(), decls: Vec::new(), body: String::new() }
    }

    /// The parameter name of `v`'s buffer (its alias root's), registering it on first use.
    pub fn buf(&mut self, v: ValueId, write: bool) -> String {
        let root = self.plan.root[v.index()];
        let name = format!("b{}", root.0);
        let ty = mem_type(self.g.ty(root).dtype);
        if let Some(i) = self.params.iter().position(|p| matches!(p, Param::Buf { root: r, .. } if *r == root)) {
            if write {
                self.params[i] = Param::Buf { root, write: true };
                self.decls[i] = format!("{ty}* restrict {name}");
            }
            return name;
        }
        self.params.push(Param::Buf { root, write });
        self.decls.push(format!("{}{ty}* restrict {name}", if write { "" } else { "const " }));
        name
    }

    /// Kernel output `index`'s buffer, of the given element type.
    pub fn out(&mut self, index: usize, ty: &str) -> String {
        let name = format!("o{index}");
        self.params.push(Param::Out { index });
        self.decls.push(format!("{ty}* restrict {name}"));
        name
    }

    /// A private scratch array of `count` elements of C type `ty`; returns its name.
    pub fn temp(&mut self, count: usize, ty: &str, size: usize) -> String {
        let name = format!("t{}", self.params.iter().filter(|p| matches!(p, Param::Temp { .. })).count());
        self.params.push(Param::Temp { bytes: (count.max(1) * size) as u64 });
        self.decls.push(format!("{ty}* restrict {name}"));
        name
    }

    /// The function's source.
    pub fn render(&self, name: &str) -> String {
        let params = if self.decls.is_empty() { "void".to_string() } else { self.decls.join(", ") };
        format!("TSR_KERNEL static void {name}({params}) {{\n{}}}\n", indent(&self.body))
    }
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
