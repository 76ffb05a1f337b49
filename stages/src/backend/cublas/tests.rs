use super::support::{self, Epilogue};
use super::*;
use crate::ir::{BinaryOp, DType, GeluApprox, Op, Tensor, TensorType, UnaryOp};
use tessera_kernels::runtime::cuda::blas::Activation;
use tessera_kernels::runtime::cuda::library::CallDesc;

fn cublas() -> Target {
    Target::parse("cuda -compiler=cublas").unwrap()
}

/// x[4,16] -> MatMul(w1) -> Add(b1) -> Relu -> MatMul(w2) -> Add(residual r) -> Add(b2), all of `dt`.
fn mlp(dt: DType) -> Graph {
    let mut g = Graph::new("mlp");
    let t = |s: &[usize]| TensorType::new(dt, s.to_vec());
    let x = g.add_input("x", t(&[4, 16]));
    let w1 = g.add_input("w1", t(&[16, 32]));
    let b1 = g.add_input("b1", t(&[32]));
    let w2 = g.add_input("w2", t(&[32, 8]));
    let r = g.add_input("r", t(&[4, 8]));
    let b2 = g.add_input("b2", t(&[1, 8]));
    let m1 = g.add("mm1", Op::MatMul, &[x, w1]).unwrap();
    let a1 = g.add("add1", Op::Binary(BinaryOp::Add), &[b1, m1]).unwrap();
    let h = g.add("relu", Op::Unary(UnaryOp::Relu), &[a1]).unwrap();
    let m2 = g.add("mm2", Op::MatMul, &[h, w2]).unwrap();
    let a2 = g.add("res", Op::Binary(BinaryOp::Add), &[m2, r]).unwrap();
    let a3 = g.add("add2", Op::Binary(BinaryOp::Add), &[a2, b2]).unwrap();
    g.outputs.push(a3);
    g
}

#[test]
fn matmul_chains_with_bias_residual_and_a_final_relu_are_supported_in_every_precision() {
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let g = mlp(dt);
        let s: Vec<bool> = (0..g.nodes.len() as u32).map(|n| CublasBackend.supports(&g, NodeId(n), &cublas())).collect();
        assert_eq!(s, [true; 6], "{dt:?}");
        let uses = g.use_counts();
        let (anchor, eps) = support::chain_of(&g, NodeId(5), &|v| uses[v.index()]).unwrap();
        assert_eq!(anchor, NodeId(3));
        assert!(matches!(eps[..], [(_, Epilogue::Residual(_)), (_, Epilogue::Bias(_))]), "{eps:?}");
        // The calls carry the graph's storage type, and the runtime's checks (at decode) take it.
        let k = CublasBackend.lower(&cublas(), &g, "f0").unwrap();
        let calls: Vec<Matmul> = postcard::from_bytes(&k.code).unwrap();
        assert!(calls.iter().all(|c| c.dtype == dt), "{dt:?}");
        let m = CublasBackend.compile_module(&cublas(), &[k]).unwrap_or_else(|e| panic!("{dt:?}: {e}"));
        assert_eq!(tessera_kernels::runtime::cuda::blas::BlasModule::decode(&m).unwrap().functions[0], calls);
    }
}

#[test]
fn what_cublaslt_cannot_compute_is_not_supported() {
    let mut g = Graph::new("g");
    let x = g.add_input("x", TensorType::f32([4, 16]));
    let w = g.add_input("w", TensorType::f32([16, 32]));
    let b = g.add_input("b", TensorType::f32([32]));
    let m = g.add("mm", Op::MatMul, &[x, w]).unwrap();
    let r = g.add("relu", Op::Unary(UnaryOp::Relu), &[m]).unwrap();
    let a = g.add("add", Op::Binary(BinaryOp::Add), &[r, b]).unwrap();
    let t = g.add("gelu", Op::Gelu { approximate: crate::ir::GeluApprox::Erf }, &[a]).unwrap();
    g.outputs.push(t);
    let s: Vec<bool> = (0..4).map(|n| support::supports(&g, NodeId(n))).collect();
    assert_eq!(s, [true, true, false, false], "a bias after the ReLU, and GELU, are not cuBLASLt epilogues");
    // A batch that is not one stride: [2,1,4,8] x [3,8,5] broadcasts to batch [2,3].
    let mut h = Graph::new("h");
    let a = h.add_input("a", TensorType::f32([2, 1, 4, 8]));
    let b = h.add_input("b", TensorType::f32([3, 8, 5]));
    let m = h.add("mm", Op::MatMul, &[a, b]).unwrap();
    h.outputs.push(m);
    assert!(support::anchor(&h, NodeId(0)).unwrap_err().0.contains("strided batch"));
    // A small constant weight is taken: the backend's kernel graph passes it as an argument.
    let mut c = Graph::new("c");
    let x = c.add_input("x", TensorType::f32([4, 4]));
    let w = c.add_const("w", Tensor::from_f32([4, 4], &[0.5; 16]));
    let m = c.add("mm", Op::MatMul, &[x, w]).unwrap();
    c.outputs.push(m);
    assert!(support::supports(&c, NodeId(0)));
    let sig = crate::ir::subgraph_signature(&c, &[NodeId(0)], crate::ir::ConstMode::LiftLarge(CublasBackend.inline_const_max()));
    assert_eq!(sig.inputs, vec![x, w]);
}

/// GPT-2's MLP: `gelu_tanh(x W + b)` is one call with cuBLASLt's GELU_BIAS epilogue in f16 and bf16; in f32 the
/// GELU stays off the call (its accuracy is undocumented, and fp32's bar is 1e-4), and the erf form never joins.
#[test]
fn the_tanh_gelu_joins_half_precision_calls_only() {
    let chain = |dt: DType, approx: GeluApprox| {
        let mut g = Graph::new("mlp");
        let t = |s: &[usize]| TensorType::new(dt, s.to_vec());
        let x = g.add_input("x", t(&[4, 16]));
        let w = g.add_input("w", t(&[16, 32]));
        let b = g.add_input("b", t(&[32]));
        let m = g.add("mm", Op::MatMul, &[x, w]).unwrap();
        let a = g.add("bias", Op::Binary(BinaryOp::Add), &[m, b]).unwrap();
        let y = g.add("gelu", Op::Gelu { approximate: approx }, &[a]).unwrap();
        g.outputs.push(y);
        g
    };
    for dt in [DType::F16, DType::BF16] {
        let g = chain(dt, GeluApprox::Tanh);
        assert!(support::supports(&g, NodeId(2)), "{dt:?}");
        let k = CublasBackend.lower(&cublas(), &g, "f0").unwrap();
        let calls: Vec<Matmul> = postcard::from_bytes(&k.code).unwrap();
        assert_eq!((calls.len(), calls[0].activation, calls[0].bias.is_some()), (1, Activation::GeluTanh, true), "{dt:?}");
        assert!(calls[0].describe().ends_with("+bias gelu"), "{}", calls[0].describe());
        assert!(!support::supports(&chain(dt, GeluApprox::Erf), NodeId(2)), "{dt:?}: the erf form");
    }
    assert!(!support::supports(&chain(DType::F32, GeluApprox::Tanh), NodeId(2)), "fp32");
}

#[test]
fn batches_fold_or_stride() {
    let shape = |a: &[usize], b: &[usize]| {
        let mut g = Graph::new("g");
        let x = g.add_input("a", TensorType::f32(a.to_vec()));
        let y = g.add_input("b", TensorType::f32(b.to_vec()));
        let m = g.add("mm", Op::MatMul, &[x, y]).unwrap();
        g.outputs.push(m);
        support::matmul_shape(&g, NodeId(0)).unwrap()
    };
    // A layer's weight shared by every batch: one tall GEMM.
    assert_eq!(shape(&[2, 3, 4, 8], &[8, 5]), (1, 24, 5, 8, 0, 0));
    // Attention's scores: both batched.
    assert_eq!(shape(&[12, 7, 64], &[12, 64, 7]), (12, 7, 7, 64, 7 * 64, 64 * 7));
    // A shared left operand over batched right ones.
    assert_eq!(shape(&[1, 4, 8], &[3, 8, 5]), (3, 4, 5, 8, 0, 40));
}

#[test]
fn a_merged_partition_lowers_to_one_call_per_chain_with_its_intermediate_in_scratch() {
    let g = mlp(DType::F16);
    let k = CublasBackend.lower(&cublas(), &g, "f0").unwrap();
    let calls: Vec<Matmul> = postcard::from_bytes(&k.code).unwrap();
    assert_eq!(calls.len(), 2);
    let (c1, c2) = (&calls[0], &calls[1]);
    assert_eq!((c1.m, c1.n, c1.k, c1.batch), (4, 32, 16, 1));
    assert_eq!((c1.a.arg, c1.b.arg, c1.bias.map(|b| b.arg), c1.activation, c1.residual), (0, 1, Some(2), Activation::Relu, None));
    // The hidden layer lives in scratch (argument 7 = 6 inputs + 1 output), the workspace after it.
    assert_eq!((c1.d.arg, c1.d.offset), (7, 0));
    assert_eq!((c2.a.arg, c2.a.offset), (7, 0));
    assert_eq!((c2.d.arg, c2.residual.map(|r| r.arg), c2.bias.map(|b| b.arg), c2.activation), (6, Some(4), Some(5), Activation::None));
    assert_eq!(c1.workspace.offset, 256);
    assert_eq!(k.info.scratch_bytes, 256 + tessera_kernels::runtime::cuda::blas::WORKSPACE_BYTES);
    let m = CublasBackend.compile_module(&cublas(), &[k]).unwrap();
    assert_eq!(m.format, tessera_kernels::runtime::cuda::blas::FORMAT);
    assert_eq!(tessera_kernels::runtime::cuda::blas::BlasModule::decode(&m).unwrap().functions[0], calls);
}

#[test]
fn a_damaged_module_is_refused_at_decode() {
    let g = mlp(DType::F32);
    let k = CublasBackend.lower(&cublas(), &g, "f0").unwrap();
    let mut calls: Vec<Matmul> = postcard::from_bytes(&k.code).unwrap();
    calls[1].k = 64; // B would span past w2
    let bad = LoweredKernel { info: k.info.clone(), code: postcard::to_stdvec(&calls).unwrap() };
    let e = CublasBackend.compile_module(&cublas(), &[bad]).unwrap_err().to_string();
    assert!(e.contains("matmul 1") && e.contains("spans more than"), "{e}");
    let e = CublasBackend.lower(&Target::parse("cuda").unwrap(), &g, "f0").unwrap_err().to_string();
    assert!(e.contains("not 'cublas'"), "{e}");
}

/// The target's tuning budget bounds what the tune stage measures, the default always first.
#[test]
fn the_tuning_budget_bounds_the_configurations_measured() {
    use crate::stages::tune::configs_to_measure;
    let g = mlp(DType::F16);
    let all = configs_to_measure(&CublasBackend, &cublas(), &g).unwrap();
    assert_eq!(all.len(), super::RANKS.ranks as usize, "the default budget measures every rank");
    for budget in 1..=all.len() {
        let t = Target::parse(&format!("cuda -compiler=cublas -tune-configs={budget}")).unwrap();
        assert_eq!(configs_to_measure(&CublasBackend, &t, &g).unwrap(), all[..budget], "budget {budget}");
    }
    let e = Target::parse("cuda -compiler=cublas -tune-configs=0").unwrap_err().to_string();
    assert!(e.contains("tune-configs"), "{e}");
}

#[test]
fn each_configuration_runs_one_heuristic_rank() {
    use crate::backend::Backend;
    use super::RANKS;
    let g = mlp(DType::F16);
    let t = cublas();
    let configs = CublasBackend.configs_for(&t, &g);
    assert_eq!(configs.len(), RANKS.ranks as usize);
    assert_eq!(configs[0], CublasBackend.default_config(&t), "the default comes first");
    assert!(configs.iter().all(|c| CublasBackend.configs(&t).names().any(|n| n == c)));
    for (rank, config) in configs.iter().enumerate() {
        let k = CublasBackend.lower_config(&t, &g, "f0", config).unwrap();
        let calls: Vec<Matmul> = postcard::from_bytes(&k.code).unwrap();
        assert!(calls.iter().all(|c| c.rank as usize == rank), "{config}: {calls:?}");
        // Apart from the rank, every configuration is the same call.
        let default: Vec<Matmul> = postcard::from_bytes(&CublasBackend.lower(&t, &g, "f0").unwrap().code).unwrap();
        let mut same = calls.clone();
        same.iter_mut().for_each(|c| c.rank = 0);
        assert_eq!(same, default);
        assert!(CublasBackend.compile_module(&t, &[k]).is_ok());
    }
    assert_eq!(RANKS.name(0), CublasBackend.default_config(&t));
    let e = CublasBackend.lower_config(&t, &g, "f0", "cublas/v2/algo9").unwrap_err().to_string();
    assert!(e.contains("no configuration 'cublas/v2/algo9'"), "{e}");
    // A damaged rank is refused when the module is decoded.
    let k = CublasBackend.lower(&t, &g, "f0").unwrap();
    let mut calls: Vec<Matmul> = postcard::from_bytes(&k.code).unwrap();
    calls[0].rank = 200;
    let bad = LoweredKernel { info: k.info.clone(), code: postcard::to_stdvec(&calls).unwrap() };
    let e = CublasBackend.compile_module(&t, &[bad]).unwrap_err().to_string();
    assert!(e.contains("rank 200"), "{e}");
}
