//! Structural hashing of graphs and subgraphs.
//!
//! The hash is a Merkle hash over the dataflow: a value's hash covers the op, attributes and types that
//! compute it and, recursively, the hashes of its inputs. Names and node order never enter it, so renaming
//! tensors or listing nodes in another valid order keeps the hash; changing any op, attribute, shape, dtype,
//! edge or constant byte changes it. Like cranelift's incremental cache "stencil", a subgraph's hash treats
//! its boundary inputs as numbered placeholders, so the same partition in two models hashes the same and the
//! caller re-binds concrete values through [`SubgraphSignature::inputs`] / [`SubgraphSignature::outputs`].

use super::graph::{Graph, NodeId, ValueDef, ValueId};
use super::tensor::{Tensor, TensorType};
use std::collections::{BTreeMap, BTreeSet};
use tessera_store::Digest;

/// Bump when anything about the hashed form changes: every key built on it changes with it.
pub const STRUCTURAL_HASH_VERSION: u32 = 1;

/// How constants enter the hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConstMode {
    /// By content digest: a different weight byte gives a different hash (compile and link keys).
    ByContent,
    /// By type only: weight values are ignored (tuning keys, where only shapes and dtypes matter).
    ByType,
    /// Constants of more than this many elements are lifted out: in a subgraph they become boundary inputs
    /// (parameters passed by pointer, so compiled code never depends on weight values); smaller constants stay
    /// inside, by content (a backend may inline them into code).
    LiftLarge(usize),
}

impl ConstMode {
    /// Whether this constant is treated as an input rather than as part of the computation.
    pub fn lifts(self, t: &Tensor) -> bool {
        matches!(self, ConstMode::LiftLarge(n) if t.numel() > n)
    }

    fn tag(self) -> [u8; 9] {
        let (k, n) = match self {
            ConstMode::ByContent => (0u8, 0u64),
            ConstMode::ByType => (1, 0),
            ConstMode::LiftLarge(n) => (2, n as u64),
        };
        let mut b = [k; 9];
        b[1..].copy_from_slice(&n.to_le_bytes());
        b
    }
}

fn const_hash(mode: ConstMode, t: &Tensor) -> H {
    let mut h = blake3::Hasher::new();
    h.update(b"const");
    h_type(&mut h, &t.ty);
    if mode != ConstMode::ByType && !mode.lifts(t) {
        h.update(&t.digest());
    }
    *h.finalize().as_bytes()
}

/// The structural identity of a subgraph and the canonical order of its boundary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubgraphSignature {
    pub digest: Digest,
    /// Values entering the subgraph from outside, in canonical order (placeholder 0, 1, ...).
    pub inputs: Vec<ValueId>,
    /// Values the subgraph provides to the outside, in canonical order.
    pub outputs: Vec<ValueId>,
    /// The subgraph's nodes in canonical order (a topological order independent of names and node order), so
    /// anything generated from the subgraph comes out the same whichever model it was found in.
    pub nodes: Vec<NodeId>,
}

type H = [u8; 32];

fn h_type(h: &mut blake3::Hasher, t: &TensorType) {
    h.update(&postcard::to_stdvec(t).expect("type encodes"));
}

/// Hashes of every value reachable by `nodes` (given in topological order), with boundary values hashed by
/// `leaf`.
fn merkle(g: &Graph, nodes: &[NodeId], mode: ConstMode, leaf: &dyn Fn(ValueId) -> H) -> BTreeMap<ValueId, H> {
    let inside: BTreeSet<NodeId> = nodes.iter().copied().collect();
    let mut vh: BTreeMap<ValueId, H> = BTreeMap::new();
    let value_hash = |v: ValueId, vh: &BTreeMap<ValueId, H>| -> H {
        if let Some(h) = vh.get(&v) {
            return *h;
        }
        let val = g.value(v);
        match &val.def {
            ValueDef::Const(t) if !mode.lifts(t) => const_hash(mode, t),
            ValueDef::Node { node, .. } if inside.contains(node) => unreachable!("inner value hashed before its node"),
            _ => leaf(v),
        }
    };
    for &n in nodes {
        let node = g.node(n);
        let mut h = blake3::Hasher::new();
        h.update(b"node");
        h.update(&postcard::to_stdvec(&node.op).expect("op encodes"));
        h.update(&(node.inputs.len() as u64).to_le_bytes());
        for &i in &node.inputs {
            let ih = value_hash(i, &vh);
            vh.insert(i, ih);
            h.update(&ih);
        }
        let nh = *h.finalize().as_bytes();
        for (k, &o) in node.outputs.iter().enumerate() {
            let mut h = blake3::Hasher::new();
            h.update(b"out");
            h.update(&nh);
            h.update(&(k as u64).to_le_bytes());
            h_type(&mut h, g.ty(o));
            vh.insert(o, *h.finalize().as_bytes());
        }
    }
    vh
}

fn placeholder(index: Option<usize>, t: &TensorType) -> H {
    let mut h = blake3::Hasher::new();
    h.update(b"input");
    if let Some(i) = index {
        h.update(&(i as u64).to_le_bytes());
    }
    h_type(&mut h, t);
    *h.finalize().as_bytes()
}

fn finish(inputs: &[ValueId], outputs: &[ValueId], g: &Graph, vh: &BTreeMap<ValueId, H>, mode: ConstMode) -> Digest {
    let mut h = blake3::Hasher::new();
    h.update(b"tessera.structural");
    h.update(&STRUCTURAL_HASH_VERSION.to_le_bytes());
    h.update(&mode.tag());
    h.update(&(inputs.len() as u64).to_le_bytes());
    for &i in inputs {
        h_type(&mut h, g.ty(i));
    }
    h.update(&(outputs.len() as u64).to_le_bytes());
    for &o in outputs {
        h.update(&vh[&o]);
    }
    Digest::from(h.finalize())
}

/// Structural hash of a whole graph: inputs by position and type, outputs in order, constants by content.
pub fn graph_hash(g: &Graph) -> Digest {
    graph_hash_with(g, ConstMode::ByContent)
}

pub fn graph_hash_with(g: &Graph, mode: ConstMode) -> Digest {
    let nodes: Vec<NodeId> = (0..g.nodes.len() as u32).map(NodeId).collect();
    let pos: BTreeMap<ValueId, usize> = g.inputs.iter().enumerate().map(|(i, &v)| (v, i)).collect();
    // In a whole graph nothing is outside: a lifted constant is hashed by type.
    let leaf = |v: ValueId| match &g.value(v).def {
        ValueDef::Const(t) => const_hash(ConstMode::ByType, t),
        _ => placeholder(Some(pos[&v]), g.ty(v)),
    };
    let mut vh = merkle(g, &nodes, mode, &leaf);
    for &o in g.outputs.iter().chain(&g.inputs) {
        vh.entry(o).or_insert_with(|| match &g.value(o).def {
            ValueDef::Const(t) if mode.lifts(t) => const_hash(ConstMode::ByType, t),
            ValueDef::Const(t) => const_hash(mode, t),
            _ => placeholder(Some(pos[&o]), g.ty(o)),
        });
    }
    finish(&g.inputs, &g.outputs, g, &vh, mode)
}

/// Structural signature of the subgraph made of `nodes` (any order; they must form a subgraph of `g`).
/// Boundary inputs are values used inside and defined outside (graph inputs or outer node outputs; constants
/// are part of the subgraph). Outputs are inner values used outside or listed as graph outputs.
pub fn subgraph_signature(g: &Graph, nodes: &[NodeId], mode: ConstMode) -> SubgraphSignature {
    let mut sorted: Vec<NodeId> = nodes.to_vec();
    sorted.sort();
    sorted.dedup();
    let inside: BTreeSet<NodeId> = sorted.iter().copied().collect();
    let is_boundary = |v: ValueId| match &g.value(v).def {
        ValueDef::Input(_) => true,
        ValueDef::Const(t) => mode.lifts(t),
        ValueDef::Node { node, .. } => !inside.contains(node),
    };

    // Canonical node order, independent of names and of the original node order. Pass 1 hashes bottom-up
    // with anonymous placeholders; a top-down pass then hashes how each value is used (color refinement), so
    // placeholders of the same type are told apart by their context (tanh(a)*b vs tanh(b)*a); pass 3 hashes
    // bottom-up again with those refined placeholders. Ties left after that are structural symmetries, where
    // either choice gives the same digest.
    let anon = |v: ValueId| placeholder(None, g.ty(v));
    let vh1 = merkle(g, &sorted, mode, &anon);
    let down = top_down(g, &sorted, &inside, &vh1);
    let refined = |v: ValueId| -> H {
        let mut h = blake3::Hasher::new();
        h.update(&placeholder(None, g.ty(v)));
        h.update(&down.get(&v).copied().unwrap_or([0; 32]));
        *h.finalize().as_bytes()
    };
    let vh3 = merkle(g, &sorted, mode, &refined);
    let node_key = |n: NodeId| -> H {
        let mut h = blake3::Hasher::new();
        h.update(&vh3[&g.node(n).outputs[0]]);
        for o in &g.node(n).outputs {
            h.update(&down.get(o).copied().unwrap_or([0; 32]));
        }
        *h.finalize().as_bytes()
    };
    let canon = canonical_order(g, &sorted, &inside, &node_key);

    // Boundary inputs numbered by first use in canonical order.
    let mut inputs: Vec<ValueId> = Vec::new();
    for &n in &canon {
        for &i in &g.node(n).inputs {
            if is_boundary(i) && !inputs.contains(&i) {
                inputs.push(i);
            }
        }
    }
    let pos: BTreeMap<ValueId, usize> = inputs.iter().enumerate().map(|(i, &v)| (v, i)).collect();
    let leaf = |v: ValueId| placeholder(Some(pos[&v]), g.ty(v));
    let vh = merkle(g, &canon, mode, &leaf);

    // Outputs: inner values consumed outside the subgraph or exported by the graph.
    let graph_outputs: BTreeSet<ValueId> = g.outputs.iter().copied().collect();
    let mut used_outside: BTreeSet<ValueId> = BTreeSet::new();
    for (ni, node) in g.nodes.iter().enumerate() {
        if !inside.contains(&NodeId(ni as u32)) {
            used_outside.extend(node.inputs.iter().copied());
        }
    }
    let mut outputs: Vec<ValueId> = canon
        .iter()
        .flat_map(|&n| g.node(n).outputs.iter().copied())
        .filter(|v| used_outside.contains(v) || graph_outputs.contains(v))
        .collect();
    outputs.sort_by(|a, b| vh[a].cmp(&vh[b]).then(a.cmp(b)));
    let digest = finish(&inputs, &outputs, g, &vh, mode);
    SubgraphSignature { digest, inputs, outputs, nodes: canon }
}

/// Top-down context hash of every value used inside the subgraph: which (bottom-up) node consumes it at which
/// input slot, recursively, and whether it leaves the subgraph.
fn top_down(g: &Graph, nodes: &[NodeId], inside: &BTreeSet<NodeId>, vh1: &BTreeMap<ValueId, H>) -> BTreeMap<ValueId, H> {
    let mut uses: BTreeMap<ValueId, Vec<H>> = BTreeMap::new();
    let used_outside: BTreeSet<ValueId> = g
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| !inside.contains(&NodeId(*i as u32)))
        .flat_map(|(_, n)| n.inputs.iter().copied())
        .chain(g.outputs.iter().copied())
        .collect();
    let mut down: BTreeMap<ValueId, H> = BTreeMap::new();
    for &n in nodes.iter().rev() {
        let node = g.node(n);
        // The node's context: its own bottom-up hash and the contexts of its outputs.
        let mut h = blake3::Hasher::new();
        h.update(&vh1[&node.outputs[0]]);
        for &o in &node.outputs {
            let mut u = uses.remove(&o).unwrap_or_default();
            if used_outside.contains(&o) {
                u.push([0xff; 32]);
            }
            u.sort();
            let mut vhh = blake3::Hasher::new();
            for x in &u {
                vhh.update(x);
            }
            let d = *vhh.finalize().as_bytes();
            down.insert(o, d);
            h.update(&d);
        }
        let nh = *h.finalize().as_bytes();
        for (slot, &i) in node.inputs.iter().enumerate() {
            let mut uh = blake3::Hasher::new();
            uh.update(&nh);
            uh.update(&(slot as u64).to_le_bytes());
            uses.entry(i).or_default().push(*uh.finalize().as_bytes());
        }
    }
    // Values defined outside the subgraph (placeholders, constants): their uses inside.
    for (v, mut u) in uses {
        u.sort();
        let mut vhh = blake3::Hasher::new();
        for x in &u {
            vhh.update(x);
        }
        down.insert(v, *vhh.finalize().as_bytes());
    }
    down
}

/// Kahn's algorithm over the subgraph, choosing among ready nodes by their refined key (then node id, which only
/// matters between structurally symmetric nodes).
fn canonical_order(g: &Graph, nodes: &[NodeId], inside: &BTreeSet<NodeId>, key: &dyn Fn(NodeId) -> H) -> Vec<NodeId> {
    let mut indeg: BTreeMap<NodeId, usize> = nodes.iter().map(|&n| (n, 0)).collect();
    let mut users: BTreeMap<NodeId, Vec<NodeId>> = BTreeMap::new();
    for &n in nodes {
        for &i in &g.node(n).inputs {
            if let ValueDef::Node { node: p, .. } = g.value(i).def {
                if inside.contains(&p) {
                    *indeg.get_mut(&n).unwrap() += 1;
                    users.entry(p).or_default().push(n);
                }
            }
        }
    }
    let mut ready: BTreeSet<(H, NodeId)> = indeg.iter().filter(|(_, &d)| d == 0).map(|(&n, _)| (key(n), n)).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some((_, n)) = ready.pop_first() {
        order.push(n);
        for &u in users.get(&n).map(|v| v.as_slice()).unwrap_or(&[]) {
            let d = indeg.get_mut(&u).unwrap();
            *d -= 1;
            if *d == 0 {
                ready.insert((key(u), u));
            }
        }
    }
    order
}
