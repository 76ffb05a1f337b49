//! Tests of the Collage partitioner with the real backends and targets; costs are given as data.

use super::*;
use crate::backend::{registry, Backend};
use crate::ir::*;
use crate::partition::{check, CostSource, PartitionError, Partitioning};
use crate::target::{Target, TargetSet};
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::time::Instant;

fn backends() -> Vec<Box<dyn Backend>> {
    registry::all()
}

fn cpu_targets() -> TargetSet {
    TargetSet::parse(&["cpu".into(), "cpu -compiler=gemm".into()]).unwrap()
}

fn cands_of(g: &Graph, targets: &TargetSet, limits: &Limits) -> Result<Vec<Candidate>, PartitionError> {
    let bs = backends();
    let lookup = |t: &Target| bs.iter().find(|b| b.name() == t.backend_name()).map(|b| b.as_ref());
    candidates(g, targets, &lookup, limits)
}

fn convert<T: serde::Serialize, U: serde::de::DeserializeOwned>(t: &T) -> U {
    postcard::from_bytes(&postcard::to_stdvec(t).unwrap()).unwrap()
}

/// A fixture model, simplified and folded. The fixture crate links its own copy of this crate, so in unit
/// tests its graphs are a different type: rebuild the graph through the serialized forms of ops and types
/// (structure, names and constant bytes all carried over).
fn fixture_graph(model: &str, seq: Option<usize>) -> Graph {
    let ext = tessera_fixtures::build(model, 1, seq).unwrap();
    let mut g = Graph::new(ext.name.clone());
    let mut map: Vec<Option<ValueId>> = vec![None; ext.values.len()];
    for &i in &ext.inputs {
        map[i.index()] = Some(g.add_input(ext.values[i.index()].name.clone(), convert(&ext.values[i.index()].ty)));
    }
    for node in &ext.nodes {
        let mut inputs = Vec::new();
        for &v in &node.inputs {
            if map[v.index()].is_none() {
                let t = ext.constant(v).expect("a value neither input nor earlier output is a constant");
                let tensor = Tensor::from_bytes(convert(&ext.values[v.index()].ty), t.bytes().to_vec()).unwrap();
                map[v.index()] = Some(g.add_const(ext.values[v.index()].name.clone(), tensor));
            }
            inputs.push(map[v.index()].unwrap());
        }
        let names = node.outputs.iter().map(|&o| ext.values[o.index()].name.clone()).collect();
        let outs = g.add_node_named(node.name.clone(), convert(&node.op), &inputs, names).unwrap();
        for (&o, v) in node.outputs.iter().zip(outs) {
            map[o.index()] = Some(v);
        }
    }
    g.outputs = ext.outputs.iter().map(|o| map[o.index()].unwrap()).collect();
    crate::passes::simplify::simplify(&mut g).unwrap();
    crate::passes::fold::fold_constants(&mut g).unwrap();
    g
}

/// A random DAG over [4, 4] f32 values: ops pick operands among earlier values by index.
fn random_graph(ops: &[(u8, usize, usize)]) -> Graph {
    let mut g = Graph::new("r");
    let mut vals = vec![g.add_input("a", TensorType::f32([4, 4])), g.add_input("b", TensorType::f32([4, 4]))];
    let bias = g.add_const("bias", Tensor::from_f32([4], &[0.5, -0.5, 1.0, 0.0]));
    for (i, &(op, x, y)) in ops.iter().enumerate() {
        let (x, y) = (vals[x % vals.len()], vals[y % vals.len()]);
        let name = format!("n{i}");
        let v = match op % 8 {
            0 => g.add(name, Op::MatMul, &[x, y]),
            1 => g.add(name, Op::Binary(BinaryOp::Add), &[x, y]),
            2 => g.add(name, Op::Unary(UnaryOp::Relu), &[x]),
            3 => g.add(name, Op::Unary(UnaryOp::Exp), &[x]),
            4 => g.add(name, Op::Softmax { axis: 1 }, &[x]),
            5 => g.add(name, Op::Transpose { perm: vec![1, 0] }, &[x]),
            6 => g.add(name, Op::Gelu { approximate: GeluApprox::Erf }, &[x]),
            _ => g.add(name, Op::Binary(BinaryOp::Add), &[x, bias]),
        }
        .unwrap();
        vals.push(v);
    }
    let uses = g.use_counts();
    let unused: Vec<ValueId> = g.nodes.iter().map(|n| n.outputs[0]).filter(|o| uses[o.index()] == 0).collect();
    g.outputs.extend(unused);
    g
}

/// Costs from a table of random numbers; `inf_every` > 0 makes every such candidate of a non-fallback target
/// infinite ("cannot run").
fn costs_for(cands: &[Candidate], targets: &TargetSet, table: &[f64], inf_every: usize) -> Vec<f64> {
    cands
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let fallback = targets.targets[c.target].is_least_specialized();
            if !fallback && inf_every > 0 && i % inf_every == 0 {
                f64::INFINITY
            } else {
                table[(i * 7 + c.nodes.len()) % table.len()]
            }
        })
        .collect()
}

/// Independent cost of a cover (candidate indices): None if the partition graph has a cycle; otherwise the
/// candidates' costs plus crossing charges on each partition's external inputs, and the partitions in a
/// topological order.
fn cover_cost(
    g: &Graph,
    targets: &TargetSet,
    cands: &[Candidate],
    costs: &[f64],
    crossing: &CrossingModel,
    cover: &[usize],
) -> Option<(f64, Vec<usize>)> {
    let mut owner = vec![usize::MAX; g.nodes.len()];
    for (k, &ci) in cover.iter().enumerate() {
        for n in &cands[ci].nodes {
            assert_eq!(owner[n.index()], usize::MAX);
            owner[n.index()] = k;
        }
    }
    // Partition graph edges and external inputs.
    let mut preds: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); cover.len()];
    let mut total = 0.0;
    for (k, &ci) in cover.iter().enumerate() {
        total += costs[ci];
        let ext: BTreeSet<ValueId> = cands[ci]
            .nodes
            .iter()
            .flat_map(|n| g.node(*n).inputs.iter().copied())
            .filter(|&v| g.producer(v).is_some_and(|p| owner[p.index()] != k))
            .collect();
        for v in ext {
            let pk = owner[g.producer(v).unwrap().index()];
            preds[k].insert(pk);
            let same = targets.targets[cands[cover[pk]].target].device() == targets.targets[cands[ci].target].device();
            total += crossing.cost(g.ty(v).size_bytes() as f64, same, targets.targets[cands[ci].target].device());
        }
    }
    // Kahn.
    let mut done = vec![false; cover.len()];
    let mut order = Vec::new();
    while order.len() < cover.len() {
        let next = (0..cover.len()).find(|&k| !done[k] && preds[k].iter().all(|&p| done[p]))?;
        done[next] = true;
        order.push(cover[next]);
    }
    Some((total, order))
}

/// Every exact cover of the graph by candidates with an acyclic partition graph: the cheapest cost.
struct Brute<'a> {
    g: &'a Graph,
    targets: &'a TargetSet,
    cands: &'a [Candidate],
    costs: &'a [f64],
    crossing: &'a CrossingModel,
}

impl Brute<'_> {
    fn best(&self) -> Option<f64> {
        let mut best = None;
        self.rec(&mut vec![false; self.g.nodes.len()], &mut Vec::new(), &mut best);
        best
    }

    /// Extends a partial cover by every finite candidate holding the first uncovered node, disjoint from it.
    fn rec(&self, covered: &mut Vec<bool>, cover: &mut Vec<usize>, best: &mut Option<f64>) {
        let Some(first) = covered.iter().position(|&c| !c) else {
            if let Some((c, order)) = cover_cost(self.g, self.targets, self.cands, self.costs, self.crossing, cover) {
                // The order found is a valid partitioning by `check`, too.
                let p = Partitioning {
                    partitions: order
                        .iter()
                        .map(|&ci| crate::partition::Partition {
                            target: self.targets.targets[self.cands[ci].target].clone(),
                            nodes: self.cands[ci].nodes.clone(),
                            cost_us: 0.0,
                        })
                        .collect(),
                    cost_source: CostSource::Analytical,
                };
                assert_eq!(check(self.g, &p), Ok(()));
                if best.is_none_or(|b| c < b) {
                    *best = Some(c);
                }
            }
            return;
        };
        for (ci, c) in self.cands.iter().enumerate() {
            if !self.costs[ci].is_finite() || !c.nodes.contains(&NodeId(first as u32)) || c.nodes.iter().any(|n| covered[n.index()]) {
                continue;
            }
            for n in &c.nodes {
                covered[n.index()] = true;
            }
            cover.push(ci);
            self.rec(covered, cover, best);
            cover.pop();
            for n in &c.nodes {
                covered[n.index()] = false;
            }
        }
    }
}

fn brute_force(g: &Graph, targets: &TargetSet, cands: &[Candidate], costs: &[f64], crossing: &CrossingModel) -> Option<f64> {
    Brute { g, targets, cands, costs, crossing }.best()
}

/// The invariants of a search result: exact cover, `check` passes, winners are candidates, chosen partitions
/// are unions of winners of their target, and the reported total is the winners' recomputed cost.
fn assert_well_formed(g: &Graph, targets: &TargetSet, cands: &[Candidate], costs: &[f64], crossing: &CrossingModel, out: &SearchOutcome) {
    let p = to_partitioning(targets, &out.chosen, CostSource::Analytical);
    assert_eq!(check(g, &p), Ok(()));
    let mut seen = vec![0; g.nodes.len()];
    for c in &out.chosen {
        for n in &c.nodes {
            seen[n.index()] += 1;
        }
    }
    assert!(seen.iter().all(|&s| s == 1), "{seen:?}");
    let mut cover = Vec::new();
    for (w, cost) in &out.winners {
        let ci = (0..cands.len())
            .filter(|&i| cands[i] == *w && costs[i].is_finite())
            .min_by(|&a, &b| costs[a].total_cmp(&costs[b]))
            .expect("every winner is a candidate with a finite cost");
        assert_eq!(costs[ci], *cost);
        cover.push(ci);
    }
    for c in &out.chosen {
        let parts: Vec<&(Candidate, f64)> = out.winners.iter().filter(|(w, _)| w.nodes.iter().any(|n| c.nodes.contains(n))).collect();
        assert!(parts.iter().all(|(w, _)| w.target == c.target && w.nodes.iter().all(|n| c.nodes.contains(n))));
        assert_eq!(parts.iter().map(|(w, _)| w.nodes.len()).sum::<usize>(), c.nodes.len());
        assert!((parts.iter().map(|(_, x)| x).sum::<f64>() - c.cost_us).abs() < 1e-9);
    }
    let (recomputed, _) = cover_cost(g, targets, cands, costs, crossing, &cover).expect("the winners' partition graph is acyclic");
    assert!((recomputed - out.total_us).abs() < 1e-9, "{recomputed} vs {}", out.total_us);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]


    /// Random graphs and costs: a well-formed result, and on small graphs the brute-force optimum.
    #[test]
    fn search_is_well_formed_and_optimal(
        ops in proptest::collection::vec((any::<u8>(), any::<usize>(), any::<usize>()), 1..13),
        table in proptest::collection::vec(0.1f64..10.0, 31),
        inf_every in 0usize..4,
        scale in prop_oneof![Just(0.0), Just(1.0), Just(1000.0)],
    ) {
        let g = random_graph(&ops);
        let targets = cpu_targets();
        let cands = cands_of(&g, &targets, &Limits::default()).unwrap();
        let costs = costs_for(&cands, &targets, &table, inf_every);
        let crossing = CrossingModel { same_device_us_per_byte: 1e-4 * scale, gpu_us_per_byte: 1e-6 * scale, ..CrossingModel::default() };
        let out = search_detailed(&g, &targets, &cands, &costs, &crossing).unwrap();
        assert_well_formed(&g, &targets, &cands, &costs, &crossing, &out);
        for c in &out.chosen {
            prop_assert!(c.nodes.iter().all(|n| cands.iter().any(|k| k.target == c.target && k.nodes.contains(n))));
        }
        if g.nodes.len() <= 8 {
            let best = brute_force(&g, &targets, &cands, &costs, &crossing).unwrap();
            prop_assert!((best - out.total_us).abs() < 1e-9, "brute force {} vs search {}", best, out.total_us);
        }
    }

    /// Past a tiny budget the beam's cover is well formed and never cheaper than the exact one; the beam is
    /// deterministic, and a budget nothing fits is an error naming the graph, not an abort.
    #[test]
    fn a_search_past_its_budget_falls_back_to_a_beam(
        ops in proptest::collection::vec((any::<u8>(), any::<usize>(), any::<usize>()), 4..16),
        table in proptest::collection::vec(0.1f64..10.0, 31),
        beam in 1usize..6,
    ) {
        let g = random_graph(&ops);
        let targets = cpu_targets();
        let cands = cands_of(&g, &targets, &Limits::default()).unwrap();
        let costs = costs_for(&cands, &targets, &table, 0);
        let crossing = CrossingModel::default();
        let exact = search_detailed(&g, &targets, &cands, &costs, &crossing).unwrap();
        prop_assert_eq!(exact.beam, None);
        let budget = SearchBudget { max_states: 3, beam };
        match search_bounded(&g, &targets, &cands, &costs, &crossing, &budget) {
            Ok(out) => {
                assert_well_formed(&g, &targets, &cands, &costs, &crossing, &out);
                prop_assert!(out.total_us >= exact.total_us - 1e-9, "beam {} below exact {}", out.total_us, exact.total_us);
                prop_assert!(out.states_seen <= 3);
                if exact.states_seen > 3 {
                    prop_assert_eq!(out.beam, Some(beam));
                }
                prop_assert_eq!(search_bounded(&g, &targets, &cands, &costs, &crossing, &budget).unwrap(), out);
            }
            Err(e) => prop_assert!(e.0.contains(&format!("graph '{}'", g.name)) && e.0.contains("3 states"), "{}", e.0),
        }
    }

    /// Same inputs give the same output; so does any permutation of the candidate list.
    #[test]
    fn search_is_deterministic(
        ops in proptest::collection::vec((any::<u8>(), any::<usize>(), any::<usize>()), 1..16),
        table in proptest::collection::vec(0.1f64..10.0, 5),
        perm_seed in any::<u64>(),
    ) {
        // Few distinct costs, so ties are common.
        let g = random_graph(&ops);
        let targets = cpu_targets();
        let cands = cands_of(&g, &targets, &Limits::default()).unwrap();
        let costs = costs_for(&cands, &targets, &table, 0);
        let crossing = CrossingModel::default();
        let a = search_detailed(&g, &targets, &cands, &costs, &crossing).unwrap();
        let b = search_detailed(&g, &targets, &cands, &costs, &crossing).unwrap();
        prop_assert_eq!(&a, &b);
        // A seeded Fisher-Yates shuffle (xorshift), duplicating one candidate with a higher cost.
        let mut idx: Vec<usize> = (0..cands.len()).collect();
        let mut s = perm_seed | 1;
        for i in (1..idx.len()).rev() {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            idx.swap(i, (s % (i as u64 + 1)) as usize);
        }
        let mut pc: Vec<Candidate> = idx.iter().map(|&i| cands[i].clone()).collect();
        let mut pcost: Vec<f64> = idx.iter().map(|&i| costs[i]).collect();
        pc.push(cands[0].clone());
        pcost.push(costs[0] + 1.0);
        let c = search_detailed(&g, &targets, &pc, &pcost, &crossing).unwrap();
        prop_assert_eq!(&a, &c);
    }

    /// Two devices: the state carries the frontier's devices, and the search still finds the optimum.
    #[test]
    fn two_devices_optimal(
        ops in proptest::collection::vec((any::<u8>(), any::<usize>(), any::<usize>()), 1..8),
        table in proptest::collection::vec(0.1f64..30.0, 23),
    ) {
        let g = random_graph(&ops);
        let targets = TargetSet::parse(&["cpu".into(), "cuda".into()]).unwrap();
        // The cuda backends are not in this build: candidates are given as data (each node alone on either
        // device, plus the cpu c backend's fused candidates).
        let cpu = TargetSet::parse(&["cpu".into()]).unwrap();
        let mut cands = cands_of(&g, &cpu, &Limits::default()).unwrap();
        let cuda = targets.targets.iter().position(|t| t.device() == "cuda").unwrap();
        let cpu_i = targets.targets.iter().position(|t| t.device() == "cpu").unwrap();
        for c in &mut cands {
            c.target = cpu_i;
        }
        cands.extend((0..g.nodes.len()).map(|i| Candidate { target: cuda, nodes: vec![NodeId(i as u32)] }));
        let costs = costs_for(&cands, &targets, &table, 0);
        // A small latency so mixing devices sometimes pays.
        let crossing = CrossingModel { device_latency_us: 0.5, ..CrossingModel::default() };
        let out = search_detailed(&g, &targets, &cands, &costs, &crossing).unwrap();
        assert_well_formed(&g, &targets, &cands, &costs, &crossing, &out);
        let best = brute_force(&g, &targets, &cands, &costs, &crossing).unwrap();
        prop_assert!((best - out.total_us).abs() < 1e-9, "brute force {} vs search {}", best, out.total_us);
    }
}

/// x -> conv -> add(bias) -> relu -> tanh, with a MatMul-free tail that gemm cannot run.
fn conv_chain() -> Graph {
    let mut g = Graph::new("conv_chain");
    let x = g.add_input("x", TensorType::f32([1, 2, 4, 4]));
    let w = g.add_const("w", Tensor::from_f32([3, 2, 3, 3], &[0.1; 54]));
    let b = g.add_const("b", Tensor::from_f32([3, 1, 1], &[0.5; 3]));
    let attrs = ConvAttrs { strides: vec![1, 1], pads: vec![1, 1, 1, 1], dilations: vec![1, 1], group: 1 };
    let c = g.add("conv", Op::Conv(attrs), &[x, w]).unwrap();
    let a = g.add("add", Op::Binary(BinaryOp::Add), &[c, b]).unwrap();
    let r = g.add("relu", Op::Unary(UnaryOp::Relu), &[a]).unwrap();
    let t = g.add("tanh", Op::Unary(UnaryOp::Tanh), &[r]).unwrap();
    g.outputs.push(t);
    g
}

fn node_sets(cands: &[Candidate], target: usize) -> Vec<Vec<u32>> {
    cands.iter().filter(|c| c.target == target).map(|c| c.nodes.iter().map(|n| n.0).collect()).collect()
}

#[test]
fn gemm_candidates_are_anchor_chains_and_c_covers_everything() {
    let g = conv_chain();
    let targets = cpu_targets();
    let (c, gemm) = (0, 1);
    assert_eq!(targets.targets[gemm].backend_name(), "gemm");
    let cands = cands_of(&g, &targets, &Limits::default()).unwrap();
    assert_eq!(node_sets(&cands, gemm), vec![vec![0], vec![0, 1], vec![0, 1, 2]]);
    let cs = node_sets(&cands, c);
    for want in [vec![0], vec![1], vec![2], vec![3], vec![0, 1, 2, 3], vec![1, 2, 3], vec![2, 3]] {
        assert!(cs.contains(&want), "c lacks {want:?}: {cs:?}");
    }
    // Sorted and deduplicated.
    assert!(cands.windows(2).all(|w| w[0] < w[1]));
    // With a size bound of 2, nothing larger.
    let small = cands_of(&g, &targets, &Limits { max_nodes: 2, ..Limits::default() }).unwrap();
    assert!(small.iter().all(|c| c.nodes.len() <= 2));
    assert!(node_sets(&small, gemm).contains(&vec![0, 1]));
}

#[test]
fn a_second_use_stops_the_gemm_chain_and_exits_are_bounded() {
    // conv's output also a graph output: gemm runs the conv alone.
    let mut g = conv_chain();
    let conv_out = g.nodes[0].outputs[0];
    g.outputs.push(conv_out);
    let targets = cpu_targets();
    let cands = cands_of(&g, &targets, &Limits::default()).unwrap();
    assert_eq!(node_sets(&cands, 1), vec![vec![0]]);
    // With one exit allowed, no c candidate holding the conv and later nodes (the conv output exits, and so
    // does the last node's).
    let one = cands_of(&g, &targets, &Limits { max_exits: 1, ..Limits::default() }).unwrap();
    assert!(node_sets(&one, 0).iter().all(|s| !(s.contains(&0) && s.contains(&3))));
    assert!(node_sets(&cands, 0).contains(&vec![0, 1, 2, 3]));
}

#[test]
fn non_convex_sets_are_never_candidates() {
    // a = relu(x); b = exp(a); t = transpose(b); c = add(a, t): {a, c} would need t and b.
    let mut g = Graph::new("diamond");
    let x = g.add_input("x", TensorType::f32([4, 4]));
    let a = g.add("a", Op::Unary(UnaryOp::Relu), &[x]).unwrap();
    let b = g.add("b", Op::Unary(UnaryOp::Exp), &[a]).unwrap();
    let t = g.add("t", Op::Softmax { axis: 1 }, &[b]).unwrap();
    let c = g.add("c", Op::Binary(BinaryOp::Add), &[a, t]).unwrap();
    g.outputs.push(c);
    let cands = cands_of(&g, &cpu_targets(), &Limits::default()).unwrap();
    let dag = super::dag::Dag::new(&g);
    for c in &cands {
        let nodes: Vec<u32> = c.nodes.iter().map(|n| n.0).collect();
        assert!(dag.is_convex(&nodes), "{nodes:?}");
    }
    assert!(!dag.is_convex(&[0, 3]) && !dag.is_convex(&[0, 1, 3]) && dag.is_convex(&[0, 1, 2, 3]));
}

#[test]
fn search_reaches_covers_the_first_uncovered_node_rule_misses() {
    // a(x), b(x), c(a, b): with {a, c} cheap, the best cover is {b} then {a, c}.
    let mut g = Graph::new("t");
    let x = g.add_input("x", TensorType::f32([4]));
    let a = g.add("a", Op::Unary(UnaryOp::Relu), &[x]).unwrap();
    let b = g.add("b", Op::Unary(UnaryOp::Exp), &[x]).unwrap();
    let c = g.add("c", Op::Binary(BinaryOp::Add), &[a, b]).unwrap();
    g.outputs.push(c);
    let targets = TargetSet::parse(&["cpu".into()]).unwrap();
    let cand = |n: &[u32]| Candidate { target: 0, nodes: n.iter().map(|&i| NodeId(i)).collect() };
    let cands = vec![cand(&[0]), cand(&[1]), cand(&[2]), cand(&[0, 2])];
    let costs = [5.0, 1.0, 5.0, 2.0];
    let out = search_detailed(&g, &targets, &cands, &costs, &CrossingModel::default()).unwrap();
    let w: Vec<Vec<u32>> = out.winners.iter().map(|(c, _)| c.nodes.iter().map(|n| n.0).collect()).collect();
    assert_eq!(w, vec![vec![1], vec![0, 2]]);
    assert!((out.total_us - (3.0 + 16.0 * 1e-4)).abs() < 1e-12, "{}", out.total_us);
}

#[test]
fn infinite_and_nan_costs_are_never_chosen_and_alternatives_are_reported() {
    let g = conv_chain();
    let targets = cpu_targets();
    let cands = cands_of(&g, &targets, &Limits::default()).unwrap();
    // gemm cheap except its full chain, which "cannot run"; c expensive.
    let costs: Vec<f64> = cands
        .iter()
        .map(|c| match (c.target, c.nodes.len()) {
            (1, 3) => f64::INFINITY,
            (1, 2) => f64::NAN,
            (1, _) => 1.0,
            (_, k) => 10.0 * k as f64,
        })
        .collect();
    let out = search_detailed(&g, &targets, &cands, &costs, &CrossingModel::default()).unwrap();
    assert!(out.winners.iter().all(|(w, c)| c.is_finite() && !(w.target == 1 && w.nodes.len() > 1)));
    let first = &out.chosen[0];
    assert_eq!((first.target, first.nodes.clone()), (1, vec![NodeId(0)]));
    assert_eq!(first.alternative, Some((0, 10.0)), "the cheapest c candidate holding the conv is the conv alone");
    // Everything infinite for some node: a clear error naming it.
    let none: Vec<f64> = cands.iter().map(|c| if c.nodes.contains(&NodeId(3)) { f64::INFINITY } else { 1.0 }).collect();
    let e = search(&g, &targets, &cands, &none, &CrossingModel::default()).unwrap_err();
    assert!(e.0.contains("'tanh'") && e.0.contains("Tanh"), "{e}");
    // Bad inputs: errors, not panics.
    assert!(search(&g, &targets, &cands, &costs[1..], &CrossingModel::default()).is_err());
    let mut neg = costs.clone();
    neg[0] = -1.0;
    assert!(search(&g, &targets, &cands, &neg, &CrossingModel::default()).unwrap_err().0.contains("negative"));
}

#[test]
fn adjacent_winners_on_one_target_merge() {
    // relu -> exp -> tanh, only primitives, all c: one partition costing the sum.
    let mut g = Graph::new("chain");
    let x = g.add_input("x", TensorType::f32([4]));
    let a = g.add("a", Op::Unary(UnaryOp::Relu), &[x]).unwrap();
    let b = g.add("b", Op::Unary(UnaryOp::Exp), &[a]).unwrap();
    let c = g.add("c", Op::Unary(UnaryOp::Tanh), &[b]).unwrap();
    g.outputs.push(c);
    let targets = TargetSet::parse(&["cpu".into()]).unwrap();
    let cands: Vec<Candidate> = (0..3).map(|i| Candidate { target: 0, nodes: vec![NodeId(i)] }).collect();
    let out = search_detailed(&g, &targets, &cands, &[1.0, 2.0, 3.0], &CrossingModel::default()).unwrap();
    assert_eq!(out.winners.len(), 3);
    assert_eq!(out.chosen, vec![Chosen { target: 0, nodes: vec![NodeId(0), NodeId(1), NodeId(2)], cost_us: 6.0, alternative: None }]);
    let p = to_partitioning(&targets, &out.chosen, CostSource::Analytical);
    assert_eq!(p.partitions.len(), 1);
    assert_eq!(p.partitions[0].target, targets.targets[0]);
}

/// Movement whose producer is on another target joins the one group reading it; with two reading groups it
/// stays a partition of its own.
#[test]
fn movement_alone_joins_its_only_reader() {
    use super::merge::merge_winners;
    let build = |second_reader: bool| {
        let mut g = Graph::new("heads");
        let x = g.add_input("x", TensorType::f32([4, 4]));
        let w = g.add_const("w", Tensor::from_f32([4, 4], &[0.5; 16]));
        let r = g.add("relu", Op::Unary(UnaryOp::Relu), &[x]).unwrap();
        let m = g.add("mm", Op::MatMul, &[x, w]).unwrap();
        let t = g.add("heads", Op::Transpose { perm: vec![1, 0] }, &[m]).unwrap();
        let y = g.add("add", Op::Binary(BinaryOp::Add), &[r, t]).unwrap();
        g.outputs.push(y);
        if second_reader {
            let e = g.add("exp", Op::Unary(UnaryOp::Exp), &[t]).unwrap();
            g.outputs.push(e);
        }
        g
    };
    // relu on target 0, the MatMul on 1, the transpose and the add on 0, each its own winner.
    let units = vec![(0, vec![0], 1.0), (1, vec![1], 2.0), (0, vec![2], 3.0), (0, vec![3], 4.0)];
    let g = build(false);
    let merged = merge_winners(&g, &super::dag::Dag::new(&g), &units);
    assert_eq!(merged, vec![(1, vec![1], 2.0), (0, vec![0, 2, 3], 8.0)]);
    // The exp (its own group on target 0) reads the transpose too: two readers, no fold.
    let g = build(true);
    let mut units2 = units.clone();
    units2.push((0, vec![4], 5.0));
    let merged = merge_winners(&g, &super::dag::Dag::new(&g), &units2);
    assert!(merged.iter().any(|(t, n, _)| *t == 0 && n.contains(&2) && !n.contains(&3)), "{merged:?}");
}

#[test]
fn a_missing_backend_or_bad_limits_is_an_error() {
    let g = conv_chain();
    // A target whose backend the build does not hand the search (a lookup without cudnn).
    let targets = TargetSet::parse(&["cuda -compiler=cudnn".into()]).unwrap();
    let bs: Vec<_> = backends().into_iter().filter(|b| b.name() != "cudnn").collect();
    let lookup = |t: &Target| bs.iter().find(|b| b.name() == t.backend_name()).map(|b| b.as_ref());
    let e = candidates(&g, &targets, &lookup, &Limits::default()).unwrap_err();
    assert!(e.0.contains("no backend"), "{e}");
    let e = cands_of(&g, &cpu_targets(), &Limits { max_nodes: 0, ..Limits::default() }).unwrap_err();
    assert!(e.0.contains("limits"), "{e}");
}

/// BERT-base and ResNet-50 fixtures with analytical costs standing in for cached measurements: candidates
/// plus search under a second each (dev profile), counts printed.
#[test]
fn fixture_graphs_search_under_a_second() {
    for (model, seq) in [("bert-base", Some(128)), ("resnet50", None)] {
        let g = fixture_graph(model, seq);
        let targets = cpu_targets();
        let bs = backends();
        let lookup = |t: &Target| bs.iter().find(|b| b.name() == t.backend_name()).map(|b| b.as_ref());
        let t0 = Instant::now();
        let cands = candidates(&g, &targets, &lookup, &Limits::default()).unwrap();
        let t_cands = t0.elapsed();
        let costs: Vec<f64> = cands
            .iter()
            .map(|c| {
                let t = &targets.targets[c.target];
                lookup(t).unwrap().estimate_us(&g, &c.nodes, t)
            })
            .collect();
        let t1 = Instant::now();
        let out = search_detailed(&g, &targets, &cands, &costs, &CrossingModel::default()).unwrap();
        let t_search = t1.elapsed();
        let per_target: Vec<usize> = (0..targets.targets.len()).map(|t| cands.iter().filter(|c| c.target == t).count()).collect();
        let gemm_nodes: usize = out.chosen.iter().filter(|c| c.target == 1).map(|c| c.nodes.len()).sum();
        let gemm_parts = out.chosen.iter().filter(|c| c.target == 1).count();
        println!(
            "{model}: {} nodes, {} candidates (c {}, gemm {}), largest {}; candidates {:?}, search {:?}: {} states expanded, \
             {} seen, {} winners, {} partitions ({gemm_parts} gemm with {} nodes), total {:.1} us",
            g.nodes.len(),
            cands.len(),
            per_target[0],
            per_target[1],
            cands.iter().map(|c| c.nodes.len()).max().unwrap(),
            t_cands,
            t_search,
            out.states_expanded,
            out.states_seen,
            out.winners.len(),
            out.chosen.len(),
            gemm_nodes,
            out.total_us
        );
        assert_eq!(check(&g, &to_partitioning(&targets, &out.chosen, CostSource::Analytical)), Ok(()));
        assert!(gemm_nodes > 0, "{model}: gemm runs the MatMuls/Convs when it is cheaper");
        assert!((t_cands + t_search).as_secs_f64() < 1.0, "{model}: candidates {t_cands:?} + search {t_search:?}");
    }
}

/// A wide random graph (proptest's find) whose search explored 69k states before the canonical-order rules.
#[test]
fn wide_graph_search_stays_small() {
    let ops: Vec<(u8, usize, usize)> = vec![(0, 0, 0), (2, 1075758361696862607, 0), (116, 1031607213371141472, 0), (233, 1346291787149635519, 7149747760429456109), (130, 579310341396192954, 0), (82, 6500074643840179320, 0), (108, 3425880468773110088, 0), (2, 9818464396564926634, 6403320847225121381), (34, 778491841447574736, 4377159306206637765), (164, 6752824649094284941, 9636662363233959870), (67, 12314280495471721715, 5863372338774811908), (231, 17240735268422251254, 8328873724256788966), (45, 13266835028724111797, 8496941829006100507), (155, 14933846919781608404, 1129847660333606706), (79, 6131164725655373766, 10614295205924269710), (12, 16884165645795282731, 12073085029742397421), (232, 6257783981999605969, 3424621022401165335), (161, 3101448395937715271, 5334188721785274231), (247, 12815602703063064841, 80874457401568008), (151, 2449910930540448258, 5199605380991112293), (163, 18332870419152033749, 18149751440783669938), (215, 16249340774049565932, 5276431465070579893), (22, 5896977246882492779, 11540158886028770270), (197, 2078167426279544267, 1900573837809774014)];
    let g = random_graph(&ops);
    let targets = cpu_targets();
    let t0 = Instant::now();
    let cands = cands_of(&g, &targets, &Limits::default()).unwrap();
    println!("cands {} in {:?}", cands.len(), t0.elapsed());
    let table: Vec<f64> = (0..31).map(|i| 0.5 + (i * 37 % 31) as f64 / 3.0).collect();
    let costs = costs_for(&cands, &targets, &table, 3);
    let t0 = Instant::now();
    let out = search_detailed(&g, &targets, &cands, &costs, &CrossingModel::default()).unwrap();
    println!("search {:?}: {} expanded {} seen", t0.elapsed(), out.states_expanded, out.states_seen);
    assert_well_formed(&g, &targets, &cands, &costs, &CrossingModel::default(), &out);
    assert!(out.states_seen < 5_000, "{} states", out.states_seen);
    // With the exact search held to half of that, a beam of 4 covers it at a cost within 10% of the best.
    let budget = SearchBudget { max_states: out.states_seen / 2, beam: 4 };
    let beamed = search_bounded(&g, &targets, &cands, &costs, &CrossingModel::default(), &budget).unwrap();
    assert_eq!(beamed.beam, Some(4));
    assert_well_formed(&g, &targets, &cands, &costs, &CrossingModel::default(), &beamed);
    assert!(beamed.total_us <= out.total_us * 1.1, "beam {} vs exact {}", beamed.total_us, out.total_us);
}

