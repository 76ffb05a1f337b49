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
//!
//! A backend whose kernels address some operands through strides ([`plan_with_views`]: the `cuda` backend's
//! tensor-core attention) gets two more decisions:
//! - a value made by movement (Reshape, Transpose, Gather of constant indices, Slice, Split) that only such
//!   operands read is *virtual*: it is not stored, its movement runs no kernel, and its readers address its
//!   source through [`Plan::view`];
//! - such a node's output read only by a Transpose (through Reshapes) is stored straight into the Transpose's
//!   output, through [`Plan::store`], and the Transpose runs no kernel.

use super::nest::{broadcast, flat_stride};
use crate::ir::{movement_view, DType, Graph, NodeId, Op, StridedView, ValueDef, ValueId};

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
    /// Per value: for a virtual value, the value its readers address and where its elements are in it.
    pub view: Vec<Option<(ValueId, StridedView)>>,
    /// Per value: for an output its node stores through a view, the value it is stored into and where.
    pub store: Vec<Option<(ValueId, StridedView)>>,
}

/// Which operands a backend's kernels can read through a strided view (node, input position), and which
/// nodes can store their first output through one.
pub trait Views {
    fn reads_view(&self, g: &Graph, node: NodeId, input: usize) -> bool;
    fn stores_view(&self, g: &Graph, node: NodeId) -> bool;
}

/// Kernels that read and write every value as it is stored.
pub struct NoViews;

impl Views for NoViews {
    fn reads_view(&self, _: &Graph, _: NodeId, _: usize) -> bool {
        false
    }
    fn stores_view(&self, _: &Graph, _: NodeId) -> bool {
        false
    }
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

/// The ops whose outputs a view can say (the steps [`movement_view`] composes).
fn is_movement(op: &Op) -> bool {
    matches!(op, Op::Reshape { .. } | Op::Identity | Op::Transpose { .. } | Op::Gather { .. } | Op::Slice { .. } | Op::Split { .. })
}

/// Virtual values and their views: a movement value is virtual when it is not a graph output and every
/// use of it is either an operand read through a view or the input of a movement node none of whose outputs
/// is stored; the source of each view read must itself be stored. Found by removing values from the
/// candidates until both hold.
fn read_views(g: &Graph, views: &dyn Views) -> Vec<Option<(ValueId, StridedView)>> {
    let nv = g.values.len();
    let consumers = g.consumers();
    let mut is_output = vec![false; nv];
    for &o in &g.outputs {
        is_output[o.index()] = true;
    }
    let movement_made = |v: usize| g.producer(ValueId(v as u32)).is_some_and(|n| is_movement(&g.node(n).op));
    let mut virt: Vec<bool> = (0..nv).map(|v| movement_made(v) && !is_output[v] && !consumers[v].is_empty()).collect();
    loop {
        let mut changed = false;
        for v in 0..nv {
            if !virt[v] {
                continue;
            }
            let fine = consumers[v].iter().all(|&c| {
                let node = g.node(c);
                if is_movement(&node.op) && node.inputs[0].index() == v && node.inputs[1..].iter().all(|i| i.index() != v) {
                    node.outputs.iter().all(|o| virt[o.index()] || (consumers[o.index()].is_empty() && !is_output[o.index()]))
                } else {
                    node.inputs.iter().enumerate().all(|(slot, i)| i.index() != v || views.reads_view(g, c, slot))
                }
            });
            if !fine {
                virt[v] = false;
                changed = true;
            }
        }
        // Each view's source is stored.
        for v in 0..nv {
            if virt[v] {
                let (src, _) = movement_view(g, ValueId(v as u32));
                if virt[src.index()] {
                    virt[src.index()] = false;
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    (0..nv).map(|v| virt[v].then(|| movement_view(g, ValueId(v as u32)))).collect()
}

/// The view through which `node`'s first output is stored into the output of the Transpose reading it (through
/// Reshapes, each value read once and not a graph output), if there is one and the Transpose's output is stored.
fn store_view(g: &Graph, node: NodeId, consumers: &[Vec<NodeId>], virt: &[Option<(ValueId, StridedView)>]) -> Option<(ValueId, StridedView)> {
    let is_output = |v: ValueId| g.outputs.contains(&v);
    let mut chain = vec![g.node(node).outputs[0]];
    loop {
        let v = *chain.last().expect("the chain starts with the output");
        let [c] = consumers[v.index()][..] else { return None };
        if is_output(v) || virt[v.index()].is_some() {
            return None;
        }
        let reader = g.node(c);
        match &reader.op {
            Op::Reshape { .. } | Op::Identity => chain.push(reader.outputs[0]),
            Op::Transpose { perm } => {
                let target = reader.outputs[0];
                if virt[target.index()].is_some() || (consumers[target.index()].is_empty() && !is_output(target)) {
                    return None;
                }
                let mut inverse = vec![0; perm.len()];
                for (k, &p) in perm.iter().enumerate() {
                    inverse[p] = k;
                }
                // Back from the Transpose's output, stored contiguously, to the node's output.
                let mut view = StridedView::contiguous(&g.ty(target).shape).transpose(&inverse);
                chain.pop();
                while let Some(v) = chain.pop() {
                    view = view.reshape(&g.ty(v).shape)?;
                }
                return Some((target, view));
            }
            _ => return None,
        }
    }
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

/// Groups the nodes, decides what is stored, and where, for kernels that read and write every value as it is
/// stored.
pub fn plan(g: &Graph) -> Plan {
    plan_with_views(g, &NoViews)
}

/// [`plan`] for kernels that address the operands `views` names through strides.
pub fn plan_with_views(g: &Graph, views: &dyn Views) -> Plan {
    let nv = g.values.len();
    let view = read_views(g, views);
    let consumers = g.consumers();
    let mut store: Vec<Option<(ValueId, StridedView)>> = vec![None; nv];
    for n in 0..g.nodes.len() {
        let n = NodeId(n as u32);
        if views.stores_view(g, n) {
            store[g.node(n).outputs[0].index()] = store_view(g, n, &consumers, &view);
        }
    }
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
    // an alias too); every other value that exists is stored, except virtual values and outputs stored through
    // a view (and their aliases).
    let mut materialized = vec![false; nv];
    let mut output_class = vec![false; nv];
    for &o in &g.outputs {
        output_class[root[o.index()].index()] = true;
    }
    for v in 0..nv {
        let r = root[v].index();
        if r != v || view[v].is_some() || store[v].is_some() {
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
    Plan { groups, items, root, group_of, materialized, storage, scratch, view, store }
}

impl Plan {
    /// Whether movement node `n` has anything to do: false when none of its outputs is stored (they are read
    /// through views) or its input's producer already stored them through a view. Other nodes always run.
    pub fn moves(&self, g: &Graph, n: NodeId) -> bool {
        let node = g.node(n);
        if !is_movement(&node.op) {
            return true;
        }
        let input = self.root[node.inputs[0].index()];
        self.store[input.index()].is_none() && node.outputs.iter().any(|o| self.materialized[o.index()])
    }

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
            // A virtual operand is read from its view's source.
            Item::Node(n) => g.node(*n).inputs.iter().map(|v| self.view[v.index()].as_ref().map_or(*v, |(src, _)| *src)).collect(),
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
            // An output stored through a view writes the value it is stored into.
            Item::Node(n) => g.node(*n).outputs.iter().map(|v| self.store[v.index()].as_ref().map_or(*v, |(to, _)| self.root[to.index()])).collect(),
            Item::Copy { .. } => Vec::new(),
        }
    }
}
