//! The memory plan on the zoo's real graphs: one step per node (activations only; weights live in the
//! constant section, not the arena), linked, read back (which checks that no two live buffers overlap), and
//! the arena compared with the sum of all activations.

use std::time::Instant;
use tessera_kernels::artifact::{slot_bytes, Artifact};
use tessera_stages::stages::link::{link, LinkInput, LinkStep, ValueRef};
use tessera_stages::backend::{FunctionInfo, Module};
use tessera_stages::ir::{Graph, ValueDef};

/// A link input running `g` node by node. Module bytes are never loaded: this measures the plan only.
fn node_by_node(g: &Graph) -> LinkInput {
    let mut refs: Vec<Option<ValueRef>> = vec![None; g.values.len()];
    let mut input = LinkInput { model: g.name.clone(), ..Default::default() };
    for (i, &v) in g.inputs.iter().enumerate() {
        refs[v.index()] = Some(ValueRef::Input(i as u32));
        input.inputs.push((g.value(v).name.clone(), g.ty(v).clone()));
    }
    let mut functions = Vec::new();
    for (n, node) in g.nodes.iter().enumerate() {
        let mut args = Vec::new();
        let mut ins = Vec::new();
        for &v in &node.inputs {
            if matches!(g.value(v).def, ValueDef::Const(_)) {
                continue;
            }
            args.push(refs[v.index()].expect("topological order"));
            ins.push(g.ty(v).clone());
        }
        let mut outs = Vec::new();
        for &v in &node.outputs {
            refs[v.index()] = Some(ValueRef::Value(input.values.len() as u32));
            args.push(ValueRef::Value(input.values.len() as u32));
            input.values.push(g.ty(v).clone());
            outs.push(g.ty(v).clone());
        }
        functions.push(FunctionInfo { symbol: format!("node{n}"), inputs: ins, outputs: outs, scratch_bytes: 0 });
        input.steps.push(LinkStep { module: 0, function: n as u32, args });
    }
    for (i, &v) in g.outputs.iter().enumerate() {
        input.outputs.push((format!("out{i}"), refs[v.index()].expect("outputs are computed")));
    }
    input.modules.push(Module { backend: "plan".into(), target: "none".into(), format: tessera_kernels::runtime::c::FORMAT, functions, bytes: vec![] });
    input
}

/// The most bytes live at any one step: no plan can use less (inputs live throughout, a value from its
/// writer to its last reader, outputs to the end).
fn peak_live(input: &LinkInput) -> u64 {
    let end = input.steps.len();
    let mut life: Vec<(usize, usize)> = vec![(usize::MAX, 0); input.values.len()];
    for (s, st) in input.steps.iter().enumerate() {
        for a in &st.args {
            if let ValueRef::Value(v) = *a {
                let l = &mut life[v as usize];
                *l = (l.0.min(s), l.1.max(s));
            }
        }
    }
    for (_, o) in &input.outputs {
        if let ValueRef::Value(v) = *o {
            life[v as usize].1 = end;
        }
    }
    let inputs: u64 = input.inputs.iter().map(|(_, t)| slot_bytes(t)).sum();
    (0..=end)
        .map(|s| inputs + life.iter().zip(&input.values).filter(|((a, b), _)| *a <= s && s <= *b).map(|(_, t)| slot_bytes(t)).sum::<u64>())
        .max()
        .unwrap()
}

#[test]
fn arena_is_close_to_the_peak_of_live_activations() {
    for model in ["resnet18", "mobilenetv2", "bert-tiny", "vit-tiny"] {
        let g = tessera_fixtures::registry::build(model, 1, None).unwrap();
        let input = node_by_node(&g);
        let t = Instant::now();
        let bytes = link(&input).unwrap();
        let link_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let a = Artifact::read(&bytes).unwrap();
        let read_s = t.elapsed().as_secs_f64();
        let (arena, all) = (a.body.arena_bytes, a.body.unplanned_bytes());
        let peak = peak_live(&input);
        let mib = |b: u64| b as f64 / 1048576.0;
        println!(
            "{model}: {} steps, {} values: arena {:.2} MiB, peak live {:.2} MiB, all activations {:.2} MiB; link {link_s:.3} s, read+validate {read_s:.3} s",
            input.steps.len(),
            input.values.len(),
            mib(arena),
            mib(peak),
            mib(all),
        );
        assert!(arena >= peak);
        assert!((arena as f64) < 1.25 * peak as f64, "{model}: arena {arena} vs peak live {peak}");
        assert!(arena * 3 < all, "{model}: arena {arena} vs all {all}");
    }
}
