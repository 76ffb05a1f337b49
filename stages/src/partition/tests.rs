use super::*;
use crate::ir::*;
use proptest::prelude::*;

/// A random DAG of binary/unary f32 ops over two inputs; `edges` pick operands among earlier values.
fn random_graph(edges: &[(bool, usize, usize)]) -> Graph {
    let mut g = Graph::new("r");
    let mut vals = vec![g.add_input("a", TensorType::f32([4])), g.add_input("b", TensorType::f32([4]))];
    for (i, &(binary, x, y)) in edges.iter().enumerate() {
        let (x, y) = (vals[x % vals.len()], vals[y % vals.len()]);
        let v = if binary {
            g.add(format!("n{i}"), Op::Binary(BinaryOp::Add), &[x, y]).unwrap()
        } else {
            g.add(format!("n{i}"), Op::Unary(UnaryOp::Relu), &[x]).unwrap()
        };
        vals.push(v);
    }
    let uses = g.use_counts();
    let unused: Vec<ValueId> = g.nodes.iter().map(|n| n.outputs[0]).filter(|o| uses[o.index()] == 0).collect();
    g.outputs.extend(unused);
    g
}

fn to_partitioning(g: &Graph, assigned: &[usize]) -> Partitioning {
    let (parts, order) = merge_convex(g, assigned);
    let t = Target::parse("cpu").unwrap();
    Partitioning {
        partitions: order.into_iter().map(|p| Partition { target: t.clone(), nodes: parts[p].1.clone(), cost_us: 0.0 }).collect(),
        cost_source: CostSource::Analytical,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Whatever the assignment, merged partitions cover every node once, stay convex and acyclic.
    #[test]
    fn merged_partitions_cover_once_and_stay_acyclic(
        edges in proptest::collection::vec((any::<bool>(), any::<usize>(), any::<usize>()), 1..40),
        colors in proptest::collection::vec(0usize..3, 40),
    ) {
        let g = random_graph(&edges);
        let assigned: Vec<usize> = (0..g.nodes.len()).map(|i| colors[i]).collect();
        let p = to_partitioning(&g, &assigned);
        prop_assert_eq!(check(&g, &p), Ok(()));
        // Every partition holds one target's nodes.
        let (parts, _) = merge_convex(&g, &assigned);
        for (t, nodes) in &parts {
            prop_assert!(nodes.iter().all(|n| assigned[n.index()] == *t));
        }
    }

    /// With one target, everything connected merges into one partition per weakly connected component.
    #[test]
    fn one_target_merges_chains(edges in proptest::collection::vec((Just(false), any::<usize>(), Just(0usize)), 1..20)) {
        let g = random_graph(&edges);
        let (parts, _) = merge_convex(&g, &vec![0; g.nodes.len()]);
        // Unary-only graphs are forests rooted at the two inputs: at most one partition per node rooted at an input.
        let roots = g.nodes.iter().filter(|n| g.producer(n.inputs[0]).is_none()).count();
        prop_assert!(parts.len() <= roots);
    }
}

#[test]
fn a_path_through_another_target_splits_the_partition() {
    // x -> a(0) -> b(1) -> c(0), and a -> c directly: c cannot join a's partition (a -> b -> c would leave and
    // re-enter it).
    let mut g = Graph::new("diamond");
    let x = g.add_input("x", TensorType::f32([4]));
    let a = g.add("a", Op::Unary(UnaryOp::Relu), &[x]).unwrap();
    let b = g.add("b", Op::Unary(UnaryOp::Exp), &[a]).unwrap();
    let c = g.add("c", Op::Binary(BinaryOp::Add), &[a, b]).unwrap();
    g.outputs.push(c);
    let (parts, order) = merge_convex(&g, &[0, 1, 0]);
    assert_eq!(parts.len(), 3);
    assert_eq!(order, vec![0, 1, 2]);
    assert_eq!(check(&g, &to_partitioning(&g, &[0, 1, 0])), Ok(()));
    // A bad partitioning is caught.
    let t = Target::parse("cpu").unwrap();
    let bad = Partitioning {
        partitions: vec![
            Partition { target: t.clone(), nodes: vec![NodeId(0), NodeId(2)], cost_us: 0.0 },
            Partition { target: t, nodes: vec![NodeId(1)], cost_us: 0.0 },
        ],
        cost_source: CostSource::Analytical,
    };
    assert!(check(&g, &bad).unwrap_err().contains("not convex"));
}
