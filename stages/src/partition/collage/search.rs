//! The search: the cheapest exact cover of the graph by candidates, as a shortest path over covered sets.
//!
//! A state is a downward-closed set of covered nodes (every producer of a covered node is covered). From a
//! state the search may add any candidate whose nodes are all uncovered and whose external inputs are all
//! covered (it is *ready*), so the covered set stays downward-closed and the chosen partitions, in path
//! order, are a topological order of the partition graph: no cycle after outlining, by construction.
//!
//! Collage takes only candidates containing the first uncovered node. With the readiness condition that rule
//! is incomplete: for nodes `a(x)`, `b(x)`, `c(a, b)` and candidates `{a, c}`, `{b}`, the cover `{b}`, `{a, c}`
//! is unreachable (the candidate holding `a` needs `b` first). So every ready candidate is tried, with two
//! things keeping the explored states few: paths list a cover's partitions in one canonical order only (Kahn's
//! algorithm taking the ready partition with the smallest first node; checking that needs the last candidate,
//! so it is part of the state), and A* with an admissible, consistent bound (each uncovered node costs at
//! least its cheapest share `cost / |nodes|` over the candidates holding it).
//!
//! Edge cost: the candidate's cost plus [`CrossingModel`] charges on its external inputs (node-produced values;
//! graph inputs and constants live in memory anyway). The device part needs the producer's device, so when
//! the targets span more than one device the state also carries the device of every covered node that still
//! has an uncovered consumer (the frontier); with one device the state is just the covered set.
//!
//! Memory and time are bounded ([`SearchBudget`]): the exact search stops after `max_states` states, and
//! the search runs again with a beam, keeping at each count of covered nodes only the `beam` states of lowest
//! estimate; the beam's cover is valid but may cost more than the best (the outcome says which search found
//! it). Exported graphs of many small nodes (a BERT export before the canonical front end: 6.4 GB of states
//! on 2026-12-07, then an abort in a HashMap's growth) are why. Past the budget in the beam too, the search
//! fails with an error naming the graph and the budget.
//!
//! Non-finite costs mean "cannot run": such candidates are never chosen. Determinism: candidates are first put
//! in a canonical order (target, nodes; duplicates keep the cheapest), the queue breaks ties by insertion
//! order, and of equal-cost paths to one state the first found is kept.

use super::candidates::Candidate;
use super::dag::{contains, external_inputs, Dag};
use super::merge::{merge_winners, Chosen};
use crate::ir::{Graph, NodeId};
use crate::partition::PartitionError;
use crate::target::TargetSet;
use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, BinaryHeap, HashMap};

/// Cost of a value crossing between partitions (Collage left this out).
#[derive(Clone, Debug, PartialEq)]
pub struct CrossingModel {
    /// Per byte of a value written by one partition and read by another on the same host device, in
    /// microseconds. Default 1e-4 (10 GB/s): the value goes through memory instead of staying in registers.
    pub same_device_us_per_byte: f64,
    /// The same on a GPU, whose memory is two orders of magnitude faster. Default 1e-6 (1 TB/s for the write
    /// and the read back, a third of an H100's HBM). The host's rate here (it was the only one before
    /// 2026-11-25) charged BERT-base's 6 MB GELU output 630 us for leaving a partition, so the search kept a
    /// 57 us fused cuda GEMM over cuBLASLt's 11 us one.
    pub gpu_us_per_byte: f64,
    /// Fixed cost of a value crossing devices, in microseconds. Default 10 (a transfer's launch latency).
    pub device_latency_us: f64,
    /// Per byte of a value crossing devices, on top of the same-device cost. Default 5e-5 (20 GB/s, a
    /// nominal host-device link).
    pub device_us_per_byte: f64,
}

impl Default for CrossingModel {
    fn default() -> Self {
        CrossingModel { same_device_us_per_byte: 1e-4, gpu_us_per_byte: 1e-6, device_latency_us: 10.0, device_us_per_byte: 5e-5 }
    }
}

impl CrossingModel {
    /// The cost of `bytes` crossing from a partition on one device into a partition on another (or the same),
    /// the consumer on device `into` (`cpu`, `cuda`).
    pub fn cost(&self, bytes: f64, same_device: bool, into: &str) -> f64 {
        let per_byte = if into == "cuda" { self.gpu_us_per_byte } else { self.same_device_us_per_byte };
        let mut c = bytes * per_byte;
        if !same_device {
            c += self.device_latency_us + bytes * self.device_us_per_byte;
        }
        c
    }
}

/// The search's result with the figures reports want.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchOutcome {
    /// Partitions after merging, in a topological order.
    pub chosen: Vec<Chosen>,
    /// The winning candidates before merging, in path order (a topological order), with their costs.
    pub winners: Vec<(Candidate, f64)>,
    /// The path's cost: winners' costs plus crossing charges.
    pub total_us: f64,
    /// States taken off the queue (expanded) and states discovered.
    pub states_expanded: usize,
    pub states_seen: usize,
    /// Candidates left after dropping non-finite costs and duplicates.
    pub candidates_used: usize,
    /// `None`: the exact search found the cover (the cheapest); `Some(w)`: the exact search ran past its
    /// budget and a beam of `w` states per count of covered nodes found it.
    pub beam: Option<usize>,
}

/// How far the search may go: the states it may hold (each about 250 bytes with its key, index entry and
/// queue entries), and the beam it falls back to past them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SearchBudget {
    pub max_states: usize,
    pub beam: usize,
}

impl Default for SearchBudget {
    /// A million states (about 250 MB), then a beam of 64. The exact search of every fixture and of the
    /// exported corpus's canonical graphs stays far below the limit (BERT-base's export: see
    /// bench/compile_times.md).
    fn default() -> Self {
        SearchBudget { max_states: 1_000_000, beam: 64 }
    }
}

/// [`search_detailed`], partitions only.
pub fn search(g: &Graph, targets: &TargetSet, cands: &[Candidate], cost_us: &[f64], crossing: &CrossingModel) -> Result<Vec<Chosen>, PartitionError> {
    search_detailed(g, targets, cands, cost_us, crossing).map(|o| o.chosen)
}

/// A candidate in the search's canonical list, with what transitions need.
struct Cand {
    target: usize,
    nodes: Vec<u32>,
    cost: f64,
    ext_producers: Vec<u32>,
    /// External inputs: (producer node, bytes).
    ext_inputs: Vec<(u32, f64)>,
}

struct State {
    key: Vec<u32>,
    g: f64,
    parent: Option<(usize, usize)>,
    closed: bool,
}

/// f64 with a total order, for the queue.
#[derive(PartialEq)]
struct Ord64(f64);
impl Eq for Ord64 {}
impl PartialOrd for Ord64 {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Ord64 {
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// No last candidate (the start state).
const NONE: u32 = u32::MAX;

/// A state key: `[f, k, extras (k covered nodes after f, sorted).., last candidate, frontier (node, device)
/// pairs sorted by node (multi-device only)..]`, split into (f, extras, last, frontier pairs).
fn parse_key(key: &[u32]) -> (u32, &[u32], Option<usize>, &[u32]) {
    let k = key[1] as usize;
    let last = key[2 + k];
    (key[0], &key[2..2 + k], (last != NONE).then_some(last as usize), &key[3 + k..])
}

/// [`search_bounded`] within the default budget.
pub fn search_detailed(
    g: &Graph,
    targets: &TargetSet,
    cands: &[Candidate],
    cost_us: &[f64],
    crossing: &CrossingModel,
) -> Result<SearchOutcome, PartitionError> {
    search_bounded(g, targets, cands, cost_us, crossing, &SearchBudget::default())
}

/// The cheapest cover found within `budget` (see the module's documentation).
pub fn search_bounded(
    g: &Graph,
    targets: &TargetSet,
    cands: &[Candidate],
    cost_us: &[f64],
    crossing: &CrossingModel,
    budget: &SearchBudget,
) -> Result<SearchOutcome, PartitionError> {
    if budget.max_states == 0 || budget.beam == 0 {
        return Err(PartitionError(format!("search budget must allow states and a beam: {budget:?}")));
    }
    let n = g.nodes.len();
    if cands.len() != cost_us.len() {
        return Err(PartitionError(format!("{} candidates but {} costs", cands.len(), cost_us.len())));
    }
    for (i, (c, &cost)) in cands.iter().zip(cost_us).enumerate() {
        if c.target >= targets.targets.len() {
            return Err(PartitionError(format!("candidate {i}: target index {} out of range ({} targets)", c.target, targets.targets.len())));
        }
        if c.nodes.is_empty() || c.nodes.windows(2).any(|w| w[0] >= w[1]) || c.nodes.iter().any(|x| x.index() >= n) {
            return Err(PartitionError(format!("candidate {i}: nodes must be non-empty, sorted, distinct and in the graph: {:?}", c.nodes)));
        }
        if cost < 0.0 {
            return Err(PartitionError(format!("candidate {i} (nodes {:?}): negative cost {cost}", c.nodes)));
        }
    }
    if crossing.same_device_us_per_byte < 0.0 || crossing.gpu_us_per_byte < 0.0 || crossing.device_latency_us < 0.0 || crossing.device_us_per_byte < 0.0 {
        return Err(PartitionError(format!("crossing costs must be non-negative: {crossing:?}")));
    }
    if n == 0 {
        return Ok(SearchOutcome { chosen: vec![], winners: vec![], total_us: 0.0, states_expanded: 0, states_seen: 0, candidates_used: 0, beam: None });
    }
    let dag = Dag::new(g);

    // Canonical list: finite costs, sorted by (target, nodes, cost), duplicates keep the cheapest.
    let mut order: Vec<usize> = (0..cands.len()).filter(|&i| cost_us[i].is_finite()).collect();
    order.sort_by(|&a, &b| cands[a].cmp(&cands[b]).then(cost_us[a].total_cmp(&cost_us[b])));
    order.dedup_by(|a, b| cands[*a] == cands[*b]);
    let list: Vec<Cand> = order
        .iter()
        .map(|&i| {
            let nodes: Vec<u32> = cands[i].nodes.iter().map(|x| x.0).collect();
            let ext_inputs = external_inputs(g, &nodes).into_iter().map(|(v, p)| (p, g.ty(v).size_bytes() as f64)).collect();
            Cand { target: cands[i].target, ext_producers: dag.external_producers(&nodes), ext_inputs, nodes, cost: cost_us[i] }
        })
        .collect();

    // Candidates by first node; the bound's per-node shares.
    let mut by_first: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut containing: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut share = vec![f64::INFINITY; n];
    for (ci, c) in list.iter().enumerate() {
        by_first[c.nodes[0] as usize].push(ci);
        for &x in &c.nodes {
            containing[x as usize].push(ci);
        }
        let s = c.cost / c.nodes.len() as f64;
        for &x in &c.nodes {
            share[x as usize] = share[x as usize].min(s);
        }
    }
    if let Some(i) = share.iter().position(|s| s.is_infinite()) {
        let node = &g.nodes[i];
        return Err(PartitionError(format!("node '{}' ({}): no candidate with a finite cost holds it", node.name, node.op.name())));
    }
    let mut suffix = vec![0.0; n + 1];
    for i in (0..n).rev() {
        suffix[i] = suffix[i + 1] + share[i];
    }

    // Devices: an index per distinct device of the targets.
    let device_names: Vec<&str> = targets.targets.iter().map(|t| t.device()).collect::<BTreeSet<_>>().into_iter().collect();
    let device_of: Vec<u32> = targets.targets.iter().map(|t| device_names.iter().position(|d| *d == t.device()).unwrap() as u32).collect();
    let multi = device_names.len() > 1;

    // Nodes without node producers (ready as soon as nothing is required), and, for each first-uncovered
    // index f, the nodes before f with a consumer at or after f (their consumers may be ready).
    let roots: Vec<u32> = (0..n as u32).filter(|&x| dag.preds[x as usize].is_empty()).collect();
    let mut live: Vec<Vec<u32>> = vec![Vec::new(); n + 1];
    for p in 0..n {
        if let Some(&last) = dag.succs[p].last() {
            for l in &mut live[p + 1..=last as usize] {
                l.push(p as u32);
            }
        }
    }

    let is_covered = |f: u32, extras: &[u32], x: u32| x < f || contains(extras, x);
    let bound = |f: u32, extras: &[u32]| (suffix[f as usize] - extras.iter().map(|&e| share[e as usize]).sum::<f64>()).max(0.0);

    // One search: exact (`beam` None) or with a beam; `Ok(None)` when it ran past `budget.max_states`.
    let run = |beam: Option<usize>| -> Result<Option<(Vec<State>, usize, usize)>, PartitionError> {
        let start = vec![0, 0, NONE];
        let mut states: Vec<State> = vec![State { key: start.clone(), g: 0.0, parent: None, closed: false }];
        let mut index: HashMap<Vec<u32>, usize> = HashMap::new();
        index.insert(start, 0);
        let mut heap: BinaryHeap<Reverse<(Ord64, u64, usize)>> = BinaryHeap::new();
        let mut seq = 0u64;
        heap.push(Reverse((Ord64(bound(0, &[])), seq, 0)));
        let mut expanded = 0usize;
        // The beam: per count of covered nodes, the `beam` lowest estimates admitted (a max-heap).
        let mut admitted: Vec<BinaryHeap<Ord64>> = if beam.is_some() { (0..=n).map(|_| BinaryHeap::new()).collect() } else { Vec::new() };
        let mut admit = |covered: usize, estimate: f64| -> bool {
            let Some(w) = beam else { return true };
            let level = &mut admitted[covered];
            if level.len() < w {
                level.push(Ord64(estimate));
                return true;
            }
            if level.peek().is_some_and(|worst| estimate < worst.0) {
                level.pop();
                level.push(Ord64(estimate));
                return true;
            }
            false
        };
        let goal = loop {
            let Some(Reverse((_, _, si))) = heap.pop() else {
                return Err(PartitionError(match beam {
                    None => format!("graph '{}': no cover by the candidates keeps the partition graph acyclic (candidates may overlap badly)", g.name),
                    Some(w) => format!(
                        "graph '{}': the exact partition search ran past {} states and a beam of {w} found no cover",
                        g.name, budget.max_states
                    ),
                }));
            };
            if states[si].closed {
                continue;
            }
            states[si].closed = true;
            expanded += 1;
            let key = states[si].key.clone();
            let (f, extras, last, frontier_dev) = parse_key(&key);
            if f as usize == n {
                break si;
            }
            // Ready uncovered nodes: f, uncovered roots, uncovered consumers of covered nodes.
            let mut starts: Vec<u32> = vec![f];
            starts.extend(roots[roots.partition_point(|&r| r < f)..].iter().copied());
            for &p in live[f as usize].iter().chain(extras) {
                starts.extend(dag.succs[p as usize].iter().copied());
            }
            starts.sort_unstable();
            starts.dedup();
            starts.retain(|&u| !is_covered(f, extras, u) && dag.preds[u as usize].iter().all(|&p| is_covered(f, extras, p)));
            // A ready node may be left for later only if some candidate could hold it that is not ready now: in
            // the canonical order the next partition has the smallest first node among the ready ones, so the
            // partition holding a ready node before the chosen one's first node must be waiting for something.
            let can_wait: Vec<bool> = starts
                .iter()
                .map(|&u| {
                    containing[u as usize].iter().any(|&di| {
                        let d = &list[di];
                        !d.nodes.iter().any(|&x| is_covered(f, extras, x)) && d.ext_producers.iter().any(|&p| !is_covered(f, extras, p))
                    })
                })
                .collect();
            for &u in &starts {
                for &ci in &by_first[u as usize] {
                    let c = &list[ci];
                    if c.nodes.iter().any(|&x| is_covered(f, extras, x)) || !c.ext_producers.iter().all(|&p| is_covered(f, extras, p)) {
                        continue;
                    }
                    // Canonical order (partial-order reduction): a path lists a cover's partitions as Kahn's
                    // algorithm does when it always takes the ready partition with the smallest first node. In
                    // such a sequence a partition starting before its predecessor must depend on it (it was not
                    // ready before), so other orders of the same cover are skipped; every cover keeps one path.
                    if starts.iter().zip(&can_wait).any(|(&u, &w)| u < c.nodes[0] && !w) {
                        continue;
                    }
                    if let Some(l) = last {
                        let prev = &list[l];
                        if c.nodes[0] < prev.nodes[0] && !c.ext_producers.iter().any(|&p| contains(&prev.nodes, p)) {
                            continue;
                        }
                    }
                    // Edge cost.
                    let dev = device_of[c.target];
                    let mut cost = c.cost;
                    for &(p, bytes) in &c.ext_inputs {
                        let same = !multi || {
                            let at = frontier_dev
                                .chunks(2)
                                .find(|pair| pair[0] == p)
                                .expect("a covered producer with an uncovered consumer is on the frontier");
                            at[1] == dev
                        };
                        cost += crossing.cost(bytes, same, targets.targets[c.target].device());
                    }
                    // Next key.
                    let mut covered_after: Vec<u32> = extras.iter().copied().chain(c.nodes.iter().copied()).collect();
                    covered_after.sort_unstable();
                    let mut nf = f;
                    let mut k = 0;
                    while (nf as usize) < n && (k < covered_after.len() && covered_after[k] == nf) {
                        nf += 1;
                        k += 1;
                    }
                    let nextras = &covered_after[k..];
                    let mut nkey: Vec<u32> = Vec::with_capacity(3 + nextras.len());
                    nkey.push(nf);
                    nkey.push(nextras.len() as u32);
                    nkey.extend_from_slice(nextras);
                    nkey.push(ci as u32);
                    if multi {
                        let open = |x: u32| dag.succs[x as usize].iter().any(|&s| !is_covered(nf, nextras, s));
                        let mut pairs: Vec<(u32, u32)> = frontier_dev.chunks(2).map(|p| (p[0], p[1])).filter(|&(x, _)| open(x)).collect();
                        pairs.extend(c.nodes.iter().filter(|&&x| open(x)).map(|&x| (x, dev)));
                        pairs.sort_unstable();
                        for (x, d) in pairs {
                            nkey.extend([x, d]);
                        }
                    }
                    let ng = states[si].g + cost;
                    let estimate = ng + bound(nf, nextras);
                    match index.get(&nkey) {
                        Some(&ti) => {
                            let t = &mut states[ti];
                            if t.closed {
                                continue;
                            }
                            if ng < t.g && admit(nf as usize + nextras.len(), estimate) {
                                t.g = ng;
                                t.parent = Some((si, ci));
                                seq += 1;
                                heap.push(Reverse((Ord64(estimate), seq, ti)));
                            }
                        }
                        None => {
                            if !admit(nf as usize + nextras.len(), estimate) {
                                continue;
                            }
                            if states.len() >= budget.max_states {
                                return Ok(None);
                            }
                            let ti = states.len();
                            index.insert(nkey.clone(), ti);
                            states.push(State { key: nkey, g: ng, parent: Some((si, ci)), closed: false });
                            seq += 1;
                            heap.push(Reverse((Ord64(estimate), seq, ti)));
                        }
                    }
                }
            }
        };
        Ok(Some((states, goal, expanded)))
    };
    let (states, goal, expanded, beam) = match run(None)? {
        Some((states, goal, expanded)) => (states, goal, expanded, None),
        None => match run(Some(budget.beam))? {
            Some((states, goal, expanded)) => (states, goal, expanded, Some(budget.beam)),
            None => {
                return Err(PartitionError(format!(
                    "graph '{}': the partition search ran past {} states, exact and with a beam of {}",
                    g.name, budget.max_states, budget.beam
                )))
            }
        },
    };

    // The path, first candidate first.
    let mut path: Vec<usize> = Vec::new();
    let mut at = goal;
    while let Some((p, ci)) = states[at].parent {
        path.push(ci);
        at = p;
    }
    path.reverse();
    let winners: Vec<(Candidate, f64)> =
        path.iter().map(|&ci| (Candidate { target: list[ci].target, nodes: list[ci].nodes.iter().map(|&x| NodeId(x)).collect() }, list[ci].cost)).collect();

    let units: Vec<(usize, Vec<u32>, f64)> = path.iter().map(|&ci| (list[ci].target, list[ci].nodes.clone(), list[ci].cost)).collect();
    let chosen = merge_winners(g, &dag, &units)
        .into_iter()
        .map(|(target, nodes, cost)| {
            let first = nodes[0];
            let alternative = list
                .iter()
                .filter(|c| c.target != target && contains(&c.nodes, first))
                .min_by(|a, b| a.cost.total_cmp(&b.cost))
                .map(|c| (c.target, c.cost));
            Chosen { target, nodes: nodes.into_iter().map(NodeId).collect(), cost_us: cost, alternative }
        })
        .collect();
    Ok(SearchOutcome {
        chosen,
        winners,
        total_us: states[goal].g,
        states_expanded: expanded,
        states_seen: states.len(),
        candidates_used: list.len(),
        beam,
    })
}
