//! A real `c`-backend module through the artifact and the runtime: a small graph split into one partition per
//! node, lowered and compiled by the backend (one shared object), linked with its lifted constants (one weight
//! used by two nodes, stored once), loaded from memory and run; the outputs match the reference interpreter.

use tessera_kernels::artifact::Artifact;
use tessera_stages::stages::link::{link, LinkInput, LinkStep, ValueRef};
use tessera_kernels::runtime::Executable;
use tessera_stages::backend::c::CBackend;
use tessera_stages::backend::{Backend, INLINE_CONST_MAX};
use tessera_stages::interp::{random_inputs, random_tensor, run_graph};
use tessera_stages::ir::*;
use tessera_stages::target::Target;

/// x[4x16] @ W[16x16] + b -> relu -> @ W (the same weight again) -> tanh -> softmax; outputs the relu and the
/// softmax.
fn graph() -> Graph {
    let mut g = Graph::new("two_layer");
    let x = g.add_input("x", TensorType::f32([4, 16]));
    let w = g.add_const("w", random_tensor(&TensorType::f32([16, 16]), 1, 0, 100));
    let b = g.add_const("b", random_tensor(&TensorType::f32([16]), 2, 0, 100));
    let h = g.add("mm1", Op::MatMul, &[x, w]).unwrap();
    let h = g.add("bias", Op::Binary(BinaryOp::Add), &[h, b]).unwrap();
    let r = g.add("relu", Op::Unary(UnaryOp::Relu), &[h]).unwrap();
    let h = g.add("mm2", Op::MatMul, &[r, w]).unwrap();
    let t = g.add("tanh", Op::Unary(UnaryOp::Tanh), &[h]).unwrap();
    let s = g.add("softmax", Op::Softmax { axis: 1 }, &[t]).unwrap();
    g.outputs.extend([r, s]);
    g
}

#[test]
fn c_module_runs_through_the_artifact() {
    if let Err(why) = CBackend.available() {
        panic!("the c backend needs a C compiler: {why}");
    }
    let g = graph();
    let target = Target::parse("cpu -compiler=c").unwrap();
    let mut input = LinkInput { model: g.name.clone(), ..Default::default() };
    let mut refs: Vec<Option<ValueRef>> = vec![None; g.values.len()];
    for (i, &v) in g.inputs.iter().enumerate() {
        refs[v.index()] = Some(ValueRef::Input(i as u32));
        input.inputs.push((g.value(v).name.clone(), g.ty(v).clone()));
    }
    let mut lowered = Vec::new();
    for n in 0..g.nodes.len() {
        let sig = subgraph_signature(&g, &[NodeId(n as u32)], ConstMode::LiftLarge(INLINE_CONST_MAX));
        let kernel = extract_subgraph(&g, &sig);
        let lk = CBackend.lower(&target, &kernel, &format!("node{n}")).unwrap();
        let mut args = Vec::new();
        for &v in &sig.inputs {
            let r = match &g.value(v).def {
                ValueDef::Const(t) => {
                    input.constants.push(t.clone());
                    ValueRef::Const(input.constants.len() as u32 - 1)
                }
                _ => refs[v.index()].unwrap(),
            };
            args.push(r);
        }
        for &v in &sig.outputs {
            refs[v.index()] = Some(ValueRef::Value(input.values.len() as u32));
            args.push(ValueRef::Value(input.values.len() as u32));
            input.values.push(g.ty(v).clone());
        }
        input.steps.push(LinkStep { module: 0, function: n as u32, args });
        lowered.push(lk);
    }
    input.outputs = g.outputs.iter().map(|&v| (g.value(v).name.clone(), refs[v.index()].unwrap())).collect();
    input.modules.push(CBackend.compile_module(&target, &lowered).unwrap());

    let a = Artifact::read(&link(&input).unwrap()).unwrap();
    assert_eq!(input.constants.len(), 2, "w is lifted for both matmuls (b is small enough to be inlined)");
    assert_eq!(a.body.constants.len(), 1, "and stored once");
    let mut exe = Executable::load(&a).unwrap();
    for seed in 0..3 {
        let x = random_inputs(&g, seed);
        let want = run_graph(&g, &x).unwrap();
        let got = exe.run(&x).unwrap();
        for (k, (gt, wt)) in got.iter().zip(&want).enumerate() {
            assert_eq!(gt.ty, wt.ty);
            for (i, (p, q)) in gt.to_f32_vec().iter().zip(wt.to_f32_vec()).enumerate() {
                assert!((p - q).abs() <= 1e-5 * q.abs().max(1.0), "seed {seed} output {k} element {i}: {p} vs {q}");
            }
        }
    }
}
