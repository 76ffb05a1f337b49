//! One generated item function: its typed, `restrict`-qualified parameters and its body.
//!
//! Every item of a kernel (a fused loop, a GEMM, a reduction...) becomes a `static void` function whose
//! parameters are the buffers it touches. Passing them as `restrict` parameters tells the C compiler the
//! buffers do not overlap (true by construction: an item never reads a buffer that shares scratch memory
//! with one it writes), which it needs to vectorize; the kernel's entry point calls the items in order.

use crate::backend::lowering::cexpr::mem_type;
use crate::backend::lowering::plan::Plan;
use crate::backend::lowering::text::indent;
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
    /// The item's parallel loops, the k-th called where the body holds [`range_call`]`(k)`.
    ranges: Vec<Range>,
}

/// A parallel loop: `body` for every `var` in `0..n`, in ranges of at least `grain`.
struct Range {
    var: String,
    body: String,
    n: usize,
    grain: usize,
}

/// The least work (elements or multiply-adds) a range of a parallel loop holds: below it, handing rows to
/// another thread costs more than it saves.
pub const PARALLEL_GRAIN: usize = 16384;

/// The most bytes of per-row scratch a parallel loop keeps on its thread's stack (threads of the runtime's
/// pool have rayon's 2 MiB stacks); rows needing more run in order through the item's scratch.
pub const ROW_STACK_BYTES: usize = 64 * 1024;

/// Where the k-th parallel loop's call goes in an item's body until [`Func::render`] knows the item's name
/// and its final parameter list.
fn range_call(k: usize) -> String {
    format!("\u{1}range{k}\u{1}")
}

impl<'a> Func<'a> {
    pub fn new(g: &'a Graph, plan: &'a Plan) -> Self {
        Func { g, plan, params: Vec::new(), decls: Vec::new(), body: String::new(), ranges: Vec::new() }
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

    /// Code running `body` for every `var` in `0..n`, each value independent of the others, in parallel
    /// ranges of at least `grain` on the runtime's threads (`tsr_parallel_for`). The body sees the item's
    /// parameters by their names and `var` as a `long`; its scratch must be its own (a temp of the item is
    /// shared by every thread). Rows finish whole on one thread, so the result does not depend on the
    /// thread count.
    pub fn parallel_for(&mut self, n: usize, grain: usize, var: &str, body: &str) -> String {
        self.ranges.push(Range { var: var.to_string(), body: body.to_string(), n, grain: grain.max(1) });
        format!("{}\n", range_call(self.ranges.len() - 1))
    }

    /// The function's source (preceded by its parallel loops' argument struct and range functions).
    pub fn render(&self, name: &str) -> String {
        let params = if self.decls.is_empty() { "void".to_string() } else { self.decls.join(", ") };
        let mut out = String::new();
        let mut body = self.body.clone();
        if !self.ranges.is_empty() {
            // The parameters travel in a struct; each range function declares them again as `restrict` locals.
            let names: Vec<&str> = self.decls.iter().map(|d| d.rsplit(' ').next().unwrap_or(d)).collect();
            let members: String = self.decls.iter().map(|d| format!("{};\n", d.replace(" restrict ", " "))).collect();
            out.push_str(&format!("struct {name}_args {{\n{}}};\n", indent(&members)));
            let locals: String = self.decls.iter().zip(&names).map(|(d, n)| format!("{d} = a->{n};\n(void){n};\n")).collect();
            for (k, r) in self.ranges.iter().enumerate() {
                let code = format!(
                    "const struct {name}_args* a = (const struct {name}_args*)ctx;\n{locals}for (long {v} = lo; {v} < hi; {v}++) {{\n{}}}\n",
                    r.body,
                    v = r.var
                );
                out.push_str(&format!("TSR_KERNEL static void {name}_range{k}(void* ctx, long lo, long hi) {{\n{}}}\n", indent(&code)));
                let call = format!(
                    "{{\nstruct {name}_args args = {{{}}};\ntsr_parallel_for({}, {}, {name}_range{k}, &args);\n}}",
                    names.join(", "),
                    r.n,
                    r.grain
                );
                body = body.replace(&range_call(k), &call);
            }
        }
        out.push_str(&format!("TSR_KERNEL static void {name}({params}) {{\n{}}}\n", indent(&body)));
        out
    }
}
