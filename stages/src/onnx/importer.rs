//! The converters' side of an import: the state of one import ([`Importer`]) and the node being converted
//! ([`NodeCx`]), with the helpers converters read inputs and emit IR through (folding constants eagerly), and
//! the size bounds on what an import may allocate. The driver (`import.rs`) fills it and calls the converters
//! (`ops/`).

use super::attrs::Attrs;
use super::error::{ImportErrorKind, NResult, NodeError};
use super::proto::NodeProto;
use crate::ir::{infer_op, DType, Graph, Op, Tensor, TensorType, ValueId};
use std::collections::BTreeMap;
use std::path::Path;

/// One ONNX node being converted, with what converters need to read it and to name what they emit.
pub struct NodeCx<'a> {
    pub proto: &'a NodeProto,
    pub attrs: Attrs<'a>,
    pub op_type: &'a str,
    /// Base name for the IR nodes it becomes: the ONNX node name, else its first output's name, else `#index`.
    pub base: String,
    /// How many IR nodes it has emitted (suffixes the names of helper nodes).
    pub(super) emitted: std::cell::Cell<usize>,
}

impl NodeCx<'_> {
    /// Number of inputs as written (including empty optional slots).
    pub fn num_inputs(&self) -> usize {
        self.proto.input.len()
    }

    /// Number of named outputs the model asks for.
    pub fn num_outputs(&self) -> usize {
        self.proto.output.len()
    }

    fn next_name(&self) -> String {
        let k = self.emitted.get();
        self.emitted.set(k + 1);
        if k == 0 {
            self.base.clone()
        } else {
            format!("{}/{k}", self.base)
        }
    }
}

/// The state of one import.
pub struct Importer<'a> {
    pub g: Graph,
    /// ONNX value name -> IR value.
    pub(super) env: BTreeMap<String, ValueId>,
    /// Outputs a converter declined to produce (a Dropout mask, BatchNormalization's running statistics):
    /// using one is an error that says why.
    pub(super) unavailable: BTreeMap<String, String>,
    /// The model's default-domain opset version (0: none imported).
    pub opset: i64,
    /// The model's directory, for external data of tensors in attributes (Constant's value).
    pub base_dir: Option<&'a Path>,
    /// ONNX value name -> what defines it ("graph input", "initializer", "node 'n' (Op)"): in SSA form each
    /// name is written once, and a second writer is an error naming both.
    pub(super) defined_by: BTreeMap<String, String>,
    /// The largest constant this import may compute itself (see [`Importer::check_folded`]).
    pub fold_limit: usize,
}

impl<'a> Importer<'a> {
    pub fn ty(&self, v: ValueId) -> &TensorType {
        self.g.ty(v)
    }

    pub fn dtype(&self, v: ValueId) -> DType {
        self.g.ty(v).dtype
    }

    pub fn shape(&self, v: ValueId) -> Vec<usize> {
        self.g.ty(v).shape.clone()
    }

    pub fn rank(&self, v: ValueId) -> usize {
        self.g.ty(v).rank()
    }

    /// The constant behind a value, if it is one (after folding).
    pub fn constant(&self, v: ValueId) -> Option<&Tensor> {
        self.g.constant(v)
    }

    fn lookup(&self, name: &str, what: &str) -> NResult<ValueId> {
        if let Some(&v) = self.env.get(name) {
            return Ok(v);
        }
        if let Some(why) = self.unavailable.get(name) {
            return Err(NodeError::unsupported("unsupported optional output", format!("{what} '{name}' is {why}")));
        }
        Err(NodeError::missing(format!(
            "{what} '{name}' is not a graph input, an initializer or an output of an earlier node"
        )))
    }

    /// Required input `i`.
    pub fn input(&self, n: &NodeCx, i: usize) -> NResult<ValueId> {
        match n.proto.input.get(i).filter(|s| !s.is_empty()) {
            Some(name) => self.lookup(name, &format!("input {i}")),
            None => Err(NodeError::missing(format!("required input {i} is absent ({} given)", n.num_inputs()))),
        }
    }

    /// Optional input `i` (absent or empty name: `None`).
    pub fn opt_input(&self, n: &NodeCx, i: usize) -> NResult<Option<ValueId>> {
        match n.proto.input.get(i).filter(|s| !s.is_empty()) {
            Some(name) => self.lookup(name, &format!("input {i}")).map(Some),
            None => Ok(None),
        }
    }

    /// All present inputs (variadic ops).
    pub fn inputs(&self, n: &NodeCx) -> NResult<Vec<ValueId>> {
        (0..n.num_inputs()).filter_map(|i| self.opt_input(n, i).transpose()).collect()
    }

    /// Input `i`, which must be a constant once folded (a shape-like operand). `what` says what it is.
    pub fn const_input(&self, n: &NodeCx, i: usize, what: &str) -> NResult<Tensor> {
        let v = self.input(n, i)?;
        self.const_value(v, i, what)
    }

    /// Optional constant input.
    pub fn opt_const_input(&self, n: &NodeCx, i: usize, what: &str) -> NResult<Option<Tensor>> {
        match self.opt_input(n, i)? {
            None => Ok(None),
            Some(v) => self.const_value(v, i, what).map(Some),
        }
    }

    fn const_value(&self, v: ValueId, i: usize, what: &str) -> NResult<Tensor> {
        match self.g.constant(v) {
            Some(t) => Ok(t.clone()),
            None => Err(NodeError::not_static(format!(
                "input {i} ('{}', the {what}) is computed at run time; it must be a constant once folded",
                self.g.value(v).name
            ))),
        }
    }

    /// Adds a constant.
    pub fn konst(&mut self, n: &NodeCx, t: Tensor) -> ValueId {
        let name = format!("{}/const{}", n.base, self.g.values.len());
        self.g.add_const(name, t)
    }

    /// A scalar constant of `dtype`.
    pub fn scalar(&mut self, n: &NodeCx, dtype: DType, v: f64) -> ValueId {
        self.konst(n, Tensor::from_f64_as(dtype, Vec::<usize>::new(), &[v]))
    }

    /// Emits a single-output op, folding it when every input is a constant.
    pub fn emit(&mut self, n: &NodeCx, op: Op, inputs: &[ValueId]) -> NResult<ValueId> {
        Ok(self.emit_multi(n, op, inputs)?[0])
    }

    /// Emits an op, folding it when every input is a constant. Folding goes through the reference
    /// interpreter, the same code that defines the op's meaning at run time, so folded and unfolded graphs agree.
    pub fn emit_multi(&mut self, n: &NodeCx, op: Op, inputs: &[ValueId]) -> NResult<Vec<ValueId>> {
        let types: Vec<&TensorType> = inputs.iter().map(|&v| self.g.ty(v)).collect();
        let out_types = infer_op(&op, &types).map_err(|e| NodeError::invalid(format!("{}: {e}", op.name())))?;
        for t in &out_types {
            check_size(&format!("the result of {}", op.name()), &t.shape, t.dtype).map_err(|kind| NodeError { attribute: None, kind })?;
        }
        let consts: Option<Vec<&Tensor>> = inputs.iter().map(|&v| self.g.constant(v)).collect();
        let name = n.next_name();
        if let Some(consts) = consts.filter(|c| !c.is_empty()) {
            if matches!(op, Op::Identity) {
                return Ok(vec![inputs[0]]);
            }
            for t in &out_types {
                self.check_folded(&format!("the result of {}", op.name()), &t.shape, t.dtype)?;
            }
            let outs = fold(&op, &consts).map_err(|e| NodeError::invalid(format!("folding {} over constants failed: {e}", op.name())))?;
            if outs.len() != out_types.len() || outs.iter().zip(&out_types).any(|(t, ty)| &t.ty != ty) {
                return Err(NodeError::invalid(format!(
                    "folding {} gave {:?}, shape inference says {:?}",
                    op.name(),
                    outs.iter().map(|t| t.ty.to_string()).collect::<Vec<_>>(),
                    out_types.iter().map(|t| t.to_string()).collect::<Vec<_>>()
                )));
            }
            return Ok(outs
                .into_iter()
                .enumerate()
                .map(|(i, t)| self.g.add_const(if i == 0 { name.clone() } else { format!("{name}:{i}") }, t))
                .collect());
        }
        self.g.add_node(name, op, inputs).map_err(|e| NodeError::invalid(e.cause.to_string()))
    }

    /// Emits a Reshape unless the shape already matches.
    pub fn reshape(&mut self, n: &NodeCx, v: ValueId, shape: Vec<usize>) -> NResult<ValueId> {
        if self.g.ty(v).shape == shape {
            return Ok(v);
        }
        self.emit(n, Op::Reshape { shape }, &[v])
    }

    /// Emits a Cast unless the dtype already matches.
    pub fn cast(&mut self, n: &NodeCx, v: ValueId, to: DType) -> NResult<ValueId> {
        if self.g.ty(v).dtype == to {
            return Ok(v);
        }
        self.emit(n, Op::Cast { to }, &[v])
    }

    /// Marks output `i` of the node as not produced, with the reason shown if something uses it.
    pub fn decline_output(&mut self, n: &NodeCx, i: usize, why: &str) {
        if let Some(name) = n.proto.output.get(i).filter(|s| !s.is_empty()) {
            self.unavailable.insert(name.clone(), format!("output {i} of {}, which {why}", n.op_type));
        }
    }
}

/// Constant folding of one op, by the reference interpreter.
fn fold(op: &Op, inputs: &[&Tensor]) -> Result<Vec<Tensor>, String> {
    crate::interp::eval_op(op, inputs).map_err(|e| e.to_string())
}
/// Largest tensor the importer accepts (16 GiB): bigger is a corrupt or hostile file, not a model.
pub const MAX_TENSOR_BYTES: usize = 1 << 34;

/// The least bound on a constant the importer computes itself (64 MiB); see [`Importer::check_folded`].
pub const MIN_FOLD_LIMIT: usize = 64 << 20;

impl Importer<'_> {
    /// Rejects a constant about to be computed at import (ConstantOfShape, Range, any op folded over
    /// constants) that is larger than the model justifies, before it is allocated: at most twice the
    /// model's own data (the file plus its initializers), or [`MIN_FOLD_LIMIT`]. Without a bound, a few
    /// numbers in a 100-byte file could ask for gigabytes at import.
    pub fn check_folded(&self, what: &str, dims: &[usize], dtype: DType) -> NResult<()> {
        let bytes = dims.iter().try_fold(dtype.size(), |acc, &d| acc.checked_mul(d));
        match bytes {
            Some(b) if b <= self.fold_limit => Ok(()),
            _ => Err(NodeError {
                attribute: None,
                kind: ImportErrorKind::Unsupported {
                    what: "constant too large to compute at import".into(),
                    detail: format!(
                        "{what} is a constant of shape {dims:?} ({}) computed at import; this model's limit is {} bytes (twice its own data, at least {MIN_FOLD_LIMIT})",
                        bytes.map_or("more than 2^64 bytes".to_string(), |b| format!("{b} bytes")),
                        self.fold_limit
                    ),
                },
            }),
        }
    }
}

/// Rejects shapes whose size overflows or exceeds [`MAX_TENSOR_BYTES`], before any arithmetic on them.
pub fn check_size(what: &str, dims: &[usize], dtype: DType) -> Result<(), ImportErrorKind> {
    let bytes = dims.iter().try_fold(dtype.size(), |acc, &d| acc.checked_mul(d));
    match bytes {
        Some(b) if b <= MAX_TENSOR_BYTES => Ok(()),
        _ => Err(ImportErrorKind::Invalid(format!("{what} of shape {dims:?} is too large"))),
    }
}
