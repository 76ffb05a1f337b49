//! Extraction of a subgraph as a standalone graph: what a backend compiles for one partition.

use super::graph::{Graph, ValueDef, ValueId};
use super::hash::SubgraphSignature;
use std::collections::BTreeMap;

/// Builds the standalone graph of a subgraph from its signature: inputs in the signature's canonical input
/// order (lifted constants included, as inputs), outputs in its canonical output order, nodes in canonical order,
/// and canonical names (`in0`, `c0`, `n0`, `n0:1`, `out0` never appear from the model). The result is a pure
/// function of the signature's structure, so code generated from it is the same in whichever model the
/// partition was found.
pub fn extract_subgraph(g: &Graph, sig: &SubgraphSignature) -> Graph {
    let mut out = Graph::new(format!("sub_{}", sig.digest.short()));
    let mut map: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    for (i, &v) in sig.inputs.iter().enumerate() {
        map.insert(v, out.add_input(format!("in{i}"), g.ty(v).clone()));
    }
    let mut n_consts = 0;
    for (k, &n) in sig.nodes.iter().enumerate() {
        let node = g.node(n);
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for &i in &node.inputs {
            let v = match map.get(&i) {
                Some(&v) => v,
                None => {
                    let ValueDef::Const(t) = &g.value(i).def else {
                        panic!("extract_subgraph: value {i} is neither a boundary input, a constant, nor defined inside");
                    };
                    let c = out.add_const(format!("c{n_consts}"), t.clone());
                    n_consts += 1;
                    map.insert(i, c);
                    c
                }
            };
            inputs.push(v);
        }
        let names: Vec<String> = match node.outputs.len() {
            1 => vec![format!("n{k}")],
            m => (0..m).map(|j| format!("n{k}:{j}")).collect(),
        };
        let outs = out
            .add_node_named(format!("n{k}"), node.op.clone(), &inputs, names)
            .expect("a node that typed in its graph types in the extracted subgraph");
        for (&a, &b) in node.outputs.iter().zip(&outs) {
            map.insert(a, b);
        }
    }
    for &o in &sig.outputs {
        out.outputs.push(map[&o]);
    }
    out
}

#[cfg(test)]
#[path = "extract_tests.rs"]
mod tests;
