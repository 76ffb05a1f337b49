//! Fusion and buffer planning for one kernel graph.
//!
//! Nodes are visited in topological order and grouped greedily:
//! - Reshape and Identity are aliases: their output shares its input's buffer (no code at all).
//! - An elementwise node joins the *open* groups of its producers that have its output shape (the group's
//!   domain), merging them; otherwise it opens a new group. A group is a single loop over its domain in which
//!   every member value is a C local; a member value is stored only when something outside the group (or the
//!   kernel's output list) reads it.
//! - An f32 MatMul or Conv opens a group *anchored* on it: elementwise consumers of its output with the same
//!   shape join that group and become the GEMM's epilogue (bias, activation, residual...), applied while the
//!   output tile is in registers.
//! - Any other op is an item of its own.
//!
//! A group is open until something outside it consumes one of its values; then it is "closed" and emitted
//! at that point. Because an open group has no outside consumer yet, nothing depends on it, so merging open
//! groups or adding a node to one can never create a cycle, and each group's external inputs are all
//! computed by items emitted before it.

use super::nest::{broadcast, flat_stride};
use crate::ir::{DType, Graph, NodeId, Op, ValueDef, ValueId};

/// A fused loop: elementwise nodes over one domain, optionally fed by an anchor (MatMul/Conv) whose output
/// has that domain.
#[derive(Clone, Debug)]
pub struct Group {
    pub domain: Vec<usize>,
    pub anchor: Option<NodeId>,
    /// Elementwise members in topological order.
    pub nodes: Vec<NodeId>,
    open: bool,
}

/// One step of the kernel, in execution order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// A fused group (see [`Group`]).
    Group(usize),
    /// A standalone op.
    Node(NodeId),
    /// Copies a value into output `output` (a graph input, a constant, or a value already stored elsewhere
    /// that is also listed as a kernel output).
    Copy { from: ValueId, output: usize },
}

/// Where a materialized value lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Storage {
    Input(usize),
    Output(usize),
    /// Scratch buffer number (offsets are assigned later, by liveness).
    Scratch(usize),
    /// An inline constant (a static array in the generated source).
    Const,
}

#[derive(Debug)]
pub struct Plan {
    pub groups: Vec<Group>,
    pub items: Vec<Item>,
    /// Alias root of every value (itself unless it comes from a Reshape or Identity).
    pub root: Vec<ValueId>,
    /// For values computed in a group: that group (anchor outputs included when fused).
    pub group_of: Vec<Option<usize>>,
    /// Per value: must it exist in memory? (Always true for roots outside groups that are read.)
    pub materialized: Vec<bool>,
    /// Storage of each materialized root.
    pub storage: Vec<Option<Storage>>,
    /// Scratch buffers: (root value, bytes), indexed by `Storage::Scratch`.
    pub scratch: Vec<(ValueId, u64)>,
}

impl Group {
    /// A closed group holding only `anchor` (a MatMul or Conv run with no epilogue), over its output.
    pub fn anchored(g: &Graph, anchor: NodeId) -> Group {
        Group { domain: g.ty(g.node(anchor).outputs[0]).shape.clone(), anchor: Some(anchor), nodes: Vec::new(), open: false }
    }
}

fn is_alias(op: &Op) -> bool {
    matches!(op, Op::Reshape { .. } | Op::Identity)
}

fn is_anchor(g: &Graph, n: NodeId) -> bool {
    let node = g.node(n);
    matches!(node.op, Op::MatMul | Op::Conv(_) | Op::NhwcConv(_)) && matches!(g.ty(node.outputs[0]).dtype, DType::F32 | DType::F16 | DType::BF16)
}

struct Planner<'g> {
    g: &'g Graph,
    groups: Vec<Group>,
    items: Vec<Item>,
    group_of: Vec<Option<usize>>,
    /// Open group ids in creation order.
    open: Vec<usize>,
}

impl Planner<'_> {
    fn close(&mut self, gid: usize) {
        if !self.groups[gid].open {
            return;
        }
        self.groups[gid].open = false;
        self.open.retain(|&o| o != gid);
        if let Some(a) = self.groups[gid].anchor {
            if !self.groups[gid].nodes.is_empty() && !epilogue_fusable(self.g, &self.groups[gid], a) {
                // The epilogue cannot be addressed per GEMM tile: run the anchor alone, then the group.
                self.groups[gid].anchor = None;
                self.group_of[self.g.node(a).outputs[0].index()] = None;
                self.items.push(Item::Node(a));
            }
        }
        self.items.push(Item::Group(gid));
    }

    /// Closes the open group producing `v`, if any.
    fn close_producer(&mut self, v: ValueId) {
        if let Some(gid) = self.group_of[v.index()] {
            self.close(gid);
        }
    }

    fn new_group(&mut self, domain: Vec<usize>, anchor: Option<NodeId>) -> usize {
        let gid = self.groups.len();
        self.groups.push(Group { domain, anchor, nodes: Vec::new(), open: true });
        self.open.push(gid);
        gid
    }

    /// Moves every member of `from` into `into`.
    fn merge(&mut self, into: usize, from: usize) {
        let moved = std::mem::take(&mut self.groups[from].nodes);
        for &n in &moved {
            for &o in &self.g.node(n).outputs {
                self.group_of[o.index()] = Some(into);
            }
        }
        self.groups[into].nodes.extend(moved);
        self.groups[into].nodes.sort();
        self.groups[from].open = false;
        self.open.retain(|&o| o != from);
    }

    fn visit(&mut self, n: NodeId) {
        let g = self.g;
        let node = g.node(n);
        if is_alias(&node.op) {
            self.close_producer(node.inputs[0]);
            return;
        }
        if node.op.is_elementwise() {
            let domain = g.ty(node.outputs[0]).shape.clone();
            let mut cands: Vec<usize> = Vec::new();
            for &i in &node.inputs {
                if let Some(gid) = self.group_of[i.index()].filter(|&gid| self.groups[gid].open) {
                    if self.groups[gid].domain == domain {
                        if !cands.contains(&gid) {
                            cands.push(gid);
                        }
                    } else {
                        self.close(gid);
                    }
                }
            }
            cands.sort();
            // At most one anchored group survives; other anchored candidates run on their own first.
            let anchored: Vec<usize> = cands.iter().copied().filter(|&c| self.groups[c].anchor.is_some()).collect();
            for &extra in anchored.iter().skip(1) {
                self.close(extra);
            }
            cands.retain(|c| !anchored[1.min(anchored.len())..].contains(c));
            let target = match anchored.first() {
                Some(&a) => a,
                None => match cands.first() {
                    Some(&c) => c,
                    None => self.new_group(domain, None),
                },
            };
            for &c in &cands {
                if c != target {
                    self.merge(target, c);
                }
            }
            self.groups[target].nodes.push(n);
            self.groups[target].nodes.sort();
            for &o in &node.outputs {
                self.group_of[o.index()] = Some(target);
            }
            return;
        }
        for &i in &node.inputs {
            self.close_producer(i);
        }
        if is_anchor(g, n) {
            let out = node.outputs[0];
            let gid = self.new_group(g.ty(out).shape.clone(), Some(n));
            self.group_of[out.index()] = Some(gid);
        } else {
            self.items.push(Item::Node(n));
        }
    }
}

/// Values read by a group's members that the group does not compute itself.
pub fn group_externals(g: &Graph, grp: &Group) -> Vec<ValueId> {
    let mut inside: Vec<ValueId> = grp.nodes.iter().flat_map(|&n| g.node(n).outputs.iter().copied()).collect();
    if let Some(a) = grp.anchor {
        inside.push(g.node(a).outputs[0]);
    }
    let mut ext: Vec<ValueId> = Vec::new();
    for &n in &grp.nodes {
        for &i in &g.node(n).inputs {
            if !inside.contains(&i) && !ext.contains(&i) {
                ext.push(i);
            }
        }
    }
    ext
}

/// Whether a conv anchor can apply its group as an epilogue: every external operand must walk the spatial
/// (column) dims as one flat run. MatMul epilogues always can (their column part is one dim), and so can
/// channels-last convolutions, which only the `cuda` backend runs (its epilogues index any broadcast from the
/// flat output index).
fn epilogue_fusable(g: &Graph, grp: &Group, anchor: NodeId) -> bool {
    if !matches!(g.node(anchor).op, Op::Conv(_)) {
        return true;
    }
    let d = &grp.domain;
    group_externals(g, grp).iter().all(|&v| {
        let st = broadcast(&g.ty(v).shape, d);
        flat_stride(&d[2..], &st[2..]).is_some()
    })
}

/// Groups the nodes, decides what is stored, and where.
pub fn plan(g: &Graph) -> Plan {
    let nv = g.values.len();
    let mut p = Planner { g, groups: Vec::new(), items: Vec::new(), group_of: vec![None; nv], open: Vec::new() };
    for i in 0..g.nodes.len() {
        p.visit(NodeId(i as u32));
    }
    for gid in p.open.clone() {
        p.close(gid);
    }
    let Planner { groups, mut items, group_of, .. } = p;

    // Alias roots.
    let mut root: Vec<ValueId> = (0..nv as u32).map(ValueId).collect();
    for node in &g.nodes {
        if is_alias(&node.op) {
            root[node.outputs[0].index()] = root[node.inputs[0].index()];
        }
    }

    // Materialization: a group value is stored when read outside its group or listed as an output (through
    // an alias too); every other value that exists is stored.
    let consumers = g.consumers();
    let mut materialized = vec![false; nv];
    let mut output_class = vec![false; nv];
    for &o in &g.outputs {
        output_class[root[o.index()].index()] = true;
    }
    for v in 0..nv {
        let r = root[v].index();
        if r != v {
            continue;
        }
        materialized[v] = match group_of[v] {
            // Inputs always exist; other values only when something reads them (a Split output may not).
            None => matches!(g.values[v].def, ValueDef::Input(_)) || output_class[v] || !consumers[v].is_empty(),
            // An alias (Reshape) of a group value is itself a consumer outside the group.
            Some(gid) => output_class[v] || consumers[v].iter().any(|c| !groups[gid].nodes.contains(c)),
        };
    }

    // Storage: inputs and constants in place; a value listed as an output is computed straight into that
    // output's buffer (its first listing); everything else stored goes to scratch.
    let mut storage: Vec<Option<Storage>> = vec![None; nv];
    for (v, val) in g.values.iter().enumerate() {
        if root[v].index() != v || !materialized[v] {
            continue;
        }
        storage[v] = match val.def {
            ValueDef::Input(i) => Some(Storage::Input(i)),
            ValueDef::Const(_) => Some(Storage::Const),
            ValueDef::Node { .. } => None,
        };
    }
    for (j, &o) in g.outputs.iter().enumerate() {
        let r = root[o.index()];
        if storage[r.index()].is_none() {
            storage[r.index()] = Some(Storage::Output(j));
        } else {
            items.push(Item::Copy { from: o, output: j });
        }
    }
    let mut scratch = Vec::new();
    for v in 0..nv {
        if root[v].index() == v && materialized[v] && storage[v].is_none() {
            storage[v] = Some(Storage::Scratch(scratch.len()));
            scratch.push((ValueId(v as u32), g.values[v].ty.size_bytes() as u64));
        }
    }
    Plan { groups, items, root, group_of, materialized, storage, scratch }
}

impl Plan {
    /// The values each item reads from memory (by alias root), for liveness.
    pub fn reads(&self, g: &Graph, item: &Item) -> Vec<ValueId> {
        let vals: Vec<ValueId> = match item {
            Item::Group(gid) => {
                let grp = &self.groups[*gid];
                let mut v = group_externals(g, grp);
                if let Some(a) = grp.anchor {
                    v.extend(g.node(a).inputs.iter().copied());
                }
                v
            }
            Item::Node(n) => g.node(*n).inputs.clone(),
            Item::Copy { from, .. } => vec![*from],
        };
        let mut roots: Vec<ValueId> = vals.iter().map(|v| self.root[v.index()]).collect();
        roots.sort();
        roots.dedup();
        roots
    }

    /// The roots each item writes.
    pub fn writes(&self, g: &Graph, item: &Item) -> Vec<ValueId> {
        match item {
            Item::Group(gid) => {
                let grp = &self.groups[*gid];
                let mut vals: Vec<ValueId> = grp.nodes.iter().flat_map(|&n| g.node(n).outputs.clone()).collect();
                if let Some(a) = grp.anchor {
                    vals.push(g.node(a).outputs[0]);
                }
                vals.into_iter().filter(|v| self.materialized[v.index()] && self.root[v.index()] == *v).collect()
            }
            Item::Node(n) => g.node(*n).outputs.clone(),
            Item::Copy { .. } => Vec::new(),
        }
    }
}
