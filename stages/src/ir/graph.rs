//! The dataflow graph: values (graph inputs, constants, node outputs) and nodes kept in topological order.

use super::infer::{infer_op, InferError};
use super::op::Op;
use super::tensor::{Tensor, TensorType};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Index of a value in [`Graph::values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ValueId(pub u32);

/// Index of a node in [`Graph::nodes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// Where a value comes from.
#[derive(Clone, Debug)]
pub enum ValueDef {
    /// The graph input at this position of [`Graph::inputs`].
    Input(usize),
    Const(Tensor),
    /// Output `output` of node `node`.
    Node { node: NodeId, output: usize },
}

#[derive(Clone, Debug)]
pub struct Value {
    /// The name the model gave it (for reports, errors and I/O binding; never hashed).
    pub name: String,
    pub ty: TensorType,
    pub def: ValueDef,
}

#[derive(Clone, Debug)]
pub struct Node {
    /// The name the model gave it (for reports and errors; never hashed).
    pub name: String,
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

/// A static-shaped dataflow graph. Invariant (checked by [`crate::ir::verify`]): every node's inputs are
/// graph inputs, constants or outputs of earlier nodes, so `nodes` is a topological order.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub name: String,
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

/// Building a node failed: shape or dtype inference rejected it. The inference error is in the message, not
/// in `source()`: anyhow's `{:#}` would print it twice (the field is not named `source` for that reason).
#[derive(Debug, thiserror::Error)]
#[error("node '{node}' ({op}): {cause}")]
pub struct BuildError {
    pub node: String,
    pub op: &'static str,
    pub cause: InferError,
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Self {
        Graph { name: name.into(), ..Default::default() }
    }

    pub fn value(&self, id: ValueId) -> &Value {
        &self.values[id.index()]
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    pub fn ty(&self, id: ValueId) -> &TensorType {
        &self.values[id.index()].ty
    }

    /// The constant behind a value, if it is one.
    pub fn constant(&self, id: ValueId) -> Option<&Tensor> {
        match &self.values[id.index()].def {
            ValueDef::Const(t) => Some(t),
            _ => None,
        }
    }

    /// The node producing a value, if any.
    pub fn producer(&self, id: ValueId) -> Option<NodeId> {
        match self.values[id.index()].def {
            ValueDef::Node { node, .. } => Some(node),
            _ => None,
        }
    }

    fn push_value(&mut self, name: String, ty: TensorType, def: ValueDef) -> ValueId {
        let id = ValueId(self.values.len() as u32);
        self.values.push(Value { name, ty, def });
        id
    }

    /// Declares the next graph input.
    pub fn add_input(&mut self, name: impl Into<String>, ty: TensorType) -> ValueId {
        let pos = self.inputs.len();
        let id = self.push_value(name.into(), ty, ValueDef::Input(pos));
        self.inputs.push(id);
        id
    }

    pub fn add_const(&mut self, name: impl Into<String>, t: Tensor) -> ValueId {
        let ty = t.ty.clone();
        self.push_value(name.into(), ty, ValueDef::Const(t))
    }

    /// Appends a node, inferring its output types. Outputs are named `<name>` (one output) or `<name>:<i>`.
    pub fn add_node(&mut self, name: impl Into<String>, op: Op, inputs: &[ValueId]) -> Result<Vec<ValueId>, BuildError> {
        let name = name.into();
        let out_names: Vec<String> = match op.num_outputs() {
            1 => vec![name.clone()],
            n => (0..n).map(|i| format!("{name}:{i}")).collect(),
        };
        self.add_node_named(name, op, inputs, out_names)
    }

    /// Appends a node whose outputs get the given names.
    pub fn add_node_named(
        &mut self,
        name: impl Into<String>,
        op: Op,
        inputs: &[ValueId],
        output_names: Vec<String>,
    ) -> Result<Vec<ValueId>, BuildError> {
        let name = name.into();
        let in_types: Vec<&TensorType> = inputs.iter().map(|&v| self.ty(v)).collect();
        let out_types = infer_op(&op, &in_types).map_err(|cause| BuildError { node: name.clone(), op: op.name(), cause })?;
        if out_types.len() != output_names.len() {
            return Err(BuildError {
                node: name,
                op: op.name(),
                cause: InferError::new(format!("{} outputs named, op has {}", output_names.len(), out_types.len())),
            });
        }
        let node = NodeId(self.nodes.len() as u32);
        let outputs: Vec<ValueId> = out_types
            .into_iter()
            .zip(output_names)
            .enumerate()
            .map(|(i, (ty, n))| self.push_value(n, ty, ValueDef::Node { node, output: i }))
            .collect();
        self.nodes.push(Node { name, op, inputs: inputs.to_vec(), outputs: outputs.clone() });
        Ok(outputs)
    }

    /// Appends a single-output node and returns its output.
    pub fn add(&mut self, name: impl Into<String>, op: Op, inputs: &[ValueId]) -> Result<ValueId, BuildError> {
        Ok(self.add_node(name, op, inputs)?[0])
    }

    /// Number of uses of each value (node inputs plus graph outputs).
    pub fn use_counts(&self) -> Vec<usize> {
        let mut uses = vec![0usize; self.values.len()];
        for n in &self.nodes {
            for &i in &n.inputs {
                uses[i.index()] += 1;
            }
        }
        for &o in &self.outputs {
            uses[o.index()] += 1;
        }
        uses
    }

    /// For each value, the nodes that consume it (in node order, a node listed once per use).
    pub fn consumers(&self) -> Vec<Vec<NodeId>> {
        let mut c = vec![Vec::new(); self.values.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for &v in &n.inputs {
                c[v.index()].push(NodeId(i as u32));
            }
        }
        c
    }

    /// Replaces every use of `from` (node inputs and graph outputs) by `to`. A graph output keeps its name:
    /// `to` is renamed to it when `from` was an output, so I/O binding by name survives rewrites.
    pub fn replace_uses(&mut self, from: ValueId, to: ValueId) {
        for n in &mut self.nodes {
            for i in &mut n.inputs {
                if *i == from {
                    *i = to;
                }
            }
        }
        let mut was_output = false;
        for o in &mut self.outputs {
            if *o == from {
                *o = to;
                was_output = true;
            }
        }
        if was_output && !matches!(self.values[to.index()].def, ValueDef::Input(_)) {
            self.values[to.index()].name = self.values[from.index()].name.clone();
        }
    }

    /// Rebuilds the graph keeping only nodes that reach an output and values still referenced, with nodes in a
    /// topological order that preserves the existing relative order where it is already valid. Passes mutate
    /// freely (replace uses, push new nodes at the end) and call this once afterwards.
    pub fn compact(&mut self) {
        let n = self.nodes.len();
        // Liveness: walk back from outputs.
        let mut live_node = vec![false; n];
        let mut live_value = vec![false; self.values.len()];
        let mut stack: Vec<ValueId> = self.outputs.clone();
        for &i in &self.inputs {
            live_value[i.index()] = true;
        }
        while let Some(v) = stack.pop() {
            if live_value[v.index()] && !matches!(self.values[v.index()].def, ValueDef::Input(_)) {
                continue;
            }
            live_value[v.index()] = true;
            if let ValueDef::Node { node, .. } = self.values[v.index()].def {
                if !live_node[node.index()] {
                    live_node[node.index()] = true;
                    stack.extend(self.nodes[node.index()].inputs.iter().copied());
                }
            }
        }
        // Topological order: repeatedly emit, in index order, nodes whose producers are emitted (stable Kahn).
        let mut order = Vec::with_capacity(n);
        let mut indegree = vec![0usize; n];
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, node) in self.nodes.iter().enumerate() {
            if !live_node[i] {
                continue;
            }
            for &v in &node.inputs {
                if let ValueDef::Node { node: p, .. } = self.values[v.index()].def {
                    indegree[i] += 1;
                    users[p.index()].push(i);
                }
            }
        }
        let mut ready: std::collections::BTreeSet<usize> = (0..n).filter(|&i| live_node[i] && indegree[i] == 0).collect();
        while let Some(i) = ready.pop_first() {
            order.push(i);
            for &u in &users[i] {
                indegree[u] -= 1;
                if indegree[u] == 0 {
                    ready.insert(u);
                }
            }
        }
        assert_eq!(order.len(), live_node.iter().filter(|&&l| l).count(), "compact: graph has a cycle");

        // Renumber values: inputs first (in input order), then constants and node outputs in first-use order.
        let mut new_id = vec![u32::MAX; self.values.len()];
        let mut values = Vec::new();
        let take = |v: ValueId, values: &mut Vec<Value>, new_id: &mut Vec<u32>| {
            if new_id[v.index()] == u32::MAX {
                new_id[v.index()] = values.len() as u32;
                values.push(self.values[v.index()].clone());
            }
        };
        for &i in &self.inputs {
            take(i, &mut values, &mut new_id);
        }
        for &ni in &order {
            for &v in &self.nodes[ni].inputs {
                take(v, &mut values, &mut new_id);
            }
            for &v in &self.nodes[ni].outputs {
                take(v, &mut values, &mut new_id);
            }
        }
        for &o in &self.outputs {
            take(o, &mut values, &mut new_id);
        }
        let map = |v: ValueId| ValueId(new_id[v.index()]);
        let mut nodes = Vec::with_capacity(order.len());
        for (new_index, &ni) in order.iter().enumerate() {
            let old = &self.nodes[ni];
            let node = Node {
                name: old.name.clone(),
                op: old.op.clone(),
                inputs: old.inputs.iter().map(|&v| map(v)).collect(),
                outputs: old.outputs.iter().map(|&v| map(v)).collect(),
            };
            for (k, &o) in node.outputs.iter().enumerate() {
                values[o.index()].def = ValueDef::Node { node: NodeId(new_index as u32), output: k };
            }
            nodes.push(node);
        }
        self.inputs = self.inputs.iter().map(|&v| map(v)).collect();
        self.outputs = self.outputs.iter().map(|&v| map(v)).collect();
        self.values = values;
        self.nodes = nodes;
    }

    /// Total bytes of constant data.
    pub fn constant_bytes(&self) -> usize {
        self.values.iter().filter_map(|v| match &v.def {
            ValueDef::Const(t) => Some(t.bytes().len()),
            _ => None,
        }).sum()
    }
}
