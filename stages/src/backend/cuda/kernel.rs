//! One generated CUDA kernel (`extern "C" __global__`): its pointer parameters, which function arguments
//! they bind to, its body and its launch configuration.
//!
//! Each plan item of a partition (see `backend/lowering/plan.rs`, shared with the `c` backend: the fusion decisions
//! do not depend on the device) becomes one or more kernels. A kernel's parameters are the buffers it
//! touches, by alias root, `__restrict__`-qualified (an item never reads memory it writes); shapes and
//! strides are compile-time constants in its body, so index arithmetic divides by constants only.

use crate::backend::lowering::cexpr::{f32_lit, int_lit};
use crate::backend::lowering::plan::Plan;
use crate::ir::{DType, Graph, ValueId};

/// Threads per block of the one-thread-per-element kernels.
pub const EW_BLOCK: u32 = 256;

/// The CUDA type of an element in memory (f16 as `__half`, from cuda_fp16.h; bf16 as `__nv_bfloat16`, from
/// cuda_bf16.h).
pub fn mem_type(d: DType) -> &'static str {
    match d {
        DType::F16 => "__half",
        DType::BF16 => "__nv_bfloat16",
        d => crate::backend::lowering::cexpr::mem_type(d),
    }
}

/// Whether `d` is a 16-bit float (f16 or bf16): a storage type, loaded into and computed as fp32, whose GEMMs
/// and attention run on tensor cores.
pub fn is_half(d: DType) -> bool {
    matches!(d, DType::F16 | DType::BF16)
}

/// The dtype an element computes in once loaded: f16 and bf16 are storage types, arithmetic is fp32.
pub fn compute_dtype(d: DType) -> DType {
    if is_half(d) {
        DType::F32
    } else {
        d
    }
}

/// Element `idx` of buffer `p` holding `d`, as the value arithmetic uses (f16 and bf16 widened to float,
/// bools normalized to 0/1).
pub fn ld(d: DType, p: &str, idx: &str) -> String {
    match d {
        DType::F16 => format!("__half2float({p}[{idx}])"),
        DType::BF16 => format!("__bfloat162float({p}[{idx}])"),
        d => crate::backend::lowering::cexpr::load(d, p, idx),
    }
}

/// Computed value `v` as stored in a `d` buffer (f16 and bf16 rounded to nearest even).
pub fn st(d: DType, v: &str) -> String {
    match d {
        DType::F16 => format!("__float2half_rn({v})"),
        DType::BF16 => format!("__float2bfloat16_rn({v})"),
        _ => v.to_string(),
    }
}

/// A zero of type `d` as stored (for out-of-range gathers and padding).
pub fn zero(d: DType) -> String {
    match d {
        DType::F16 => "__ushort_as_half((unsigned short)0)".to_string(),
        DType::BF16 => "__ushort_as_bfloat16((unsigned short)0)".to_string(),
        d => format!("({})0", mem_type(d)),
    }
}

/// Whether floating-point values of `d` run here (fp32, or fp16 / bf16 storage with fp32 arithmetic).
pub fn is_float(d: DType) -> bool {
    d == DType::F32 || is_half(d)
}

/// What a kernel parameter points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    /// A value's buffer, by alias root.
    Root(ValueId),
    /// The partition's output `j` (for copies into an output listed twice, or of an input).
    Output(usize),
    /// Item-private scratch number `id` (shared by the kernels of one item, e.g. split-K partial sums).
    Temp(u32),
}

/// A kernel under construction.
pub struct Kernel<'a> {
    pub g: &'a Graph,
    pub plan: &'a Plan,
    /// Buffer parameters: what each binds to and whether the kernel writes it.
    pub params: Vec<(Binding, bool)>,
    /// Inline constants the body reads (emitted once per kernel source as `__device__` arrays).
    pub consts: Vec<ValueId>,
    pub body: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
    /// Name prefix of the partition's symbols (for constant arrays).
    pub symbol: &'a str,
    /// Bytes of each item-private scratch buffer this kernel uses, by id.
    pub temps: Vec<(u32, u64)>,
    /// How GEMMs choose their schedule (the tuning space's knobs).
    pub knobs: super::knobs::Knobs,
    /// Blocks per SM the kernel is compiled to fit (`__launch_bounds__`' second argument), where the compiler's
    /// own register choice is known to be slower; 0 leaves it to the compiler.
    pub min_blocks: u32,
}

impl<'a> Kernel<'a> {
    pub fn new(g: &'a Graph, plan: &'a Plan, symbol: &'a str) -> Kernel<'a> {
        Kernel {
            g,
            plan,
            params: Vec::new(),
            consts: Vec::new(),
            body: String::new(),
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_bytes: 0,
            symbol,
            temps: Vec::new(),
            knobs: Default::default(),
            min_blocks: 0,
        }
    }

    /// The expression naming `v`'s buffer (its alias root's): a parameter or an inline constant array.
    pub fn buf(&mut self, v: ValueId, write: bool) -> String {
        let root = self.plan.root[v.index()];
        if matches!(self.plan.storage[root.index()], Some(crate::backend::lowering::plan::Storage::Const)) && !write {
            if !self.consts.contains(&root) {
                self.consts.push(root);
            }
            return const_name(self.symbol, root, self.g.ty(root).dtype);
        }
        self.bind(Binding::Root(root), write)
    }

    /// The parameter of partition output `j`, written.
    pub fn output(&mut self, j: usize) -> String {
        self.bind(Binding::Output(j), true)
    }

    /// Item-private f32 scratch `id` of `count` elements (the same id in another kernel of the item is the
    /// same memory).
    pub fn temp(&mut self, id: u32, count: usize) -> String {
        let bytes = (count.max(1) * 4) as u64;
        match self.temps.iter_mut().find(|(i, _)| *i == id) {
            Some(t) => t.1 = t.1.max(bytes),
            None => self.temps.push((id, bytes)),
        }
        self.bind(Binding::Temp(id), true)
    }

    fn bind(&mut self, b: Binding, write: bool) -> String {
        match self.params.iter().position(|(r, _)| *r == b) {
            Some(i) => {
                self.params[i].1 |= write;
                format!("p{i}")
            }
            None => {
                self.params.push((b, write));
                format!("p{}", self.params.len() - 1)
            }
        }
    }

    fn dtype(&self, b: Binding) -> DType {
        match b {
            Binding::Root(v) => self.g.ty(v).dtype,
            Binding::Output(j) => self.g.ty(self.g.outputs[j]).dtype,
            Binding::Temp(_) => DType::F32,
        }
    }

    /// One thread per element of an `n`-element domain, in blocks of [`EW_BLOCK`]; the body sees the flat
    /// index as `i` and has returned for threads past the end.
    pub fn per_element(&mut self, n: usize) {
        let blocks = n.div_ceil(EW_BLOCK as usize).max(1);
        self.block = [EW_BLOCK, 1, 1];
        self.grid = [blocks as u32, 1, 1];
        self.body.insert_str(0, &format!("const unsigned i = blockIdx.x * {EW_BLOCK}u + threadIdx.x;\nif (i >= {n}u) return;\n"));
    }

    /// The kernel's source, named `name`.
    pub fn render(&self, name: &str) -> String {
        let params: Vec<String> = self
            .params
            .iter()
            .enumerate()
            .map(|(i, (b, write))| format!("{}{}* __restrict__ p{i}", if *write { "" } else { "const " }, mem_type(self.dtype(*b))))
            .collect();
        let threads = self.block.iter().product::<u32>();
        let bounds = if self.min_blocks > 0 { format!("{threads}, {}", self.min_blocks) } else { threads.to_string() };
        format!(
            "extern \"C\" __global__ void __launch_bounds__({bounds}) {name}({}) {{\n{}}}\n",
            params.join(", "),
            crate::backend::lowering::text::indent(&self.body)
        )
    }
}

/// The name under which an inline constant is read.
pub fn const_name(symbol: &str, root: ValueId, d: DType) -> String {
    match d {
        DType::F32 => format!("((const float*){symbol}_c{})", root.0),
        DType::F16 | DType::BF16 => format!("((const {}*){symbol}_c{})", mem_type(d), root.0),
        _ => format!("{symbol}_c{}", root.0),
    }
}

/// The `__device__` array of an inline constant (floats by their bits, so NaN and -0 survive).
pub fn const_array(symbol: &str, root: ValueId, t: &crate::ir::Tensor) -> String {
    let n = t.numel().max(1);
    match t.dtype() {
        DType::F32 => {
            let bits: Vec<String> = t.bytes().chunks_exact(4).map(|c| format!("0x{:08x}u", u32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect();
            let bits = if bits.is_empty() { "0u".to_string() } else { bits.join(", ") };
            format!("__device__ const unsigned {symbol}_c{}[{n}] = {{{bits}}};\n", root.0)
        }
        DType::F16 | DType::BF16 => {
            let bits: Vec<String> = t.bytes().chunks_exact(2).map(|c| format!("0x{:04x}u", u16::from_le_bytes([c[0], c[1]]))).collect();
            let bits = if bits.is_empty() { "0u".to_string() } else { bits.join(", ") };
            format!("__device__ __align__(16) const unsigned short {symbol}_c{}[{n}] = {{{bits}}};\n", root.0)
        }
        d => {
            let vals: Vec<String> = t.to_i64_vec().iter().map(|&v| int_lit(v, d)).collect();
            let vals = if vals.is_empty() { "0".to_string() } else { vals.join(", ") };
            format!("__device__ const {} {symbol}_c{}[{n}] = {{{vals}}};\n", mem_type(d), root.0)
        }
    }
}

/// The literal of a one-element constant.
pub fn scalar_literal(t: &crate::ir::Tensor) -> String {
    match t.dtype() {
        DType::F32 | DType::F16 | DType::BF16 => f32_lit(t.to_f32_vec()[0]),
        d => int_lit(t.to_i64_vec()[0], d),
    }
}

/// Statements decomposing flat index `flat` over `dims` (row-major) into coordinates `{prefix}0..`; only
/// the coordinates some operand uses (`used[d]`) are computed.
pub fn coords(dims: &[usize], flat: &str, prefix: &str, used: &[bool]) -> String {
    let mut s = String::new();
    let mut stride = 1usize;
    let mut strides = vec![0usize; dims.len()];
    for d in (0..dims.len()).rev() {
        strides[d] = stride;
        stride *= dims[d];
    }
    for d in 0..dims.len() {
        if !used[d] {
            continue;
        }
        let q = if strides[d] == 1 { flat.to_string() } else { format!("({flat} / {}u)", strides[d]) };
        let e = if d == 0 { q } else { format!("({q} % {}u)", dims[d]) };
        s.push_str(&format!("const unsigned {prefix}{d} = {e};\n"));
    }
    s
}

/// `sum(coord_d * stride_d)` over dims with a non-zero stride (as an unsigned expression; `0u` if none).
pub fn offset(prefix: &str, strides: &[i64]) -> String {
    let terms: Vec<String> = strides
        .iter()
        .enumerate()
        .filter(|(_, &s)| s != 0)
        .map(|(d, &s)| match s {
            1 => format!("{prefix}{d}"),
            // Unsigned arithmetic wraps: a negative stride is exact modulo 2^32, and offsets are in range.
            s if s < 0 => format!("{prefix}{d} * (unsigned)({s})"),
            s => format!("{prefix}{d} * {s}u"),
        })
        .collect();
    if terms.is_empty() {
        "0u".to_string()
    } else {
        terms.join(" + ")
    }
}
