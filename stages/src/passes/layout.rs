//! Channels-last layout (`-layout=nhwc` on GPU targets): a model's 2-D convolutions and max pools rewritten to
//! compute on `[N, H, W, C]` values ([`Op::NhwcConv`], [`Op::NhwcMaxPool`]), with the elementwise ops and
//! global average pools between them, so a chain of them passes its values on channels-last and the only
//! transposes left are where the chain meets the rest of the graph (the image entering it, the pooled features
//! leaving it).
//!
//! Why: cuDNN's tensor-core convolutions work on NHWC. Given NCHW tensors, its fp16 kernels transpose their
//! operands in and out on every call (ResNet-50 at batch 32 spent most of its convolution time there), and
//! a CUTLASS or our own implicit GEMM reads an NHWC image with the reduction dimension (input channels)
//! contiguous.
//!
//! The model's own rank-4 transposes into and out of channels-last (exporters write them around ops that work on
//! the last axis, like ConvNeXt's LayerNorm) are absorbed: between channels-last values they cancel.
//!
//! Each value of the original graph may be held in either form; a form is made when a reader needs it (a
//! constant is permuted here, once, at compile time; anything else by a Transpose node). The graph's interface
//! does not change: its inputs are read, and its outputs returned, as imported, under the same names. A value
//! computed channels-last is named `{name}.nhwc`; its channels-first copy, where one is needed, takes the
//! original name.

use crate::interp::eval_op;
use crate::ir::{channels_first_perm, channels_last_perm, BuildError, DType, Graph, InferError, Op, ReduceKind, ValueDef, ValueId};

/// Both forms of the values of the graph being rewritten.
struct Forms<'g> {
    g: &'g Graph,
    h: Graph,
    /// Each value of `g` as imported (channels-first), where made.
    first: Vec<Option<ValueId>>,
    /// Each rank-4 value of `g` channels-last, where made.
    last: Vec<Option<ValueId>>,
}

impl Forms<'_> {
    fn build_err(&self, node: &str, op: &'static str, msg: String) -> BuildError {
        BuildError { node: node.to_string(), op, cause: InferError::new(msg) }
    }

    /// `v` channels-first: as computed, a constant copied over, or the channels-last form transposed back.
    fn first(&mut self, v: ValueId) -> Result<ValueId, BuildError> {
        if let Some(id) = self.first[v.index()] {
            return Ok(id);
        }
        let val = self.g.value(v);
        let id = match &val.def {
            ValueDef::Const(t) => self.h.add_const(val.name.clone(), t.clone()),
            _ => {
                let from = self.last[v.index()].expect("a value is made in one form before it is read");
                let perm = channels_first_perm(4);
                self.h.add_node_named(format!("{}.to_nchw", val.name), Op::Transpose { perm }, &[from], vec![val.name.clone()])?[0]
            }
        };
        self.first[v.index()] = Some(id);
        Ok(id)
    }

    /// `v` (rank 4) channels-last: as computed, a constant permuted here, or a Transpose of the channels-first
    /// form.
    fn last(&mut self, v: ValueId) -> Result<ValueId, BuildError> {
        if let Some(id) = self.last[v.index()] {
            return Ok(id);
        }
        let val = self.g.value(v);
        let perm = channels_last_perm(4);
        let id = match &val.def {
            ValueDef::Const(t) => {
                let op = Op::Transpose { perm };
                let permuted = eval_op(&op, &[t]).map_err(|e| self.build_err(&val.name, "Transpose", e.to_string()))?.remove(0);
                self.h.add_const(format!("{}.nhwc", val.name), permuted)
            }
            _ => {
                let from = self.first(v)?;
                self.h.add_node_named(format!("{}.to_nhwc", val.name), Op::Transpose { perm }, &[from], vec![format!("{}.nhwc", val.name)])?[0]
            }
        };
        self.last[v.index()] = Some(id);
        Ok(id)
    }

    /// How an operand of an elementwise node computed channels-last reads: rank-4 values channels-last,
    /// constants of lower rank broadcast the same way (`[C, 1, 1]` becomes `[1, 1, 1, C]`), values holding one
    /// element as they are. None: a lower-rank value that is not a constant (its broadcast would need a node).
    fn broadcast_operand(&mut self, v: ValueId) -> Result<Option<ValueId>, BuildError> {
        let ty = self.g.ty(v);
        if ty.rank() == 4 {
            return self.last(v).map(Some);
        }
        if ty.numel() == 1 {
            return self.first(v).map(Some);
        }
        let Some(t) = self.g.constant(v) else { return Ok(None) };
        if ty.rank() > 4 {
            return Ok(None);
        }
        let mut shape = vec![1; 4 - ty.rank()];
        shape.extend(&ty.shape);
        let name = self.g.value(v).name.clone();
        let fail = |e: crate::interp::InterpError| self.build_err(&name, "Transpose", e.to_string());
        let as4 = eval_op(&Op::Reshape { shape }, &[t]).map_err(fail)?.remove(0);
        let permuted = eval_op(&Op::Transpose { perm: channels_last_perm(4) }, &[&as4]).map_err(fail)?.remove(0);
        Ok(Some(self.h.add_const(format!("{name}.nhwc"), permuted)))
    }
}

impl Forms<'_> {
    /// A model's own rank-4 Transpose, absorbed where the layouts make it free (an exported ConvNeXt permutes
    /// to channels-last around each LayerNorm and back): reading a channels-last value, it becomes one
    /// Transpose of that value (none when the permutations cancel); moving channels first
    /// (`channels_first_perm`), its output's channels-last form is its input as it is. False: not absorbed.
    fn transpose_absorbed(&mut self, node: &crate::ir::Node, perm: &[usize]) -> Result<bool, BuildError> {
        let (x, out) = (node.inputs[0], node.outputs[0]);
        if let Some(x_last) = self.last[x.index()] {
            // x = x_last permuted by channels_first_perm (f), so out = x_last permuted by f[perm[j]].
            let f = channels_first_perm(4);
            let composed: Vec<usize> = perm.iter().map(|&p| f[p]).collect();
            let id = if composed == [0, 1, 2, 3] {
                x_last
            } else {
                self.h.add_node_named(node.name.clone(), Op::Transpose { perm: composed }, &[x_last], vec![self.g.value(out).name.clone()])?[0]
            };
            self.first[out.index()] = Some(id);
            return Ok(true);
        }
        if perm == channels_first_perm(4).as_slice() {
            let x_first = self.first(x)?;
            self.last[out.index()] = Some(x_first);
            return Ok(true);
        }
        Ok(false)
    }
}

/// Whether a node computes on a 2-D image (rank 4) in a float type.
fn image_op(g: &Graph, inputs: &[ValueId]) -> bool {
    inputs.first().is_some_and(|&x| g.ty(x).rank() == 4 && matches!(g.ty(x).dtype, DType::F32 | DType::F16 | DType::BF16))
}

/// `g` with its 2-D convolutions, max pools and the elementwise ops and global average pools between them
/// computing channels-last (see the module documentation). A graph without a 2-D convolution comes back
/// unchanged.
pub fn to_channels_last(g: &Graph) -> Result<Graph, BuildError> {
    if !g.nodes.iter().any(|n| matches!(n.op, Op::Conv(_)) && image_op(g, &n.inputs)) {
        return Ok(g.clone());
    }
    let n = g.values.len();
    let mut f = Forms { g, h: Graph::new(g.name.clone()), first: vec![None; n], last: vec![None; n] };
    for &v in &g.inputs {
        let val = g.value(v);
        f.first[v.index()] = Some(f.h.add_input(val.name.clone(), val.ty.clone()));
    }
    let is_output: Vec<bool> = (0..n).map(|i| g.outputs.iter().any(|o| o.index() == i)).collect();
    for node in &g.nodes {
        let out = node.outputs[0];
        if let Op::Transpose { perm } = &node.op {
            if perm.len() == 4 && !is_output[out.index()] && f.transpose_absorbed(node, perm)? {
                continue;
            }
        }
        let out_name = format!("{}.nhwc", g.value(out).name);
        let has_last = |f: &Forms, v: ValueId| f.last[v.index()].is_some();
        let channels_last: Option<(Op, Vec<ValueId>)> = match &node.op {
            Op::Conv(a) if image_op(g, &node.inputs) => {
                let mut ins = vec![f.last(node.inputs[0])?, f.last(node.inputs[1])?];
                if let Some(&b) = node.inputs.get(2) {
                    ins.push(f.first(b)?);
                }
                Some((Op::NhwcConv(a.clone()), ins))
            }
            Op::MaxPool(p) if image_op(g, &node.inputs) && has_last(&f, node.inputs[0]) => Some((Op::NhwcMaxPool(p.clone()), vec![f.last(node.inputs[0])?])),
            Op::GlobalAveragePool if image_op(g, &node.inputs) && has_last(&f, node.inputs[0]) => {
                Some((Op::Reduce { kind: ReduceKind::Mean, axes: vec![1, 2], keepdims: true }, vec![f.last(node.inputs[0])?]))
            }
            op if op.is_elementwise() && g.ty(out).rank() == 4 && node.inputs.iter().any(|&v| has_last(&f, v)) => {
                let mut ins = Vec::with_capacity(node.inputs.len());
                for &v in &node.inputs {
                    match f.broadcast_operand(v)? {
                        Some(id) => ins.push(id),
                        None => break,
                    }
                }
                (ins.len() == node.inputs.len()).then(|| (op.clone(), ins))
            }
            _ => None,
        };
        match channels_last {
            Some((op, ins)) => {
                let id = f.h.add_node_named(node.name.clone(), op, &ins, vec![out_name])?[0];
                f.last[out.index()] = Some(id);
            }
            None => {
                let ins = node.inputs.iter().map(|&v| f.first(v)).collect::<Result<Vec<_>, _>>()?;
                let names = node.outputs.iter().map(|&o| g.value(o).name.clone()).collect();
                let ids = f.h.add_node_named(node.name.clone(), node.op.clone(), &ins, names)?;
                for (&o, id) in node.outputs.iter().zip(ids) {
                    f.first[o.index()] = Some(id);
                }
            }
        }
    }
    let outputs = g.outputs.iter().map(|&v| f.first(v)).collect::<Result<Vec<_>, _>>()?;
    f.h.outputs = outputs;
    Ok(f.h)
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;

