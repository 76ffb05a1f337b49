//! A serializable form of a graph, with constants by reference, so the pipeline can keep a model's graph in
//! the content-addressed store (structure in one small object, each weight in its own object, deduplicated)
//! and reload it only when a stage actually needs it.

use super::graph::{Graph, Node, NodeId, Value, ValueDef, ValueId};
use super::op::Op;
use super::tensor::{Tensor, TensorType};
use serde::{Deserialize, Serialize};
use tessera_store::Digest;

/// Format version of [`GraphDoc`]: part of every key that stores one.
pub const GRAPH_DOC_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ValueDefDoc {
    Input(u32),
    /// The constant's bytes are the object with this digest.
    Const(Digest),
    Node { node: u32, output: u32 },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ValueDoc {
    pub name: String,
    pub ty: TensorType,
    pub def: ValueDefDoc,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeDoc {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<u32>,
    pub outputs: Vec<u32>,
}

/// A graph with constants replaced by the digests of their bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphDoc {
    pub version: u32,
    pub name: String,
    pub values: Vec<ValueDoc>,
    pub nodes: Vec<NodeDoc>,
    pub inputs: Vec<u32>,
    pub outputs: Vec<u32>,
}

/// Loading a document failed: a constant is missing or has the wrong size.
#[derive(Debug, thiserror::Error)]
#[error("graph '{graph}': {msg}")]
pub struct GraphDocError {
    pub graph: String,
    pub msg: String,
}

impl GraphDoc {
    /// Describes `g`, handing each constant to `put` (which stores its bytes and returns their digest).
    /// `put` runs on every constant at once (rayon): hashing and storing a model's weights is most of the
    /// work; a failing put fails the whole (with one of the errors, should several fail).
    pub fn from_graph<E: Send>(g: &Graph, put: impl Fn(&Tensor) -> Result<Digest, E> + Sync) -> Result<GraphDoc, E> {
        use rayon::prelude::*;
        let mut stored: Vec<Option<Digest>> = g
            .values
            .par_iter()
            .map(|v| match &v.def {
                ValueDef::Const(t) => put(t).map(Some),
                _ => Ok(None),
            })
            .collect::<Result<_, E>>()?;
        let mut values = Vec::with_capacity(g.values.len());
        for (i, v) in g.values.iter().enumerate() {
            let def = match &v.def {
                ValueDef::Input(i) => ValueDefDoc::Input(*i as u32),
                ValueDef::Const(_) => ValueDefDoc::Const(stored[i].take().expect("every constant was stored above")),
                ValueDef::Node { node, output } => ValueDefDoc::Node { node: node.0, output: *output as u32 },
            };
            values.push(ValueDoc { name: v.name.clone(), ty: v.ty.clone(), def });
        }
        Ok(GraphDoc {
            version: GRAPH_DOC_VERSION,
            name: g.name.clone(),
            values,
            nodes: g
                .nodes
                .iter()
                .map(|n| NodeDoc {
                    name: n.name.clone(),
                    op: n.op.clone(),
                    inputs: n.inputs.iter().map(|v| v.0).collect(),
                    outputs: n.outputs.iter().map(|v| v.0).collect(),
                })
                .collect(),
            inputs: g.inputs.iter().map(|v| v.0).collect(),
            outputs: g.outputs.iter().map(|v| v.0).collect(),
        })
    }

    /// The digest of the document's structure: everything but its name and the values of constants of more
    /// than `inline_max` elements (their types stay). Two documents with the same structure are the same model
    /// with other weights (a fine-tune): the partition stage is keyed by it, because nothing it decides reads
    /// such a constant's values (every backend lifts them out of its kernels as arguments, and kernels are
    /// measured on random inputs), so a fine-tune takes its plan and rebinds the constants
    /// ([`crate::partition::plan::ExecPlan::bind`]).
    pub fn structure_digest(&self, inline_max: usize) -> Digest {
        let lifted = Digest::of(b"tessera: a constant lifted out of the structure");
        let values = self
            .values
            .iter()
            .map(|v| match v.def {
                ValueDefDoc::Const(_) if v.ty.numel() > inline_max => ValueDoc { def: ValueDefDoc::Const(lifted), ..v.clone() },
                _ => v.clone(),
            })
            .collect();
        let skeleton = GraphDoc { name: String::new(), values, ..self.clone() };
        Digest::of(&postcard::to_stdvec(&skeleton).expect("a graph document serializes"))
    }

    /// Rebuilds the graph, fetching constant bytes with `get`, and verifies it.
    pub fn to_graph(&self, mut get: impl FnMut(&Digest) -> Result<Vec<u8>, String>) -> Result<Graph, GraphDocError> {
        let fail = |msg: String| GraphDocError { graph: self.name.clone(), msg };
        if self.version != GRAPH_DOC_VERSION {
            return Err(fail(format!("document version {} is not {GRAPH_DOC_VERSION}", self.version)));
        }
        let mut values = Vec::with_capacity(self.values.len());
        for v in &self.values {
            let def = match &v.def {
                ValueDefDoc::Input(i) => ValueDef::Input(*i as usize),
                ValueDefDoc::Const(d) => {
                    let bytes = get(d).map_err(|e| fail(format!("constant '{}' ({d}): {e}", v.name)))?;
                    let t = Tensor::from_bytes(v.ty.clone(), bytes).map_err(|e| fail(format!("constant '{}': {e}", v.name)))?;
                    ValueDef::Const(t)
                }
                ValueDefDoc::Node { node, output } => ValueDef::Node { node: NodeId(*node), output: *output as usize },
            };
            values.push(Value { name: v.name.clone(), ty: v.ty.clone(), def });
        }
        let g = Graph {
            name: self.name.clone(),
            values,
            nodes: self
                .nodes
                .iter()
                .map(|n| Node {
                    name: n.name.clone(),
                    op: n.op.clone(),
                    inputs: n.inputs.iter().map(|&v| ValueId(v)).collect(),
                    outputs: n.outputs.iter().map(|&v| ValueId(v)).collect(),
                })
                .collect(),
            inputs: self.inputs.iter().map(|&v| ValueId(v)).collect(),
            outputs: self.outputs.iter().map(|&v| ValueId(v)).collect(),
        };
        super::verify(&g).map_err(|e| fail(e.msg))?;
        Ok(g)
    }
}

#[cfg(test)]
#[path = "serial_tests.rs"]
mod tests;
