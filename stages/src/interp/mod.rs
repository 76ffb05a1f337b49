//! The reference interpreter: the CPU correctness oracle every backend is compared against.
//!
//! Clarity and exactness come first, speed second. Every op follows the semantics documented on
//! [`Op`] (ONNX semantics, normalized attributes) for every IR dtype:
//! - f32 computes in f32 where IEEE operations are already correctly rounded and in f64 for
//!   transcendental functions; f16 and bf16 are widened to f32, computed the same way and rounded (to
//!   nearest even) once per op;
//! - sums, means, variances, softmax denominators and pooling averages accumulate in f64;
//! - MatMul and Conv use a packed SIMD GEMM (`matrixmultiply`) with f32 accumulation, as ONNX Runtime
//!   does, so a BERT-base forward pass takes seconds, not minutes;
//! - ops run one after another, each kernel splitting its work over the caller's rayon pool (`par`) across
//!   independent outputs only (elements, rows, planes, matrices, GEMM blocks aligned to the GEMM's own
//!   tiles), never across one output's accumulation: the bits do not depend on the thread count;
//! - integers use wrapping two's-complement arithmetic; data movement is bit-exact for every dtype.
//!
//! [`eval_op`] runs one op (constant folding and the ONNX importer use it to fold shape subgraphs);
//! [`run_graph`] runs a whole graph, freeing each intermediate after its last use. Inputs are checked
//! with shape inference before any kernel runs, so a kernel only sees inputs it can handle: bad inputs
//! give an [`InterpError`] naming the op (and the node, from `run_graph`), never a panic.

mod attention;
mod conv;
mod elementwise;
mod layout;
mod linalg;
mod movement;
mod nd;
mod par;
mod pool;
mod random;
mod reduce;
mod scan;
mod view;

#[cfg(test)]
mod tests;

pub use random::{int_input_bounds, random_inputs, random_tensor, INT_INPUT_BOUND};
/// Every element of a tensor as f32, borrowed where it is f32 already (calibration reads every value so).
pub(crate) use view::floats;

use crate::ir::{self, channels_first_perm, channels_last_perm, infer_op, Graph, Op, Tensor, TensorType, ValueDef, ValueId, VerifyError};

/// Why an op or a graph could not be evaluated.
#[derive(Debug, thiserror::Error)]
pub enum InterpError {
    /// One op rejected its inputs: types that do not fit the op, an index out of range, an integer
    /// division by zero.
    #[error("{op}: {msg}")]
    Op { op: &'static str, msg: String },
    /// The same, inside a graph: names the node.
    #[error("node '{node}' ({op}): {msg}")]
    Node { node: String, op: &'static str, msg: String },
    #[error("graph '{graph}' takes {expected} inputs ({names}), got {got}")]
    InputCount { graph: String, expected: usize, got: usize, names: String },
    #[error("graph '{graph}' input {index} ('{name}') must be {expected}, got {got}")]
    InputType { graph: String, index: usize, name: String, expected: TensorType, got: TensorType },
    #[error(transparent)]
    InvalidGraph(#[from] VerifyError),
}

/// A kernel's failure, before `eval_op` adds the op name.
#[derive(Debug)]
pub(crate) struct OpError(pub String);

impl OpError {
    pub(crate) fn new(msg: impl Into<String>) -> Self {
        OpError(msg.into())
    }
}

fn one(t: Result<Tensor, OpError>) -> Result<Vec<Tensor>, OpError> {
    t.map(|t| vec![t])
}

/// Dispatches to the kernel; inputs have passed shape inference and `out` are the inferred types.
fn dispatch(op: &Op, x: &[&Tensor], out: &[TensorType]) -> Result<Vec<Tensor>, OpError> {
    use self::{conv as cv, elementwise as ew, movement as mv, pool as pl, reduce as rd};
    let out0 = &out[0].shape;
    match op {
        Op::Identity => Ok(vec![x[0].clone()]),
        Op::Unary(u) => one(ew::unary(*u, x[0])),
        Op::LeakyRelu { alpha } => one(ew::leaky_relu(x[0], *alpha)),
        Op::HardSigmoid { alpha, beta } => one(ew::hard_sigmoid(x[0], *alpha, *beta)),
        Op::Clip { min, max } => one(ew::clip(x[0], *min, *max)),
        Op::Gelu { approximate } => one(ew::gelu(x[0], *approximate)),
        Op::Binary(b) => one(ew::binary(*b, x[0], x[1], out0)),
        Op::Where => one(mv::where_(x[0], x[1], x[2], out0)),
        Op::Cast { to } => one(ew::cast(x[0], *to)),
        Op::MatMul => one(linalg::matmul(x[0], x[1])),
        Op::Conv(a) => one(cv::conv(x[0], x[1], x.get(2).copied(), a, out0)),
        Op::ConvTranspose(a) => one(cv::conv_transpose(x[0], x[1], x.get(2).copied(), a, out0)),
        Op::BatchNorm { epsilon } => one(rd::batch_norm(x[0], [x[1], x[2], x[3], x[4]], *epsilon)),
        Op::MaxPool(p) => one(pl::max_pool(x[0], p, out0)),
        Op::AveragePool { pool, count_include_pad } => one(pl::average_pool(x[0], pool, *count_include_pad, out0)),
        Op::GlobalAveragePool => one(rd::global_average_pool(x[0])),
        Op::Reduce { kind, axes, keepdims } => one(rd::reduce(x[0], *kind, axes, *keepdims)),
        Op::Softmax { axis } => one(rd::softmax(x[0], *axis, false)),
        Op::LogSoftmax { axis } => one(rd::softmax(x[0], *axis, true)),
        Op::LayerNorm { axis, epsilon } => one(rd::layer_norm(x[0], x[1], x.get(2).copied(), *axis, *epsilon)),
        Op::Reshape { shape } => one(mv::reshape(x[0], shape)),
        Op::Transpose { perm } => one(mv::transpose(x[0], perm)),
        Op::Concat { axis } => one(mv::concat(x, *axis)),
        Op::Split { axis, sizes } => mv::split(x[0], *axis, sizes),
        Op::Slice { axes, starts, ends, steps } => one(mv::slice(x[0], axes, starts, ends, steps)),
        Op::Gather { axis } => one(mv::gather(x[0], x[1], *axis)),
        Op::GatherElements { axis } => one(mv::gather_elements(x[0], x[1], *axis)),
        Op::Expand { .. } => one(mv::expand(x[0], out0)),
        Op::Pad { pads, mode, value } => one(mv::pad(x[0], pads, *mode, *value)),
        Op::Tile { repeats } => one(mv::tile(x[0], repeats)),
        Op::Attention(a) => one(attention::attention(a, x)),
        Op::CumSum { axis, exclusive, reverse } => one(scan::cumsum(x[0], *axis, *exclusive, *reverse)),
        Op::GatherND { batch_dims } => one(nd::gather_nd(x[0], x[1], *batch_dims, out0)),
        Op::ScatterND => one(nd::scatter_nd(x[0], x[1], x[2])),
        Op::NhwcConv(_) | Op::NhwcMaxPool(_) => one(channels_last(op, x)),
    }
}

/// A channels-last op as its channels-first twin computes it: the operands of rank 3 or more (image and
/// weight) permuted channels-first, the result permuted back.
fn channels_last(op: &Op, x: &[&Tensor]) -> Result<Tensor, OpError> {
    let first: Vec<Tensor> = x
        .iter()
        .map(|t| if t.shape().len() >= 3 { movement::transpose(t, &channels_first_perm(t.shape().len())) } else { Ok((*t).clone()) })
        .collect::<Result<_, _>>()?;
    let twin = match op {
        Op::NhwcConv(a) => Op::Conv(a.clone()),
        Op::NhwcMaxPool(p) => Op::MaxPool(p.clone()),
        _ => unreachable!("{} is not a channels-last op", op.name()),
    };
    let refs: Vec<&Tensor> = first.iter().collect();
    let types: Vec<&TensorType> = refs.iter().map(|t| &t.ty).collect();
    let out = infer_op(&twin, &types).map_err(|e| OpError::new(e.0))?;
    let y = dispatch(&twin, &refs, &out)?.remove(0);
    movement::transpose(&y, &channels_last_perm(y.shape().len()))
}

/// Evaluates one op on concrete tensors of any supported dtype; returns its outputs in order.
///
/// The inputs are type-checked with [`infer_op`] first (so a wrong arity, dtype or shape is an error,
/// not a panic), and the results are checked against the inferred types.
pub fn eval_op(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>, InterpError> {
    let fail = |msg: String| InterpError::Op { op: op.name(), msg };
    let types: Vec<&TensorType> = inputs.iter().map(|t| &t.ty).collect();
    let expected = infer_op(op, &types).map_err(|e| fail(e.0))?;
    let outputs = dispatch(op, inputs, &expected).map_err(|e| fail(e.0))?;
    if outputs.len() != expected.len() || outputs.iter().zip(&expected).any(|(t, e)| &t.ty != e) {
        let got: Vec<String> = outputs.iter().map(|t| t.ty.to_string()).collect();
        let want: Vec<String> = expected.iter().map(|t| t.to_string()).collect();
        return Err(fail(format!("internal error: produced [{}], inference says [{}]", got.join(", "), want.join(", "))));
    }
    Ok(outputs)
}

/// Runs a graph on `inputs` (in `g.inputs` order) and returns its outputs (in `g.outputs` order).
///
/// The graph is verified first and every input is checked against its declared type. Each
/// intermediate is dropped right after its last consumer runs, so peak memory is the live set, not
/// every activation of the model. Constants are read in place.
pub fn run_graph(g: &Graph, inputs: &[Tensor]) -> Result<Vec<Tensor>, InterpError> {
    run_graph_observed(g, inputs, |_, _| {})
}

/// [`run_graph`], showing `observe` every value a node computes (in execution order) before it is dropped:
/// what calibration uses to find each value's range (`crate::stages::calibrate`).
///
/// The nodes run one after another on a thread of the caller's rayon pool (the caller's thread where it is
/// one), and each kernel splits its work over the pool: started there, a kernel's parallel loop costs no
/// hand-over from outside the pool and back (tens of µs each, several per node).
pub fn run_graph_observed(g: &Graph, inputs: &[Tensor], observe: impl FnMut(ValueId, &Tensor) + Send) -> Result<Vec<Tensor>, InterpError> {
    rayon::scope(|_| run_nodes(g, inputs, observe))
}

fn run_nodes(g: &Graph, inputs: &[Tensor], mut observe: impl FnMut(ValueId, &Tensor)) -> Result<Vec<Tensor>, InterpError> {
    ir::verify(g)?;
    if inputs.len() != g.inputs.len() {
        let names: Vec<&str> = g.inputs.iter().map(|&v| g.value(v).name.as_str()).collect();
        return Err(InterpError::InputCount {
            graph: g.name.clone(),
            expected: g.inputs.len(),
            got: inputs.len(),
            names: names.join(", "),
        });
    }
    let mut env: Vec<Option<Tensor>> = vec![None; g.values.len()];
    for (index, (&v, t)) in g.inputs.iter().zip(inputs).enumerate() {
        let val = g.value(v);
        if t.ty != val.ty {
            return Err(InterpError::InputType {
                graph: g.name.clone(),
                index,
                name: val.name.clone(),
                expected: val.ty.clone(),
                got: t.ty.clone(),
            });
        }
        env[v.index()] = Some(t.clone());
    }
    // Remaining uses per value; graph outputs hold one use that is never released.
    let mut uses = g.use_counts();
    for node in &g.nodes {
        let node_err = |msg: String| InterpError::Node { node: node.name.clone(), op: node.op.name(), msg };
        let mut args: Vec<&Tensor> = Vec::with_capacity(node.inputs.len());
        for &v in &node.inputs {
            let t = match &g.value(v).def {
                ValueDef::Const(t) => Some(t),
                _ => env[v.index()].as_ref(),
            };
            args.push(t.ok_or_else(|| node_err(format!("input '{}' was not computed", g.value(v).name)))?);
        }
        let results = eval_op(&node.op, &args).map_err(|e| match e {
            InterpError::Op { msg, .. } => node_err(msg),
            other => other,
        })?;
        for &v in &node.inputs {
            uses[v.index()] -= 1;
            if uses[v.index()] == 0 {
                env[v.index()] = None;
            }
        }
        for (&o, t) in node.outputs.iter().zip(results) {
            observe(o, &t);
            // An output nobody reads is dropped at once.
            if uses[o.index()] > 0 {
                env[o.index()] = Some(t);
            }
        }
    }
    g.outputs
        .iter()
        .map(|&o| match &g.value(o).def {
            ValueDef::Const(t) => Ok(t.clone()),
            _ => env[o.index()]
                .clone()
                .ok_or_else(|| InterpError::Op { op: "Output", msg: format!("output '{}' was not computed", g.value(o).name) }),
        })
        .collect()
}
