//! Property tests of the structural hash: names and node order never matter; every op, attribute, shape,
//! dtype, edge and constant byte does.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

/// A recipe for a random graph, kept separate from the graph so each test can rebuild variants of it.
#[derive(Clone, Debug)]
struct Recipe {
    dtype: DType,
    rows: usize,
    /// Constant bytes seeds (one [cols] constant each).
    consts: Vec<u8>,
    /// (op choice, first operand, second operand, alpha) with operands indexing the values made so far.
    nodes: Vec<(u8, usize, usize, u8)>,
}

const COLS: usize = 8;

fn op_for(choice: u8, alpha: u8) -> (Op, usize) {
    match choice % 6 {
        0 => (Op::Binary(BinaryOp::Add), 2),
        1 => (Op::Binary(BinaryOp::Mul), 2),
        2 => (Op::Binary(BinaryOp::Sub), 2),
        3 => (Op::Unary(UnaryOp::Tanh), 1),
        4 => (Op::Unary(UnaryOp::Exp), 1),
        _ => (Op::LeakyRelu { alpha: 0.01 * (1 + alpha as u32) as f32 }, 1),
    }
}

/// Builds the graph. `names` picks a naming scheme; `order` (a permutation seed) picks a topological order;
/// all nodes end up live (unconsumed values become outputs, in creation order).
fn build(r: &Recipe, names: u32, order: Option<u64>) -> Graph {
    // First decide the node list (deduplicated so no two nodes are structurally identical).
    let n_inputs = 2;
    let mut avail = n_inputs + r.consts.len();
    let mut seen = BTreeSet::new();
    let mut nodes: Vec<(Op, Vec<usize>)> = Vec::new();
    for &(choice, a, b, alpha) in &r.nodes {
        let (op, arity) = op_for(choice, alpha);
        let ins: Vec<usize> = if arity == 2 { vec![a % avail, b % avail] } else { vec![a % avail] };
        if !seen.insert(format!("{op:?}{ins:?}")) {
            continue;
        }
        nodes.push((op, ins));
        avail += 1;
    }
    // A topological order: a random permutation of ready nodes when `order` is set.
    let mut emitted: Vec<usize> = Vec::new();
    let mut done = vec![false; nodes.len()];
    let mut rng = order.unwrap_or(0).wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    while emitted.len() < nodes.len() {
        let ready: Vec<usize> = (0..nodes.len())
            .filter(|&i| !done[i] && nodes[i].1.iter().all(|&v| v < n_inputs + r.consts.len() || done[v - n_inputs - r.consts.len()]))
            .collect();
        let pick = if order.is_some() {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ready[(rng >> 33) as usize % ready.len()]
        } else {
            ready[0]
        };
        done[pick] = true;
        emitted.push(pick);
    }
    let name = |kind: &str, i: usize| format!("{kind}{}_{}", names, i * (names as usize + 1));
    let mut g = Graph::new(format!("g{names}"));
    let mut vals: Vec<Option<ValueId>> = vec![None; avail];
    for (i, slot) in vals.iter_mut().enumerate().take(n_inputs) {
        *slot = Some(g.add_input(name("in", i), TensorType::new(r.dtype, [r.rows, COLS])));
    }
    for (k, &seed) in r.consts.iter().enumerate() {
        // Distinct per constant (k), so no two constants are interchangeable.
        let data: Vec<f64> = (0..COLS).map(|j| (seed as f64 + j as f64 + 300.0 * k as f64) / 16.0).collect();
        vals[n_inputs + k] = Some(g.add_const(name("c", k), Tensor::from_f64_as(r.dtype, [COLS], &data)));
    }
    let mut used = vec![false; avail];
    for &i in &emitted {
        let (op, ins) = &nodes[i];
        let inputs: Vec<ValueId> = ins.iter().map(|&v| vals[v].unwrap()).collect();
        for &v in ins {
            used[v] = true;
        }
        vals[n_inputs + r.consts.len() + i] = Some(g.add(name("n", i), op.clone(), &inputs).unwrap());
    }
    for i in 0..nodes.len() {
        let v = n_inputs + r.consts.len() + i;
        if !used[v] {
            g.outputs.push(vals[v].unwrap());
        }
    }
    if g.outputs.is_empty() {
        g.outputs.push(vals[0].unwrap());
    }
    verify(&g).unwrap();
    g
}

fn recipe() -> impl Strategy<Value = Recipe> {
    (
        prop_oneof![Just(DType::F32), Just(DType::F16)],
        1usize..5,
        proptest::collection::vec(any::<u8>(), 0..3),
        proptest::collection::vec((any::<u8>(), any::<usize>(), any::<usize>(), any::<u8>()), 1..12),
    )
        .prop_map(|(dtype, rows, consts, nodes)| Recipe { dtype, rows, consts, nodes })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn renaming_and_reordering_keep_the_hash(r in recipe(), names in 1u32..5, seed in any::<u64>()) {
        let base = graph_hash(&build(&r, 0, None));
        prop_assert_eq!(base, graph_hash(&build(&r, names, None)));
        prop_assert_eq!(base, graph_hash(&build(&r, names, Some(seed))));
    }

    #[test]
    fn subgraph_signature_ignores_names_and_order(r in recipe(), seed in any::<u64>()) {
        let a = build(&r, 0, None);
        let b = build(&r, 3, Some(seed));
        let all = |g: &Graph| (0..g.nodes.len() as u32).map(NodeId).collect::<Vec<_>>();
        prop_assert_eq!(subgraph_signature(&a, &all(&a), ConstMode::ByContent).digest,
                        subgraph_signature(&b, &all(&b), ConstMode::ByContent).digest);
    }

    #[test]
    fn changing_an_op_changes_the_hash(r in recipe(), which in any::<usize>()) {
        let g = build(&r, 0, None);
        let mut m = g.clone();
        let i = which % m.nodes.len();
        let new_op = match &m.nodes[i].op {
            Op::Binary(BinaryOp::Add) => Op::Binary(BinaryOp::Mul),
            Op::Binary(_) => Op::Binary(BinaryOp::Add),
            Op::Unary(UnaryOp::Tanh) => Op::Unary(UnaryOp::Exp),
            Op::Unary(_) => Op::Unary(UnaryOp::Tanh),
            Op::LeakyRelu { alpha } => Op::LeakyRelu { alpha: alpha + 0.5 },
            other => other.clone(),
        };
        m.nodes[i].op = new_op;
        prop_assert_ne!(graph_hash(&g), graph_hash(&m));
    }

    #[test]
    fn changing_an_attribute_changes_the_hash(r in recipe()) {
        let g = build(&r, 0, None);
        let mut m = g.clone();
        let Some(i) = m.nodes.iter().position(|n| matches!(n.op, Op::LeakyRelu { .. })) else { return Ok(()); };
        if let Op::LeakyRelu { alpha } = &mut m.nodes[i].op { *alpha *= 1.5; }
        prop_assert_ne!(graph_hash(&g), graph_hash(&m));
    }

    #[test]
    fn changing_a_shape_or_dtype_changes_the_hash(r in recipe()) {
        let g = build(&r, 0, None);
        let taller = build(&Recipe { rows: r.rows + 1, ..r.clone() }, 0, None);
        prop_assert_ne!(graph_hash(&g), graph_hash(&taller));
        let other = if r.dtype == DType::F32 { DType::BF16 } else { DType::F32 };
        let retyped = build(&Recipe { dtype: other, ..r.clone() }, 0, None);
        prop_assert_ne!(graph_hash(&g), graph_hash(&retyped));
    }

    #[test]
    fn changing_an_edge_changes_the_hash(r in recipe(), which in any::<usize>(), to in any::<usize>()) {
        let g = build(&r, 0, None);
        let i = which % g.nodes.len();
        // Any value defined before node i (inputs, constants, earlier outputs) of the same type as its input 0.
        let old = g.nodes[i].inputs[0];
        let earlier: Vec<ValueId> = g.inputs.iter().copied()
            .chain((0..g.values.len()).map(|v| ValueId(v as u32)).filter(|&v| g.constant(v).is_some()))
            .chain(g.nodes[..i].iter().flat_map(|n| n.outputs.iter().copied()))
            .filter(|&v| v != old && g.ty(v) == g.ty(old))
            .collect();
        prop_assume!(!earlier.is_empty());
        let mut m = g.clone();
        m.nodes[i].inputs[0] = earlier[to % earlier.len()];
        // Keep every node live so the change cannot hide in dead code.
        let uses = m.use_counts();
        for n in &m.nodes { for &o in &n.outputs { if uses[o.index()] == 0 { m.outputs.push(o); } } }
        let mut g2 = g.clone();
        let uses = g2.use_counts();
        for n in &g.nodes { for &o in &n.outputs { if uses[o.index()] == 0 { g2.outputs.push(o); } } }
        verify(&m).unwrap();
        // Compare on the same output list shape: the mutated graph's extra outputs are live values of g too.
        prop_assert_ne!(graph_hash(&g2), graph_hash(&m));
    }

    #[test]
    fn changing_a_constant_byte_changes_the_hash(r in recipe(), byte in any::<usize>(), bit in 0u8..8) {
        let g = build(&r, 0, None);
        let uses = g.use_counts();
        let consts: Vec<usize> = (0..g.values.len()).filter(|&v| g.constant(ValueId(v as u32)).is_some() && uses[v] > 0).collect();
        if consts.is_empty() {
            return Ok(());
        }
        let v = consts[byte % consts.len()];
        let t = g.constant(ValueId(v as u32)).unwrap().clone();
        let mut bytes = t.bytes().to_vec();
        let k = byte % bytes.len();
        bytes[k] ^= 1 << bit;
        let mut m = g.clone();
        m.values[v].def = ValueDef::Const(Tensor::from_bytes(t.ty.clone(), bytes).unwrap());
        prop_assert_ne!(graph_hash(&g), graph_hash(&m));
        // Tuning-style hashing ignores weight values.
        prop_assert_eq!(graph_hash_with(&g, ConstMode::ByType), graph_hash_with(&m, ConstMode::ByType));
    }
}

#[test]
fn subgraph_signature_binds_boundary_in_canonical_order() {
    // Two models sharing a block y = tanh(a) * b, with different surroundings and names.
    let mk = |extra: bool, prefix: &str| {
        let mut g = Graph::new("m");
        let x = g.add_input(format!("{prefix}x"), TensorType::f32([2, 3]));
        let z = g.add_input(format!("{prefix}z"), TensorType::f32([2, 3]));
        let pre = if extra { g.add(format!("{prefix}pre"), Op::Unary(UnaryOp::Exp), &[x]).unwrap() } else { x };
        let t = g.add(format!("{prefix}t"), Op::Unary(UnaryOp::Tanh), &[pre]).unwrap();
        let y = g.add(format!("{prefix}y"), Op::Binary(BinaryOp::Mul), &[t, z]).unwrap();
        g.outputs.push(y);
        let block: Vec<NodeId> = g.nodes.iter().enumerate().filter(|(_, n)| n.name.ends_with('t') || n.name.ends_with('y')).map(|(i, _)| NodeId(i as u32)).collect();
        (g, block, pre, z, y)
    };
    let (g1, b1, pre1, z1, y1) = mk(false, "a.");
    let (g2, b2, pre2, z2, y2) = mk(true, "b.");
    let s1 = subgraph_signature(&g1, &b1, ConstMode::ByContent);
    let s2 = subgraph_signature(&g2, &b2, ConstMode::ByContent);
    assert_eq!(s1.digest, s2.digest);
    assert_eq!(s1.inputs, vec![pre1, z1]);
    assert_eq!(s2.inputs, vec![pre2, z2]);
    assert_eq!((s1.outputs, s2.outputs), (vec![y1], vec![y2]));
    assert_ne!(graph_hash(&g1), graph_hash(&g2));
}
