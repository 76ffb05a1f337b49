//! Lowering one kernel graph to one C function `void <symbol>(void* const* args)`.
//!
//! The plan (see [`crate::backend::lowering::plan`]) orders the kernel into items; each item becomes a `static` function with
//! `restrict` buffer parameters, and the entry point binds those parameters to the argument array
//! (`[inputs.., outputs.., scratch]`), to static arrays of the inline constants, and to scratch offsets laid
//! out by liveness (see [`crate::backend::lowering::scratch`]). Everything is emitted in a fixed order from the canonical kernel
//! graph (no hash-map iteration), so equal kernels give byte-identical source.

use crate::backend::lowering::cexpr::{f32_lit, int_lit, mem_type};
use crate::backend::{refuse, Refusal};
use super::func::{Func, Param};
use crate::backend::lowering::plan::{plan, Item, Plan, Storage};
use crate::backend::lowering::scratch::{assign, Request};
use super::{attention, ew, linalg, movement, nd, pool, reduce, scan};
use crate::backend::FunctionInfo;
use crate::ir::{self, DType, Graph, Op, Tensor, ValueId};

/// A lowered kernel: the function's source and its signature.
pub struct Lowered {
    pub source: String,
    pub info: FunctionInfo,
}

fn is_c_identifier(s: &str) -> bool {
    let mut ch = s.chars();
    matches!(ch.next(), Some(c) if c.is_ascii_alphabetic() || c == '_') && ch.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Why a graph cannot be lowered: the first node (or value) whose dtype the backend does not run.
pub fn unsupported(g: &Graph) -> Option<String> {
    let bad = |v: &ValueId| matches!(g.ty(*v).dtype, DType::F16 | DType::BF16);
    let why = |d: DType| format!("{d} tensors are not supported on the CPU (no fp16 arithmetic in the c backend)");
    for node in &g.nodes {
        if let Some(v) = node.inputs.iter().chain(&node.outputs).find(|v| bad(v)) {
            return Some(format!("node '{}' ({}): {}", node.name, node.op.name(), why(g.ty(*v).dtype)));
        }
    }
    g.inputs.iter().chain(&g.outputs).find(|v| bad(v)).map(|v| format!("value '{}': {}", g.value(*v).name, why(g.ty(*v).dtype)))
}

fn const_literal(t: &Tensor) -> String {
    match t.dtype() {
        DType::F32 => f32_lit(t.to_f32_vec()[0]),
        d => int_lit(t.to_i64_vec()[0], d),
    }
}

/// Emits one item's function body; `Err` names the node at fault.
fn emit_item(f: &mut Func, plan: &Plan, item: &Item) -> Result<(), Refusal> {
    let g = f.g;
    match item {
        Item::Group(gid) => {
            let grp = &plan.groups[*gid];
            match grp.anchor {
                None => ew::standalone(f, grp),
                Some(a) => match &g.node(a).op {
                    Op::MatMul => linalg::matmul(f, a, Some(grp)),
                    Op::Conv(attrs) => linalg::conv(f, a, attrs, Some(grp)),
                    op => Err(refuse!("{} cannot anchor a group", op.name())),
                },
            }
        }
        Item::Copy { from, output } => {
            let t = mem_type(g.ty(*from).dtype);
            let to = f.out(*output, t);
            movement::copy_value(f, *from, &to);
            Ok(())
        }
        Item::Node(n) => {
            let node = g.node(*n);
            let at = |e: Refusal| refuse!("node '{}' ({}): {e}", node.name, node.op.name());
            let f32_out = g.ty(node.outputs[0]).dtype == DType::F32;
            match &node.op {
                Op::MatMul if f32_out => linalg::matmul(f, *n, None),
                Op::MatMul => linalg::matmul_int(f, *n),
                Op::Conv(a) => linalg::conv(f, *n, a, None),
                Op::ConvTranspose(a) => linalg::conv_transpose(f, *n, a),
                Op::BatchNorm { epsilon } => reduce::batch_norm(f, *n, *epsilon),
                Op::MaxPool(p) => pool::pool(f, *n, p, None),
                Op::AveragePool { pool: p, count_include_pad } => pool::pool(f, *n, p, Some(*count_include_pad)),
                Op::GlobalAveragePool => {
                    let r = g.ty(node.inputs[0]).rank();
                    reduce::reduce(f, *n, ir::ReduceKind::Mean, &(2..r).collect::<Vec<_>>())
                }
                Op::Reduce { kind, axes, .. } => reduce::reduce(f, *n, *kind, axes),
                Op::Softmax { axis } => reduce::softmax(f, *n, *axis, false),
                Op::LogSoftmax { axis } => reduce::softmax(f, *n, *axis, true),
                Op::LayerNorm { axis, epsilon } => reduce::layer_norm(f, *n, *axis, *epsilon),
                Op::Attention(a) => attention::attention(f, *n, a),
                Op::Transpose { perm } => {
                    movement::transpose(f, *n, perm);
                    Ok(())
                }
                Op::Concat { axis } => {
                    movement::concat(f, *n, *axis);
                    Ok(())
                }
                Op::Split { axis, sizes } => {
                    movement::split(f, *n, *axis, sizes);
                    Ok(())
                }
                Op::Slice { axes, starts, steps, .. } => {
                    movement::slice(f, *n, axes, starts, steps);
                    Ok(())
                }
                Op::Gather { axis } => {
                    movement::gather(f, *n, *axis);
                    Ok(())
                }
                Op::GatherElements { axis } => movement::gather_elements(f, *n, *axis),
                Op::Expand { .. } => {
                    movement::expand(f, *n);
                    Ok(())
                }
                Op::Tile { repeats } => {
                    movement::tile(f, *n, repeats);
                    Ok(())
                }
                Op::Pad { pads, mode, value } => movement::pad(f, *n, pads, *mode, *value, &const_literal),
                Op::CumSum { axis, exclusive, reverse } => {
                    scan::cumsum(f, *n, *axis, *exclusive, *reverse);
                    Ok(())
                }
                Op::GatherND { batch_dims } => {
                    nd::gather_nd(f, *n, *batch_dims);
                    Ok(())
                }
                Op::ScatterND => {
                    nd::scatter_nd(f, *n);
                    Ok(())
                }
                Op::NhwcConv(_) | Op::NhwcMaxPool(_) => Err("channels-last ops run on GPU backends only (their targets' -layout=nhwc)".into()),
                op => Err(refuse!("{} is not planned as a standalone item", op.name())),
            }
            .map_err(at)
        }
    }
}

/// The static array holding an inline constant.
fn const_array(name: &str, t: &Tensor) -> String {
    let n = t.numel().max(1);
    match t.dtype() {
        DType::F32 => {
            let bits: Vec<String> = t.bytes().chunks_exact(4).map(|c| format!("0x{:08x}u", u32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect();
            let bits = if bits.is_empty() { "0".to_string() } else { bits.join(", ") };
            format!("static const union {{ uint32_t u[{n}]; float f[{n}]; }} {name} = {{{{{bits}}}}};\n")
        }
        d => {
            let vals: Vec<String> = t.to_i64_vec().iter().map(|&v| int_lit(v, d)).collect();
            let vals = if vals.is_empty() { "0".to_string() } else { vals.join(", ") };
            format!("static const {} {name}[{n}] = {{{vals}}};\n", mem_type(d))
        }
    }
}

pub fn lower(g: &Graph, symbol: &str) -> Result<Lowered, Refusal> {
    if !is_c_identifier(symbol) {
        return Err(refuse!("symbol '{symbol}' is not a C identifier"));
    }
    ir::verify(g).map_err(|e| e.to_string())?;
    if let Some(why) = unsupported(g) {
        return Err(why.into());
    }
    let plan = plan(g);
    let (n_in, n_out) = (g.inputs.len(), g.outputs.len());

    // Item functions.
    let mut funcs: Vec<(String, Vec<Param>)> = Vec::new();
    for (k, item) in plan.items.iter().enumerate() {
        let mut f = Func::new(g, &plan);
        emit_item(&mut f, &plan, item)?;
        funcs.push((f.render(&format!("{symbol}_k{k}")), f.params.clone()));
    }

    // Scratch: value buffers live from the item that writes them to the last item that reads them; item
    // temporaries live during their item only.
    let mut reqs: Vec<Request> = Vec::new();
    let mut value_req: Vec<Option<usize>> = vec![None; g.values.len()];
    for &(root, bytes) in &plan.scratch {
        let start = plan.items.iter().position(|it| plan.writes(g, it).contains(&root)).unwrap_or(0);
        let end = plan.items.iter().rposition(|it| plan.reads(g, it).contains(&root)).unwrap_or(start).max(start);
        value_req[root.index()] = Some(reqs.len());
        reqs.push(Request { bytes, start, end });
    }
    let mut temp_req: Vec<Vec<usize>> = Vec::new();
    for (k, (_, params)) in funcs.iter().enumerate() {
        let mut ids = Vec::new();
        for p in params {
            if let Param::Temp { bytes } = p {
                ids.push(reqs.len());
                reqs.push(Request { bytes: *bytes, start: k, end: k });
            }
        }
        temp_req.push(ids);
    }
    let (offsets, scratch_bytes) = assign(&reqs);

    // Source: constants, items, entry point.
    let mut src = format!("/* tessera c kernel {symbol}: {} nodes, {} items, {scratch_bytes} scratch bytes */\n", g.nodes.len(), plan.items.len());
    let mut consts: Vec<ValueId> = funcs
        .iter()
        .flat_map(|(_, ps)| ps.iter())
        .filter_map(|p| match p {
            Param::Buf { root, .. } if plan.storage[root.index()] == Some(Storage::Const) => Some(*root),
            _ => None,
        })
        .collect();
    consts.sort();
    consts.dedup();
    for &c in &consts {
        let t = g.constant(c).expect("const storage holds a constant");
        src.push_str(&const_array(&format!("{symbol}_c{}", c.0), t));
    }
    for (code, _) in &funcs {
        src.push_str(code);
    }
    src.push_str(&format!("void {symbol}(void* const* args) {{\n"));
    if scratch_bytes > 0 {
        src.push_str(&format!("    unsigned char* const S = (unsigned char*)args[{}];\n", n_in + n_out));
    }
    for (k, (_, params)) in funcs.iter().enumerate() {
        let mut temps = temp_req[k].iter();
        let args: Vec<String> = params
            .iter()
            .map(|p| match p {
                Param::Buf { root, .. } => {
                    let t = mem_type(g.ty(*root).dtype);
                    match plan.storage[root.index()].as_ref().expect("a buffer parameter has storage") {
                        Storage::Input(i) => format!("(const {t}*)args[{i}]"),
                        Storage::Output(j) => format!("({t}*)args[{}]", n_in + j),
                        Storage::Scratch(_) => format!("({t}*)(S + {})", offsets[value_req[root.index()].expect("scratch value has a request")]),
                        Storage::Const if g.ty(*root).dtype == DType::F32 => format!("{symbol}_c{}.f", root.0),
                        Storage::Const => format!("{symbol}_c{}", root.0),
                    }
                }
                Param::Temp { .. } => format!("(void*)(S + {})", offsets[*temps.next().expect("one request per temp")]),
                Param::Out { index } => format!("({}*)args[{}]", mem_type(g.ty(g.outputs[*index]).dtype), n_in + index),
            })
            .collect();
        src.push_str(&format!("    {symbol}_k{k}({});\n", args.join(", ")));
    }
    src.push_str("}\n");

    let info = FunctionInfo {
        symbol: symbol.to_string(),
        inputs: g.inputs.iter().map(|&v| g.ty(v).clone()).collect(),
        outputs: g.outputs.iter().map(|&v| g.ty(v).clone()).collect(),
        scratch_bytes,
    };
    Ok(Lowered { source: src, info })
}
