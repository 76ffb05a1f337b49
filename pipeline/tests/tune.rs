//! The tune stage: measured candidate costs, memoized under a complete key.

use std::time::Instant;
use tessera::build::Ctx;
use tessera_stages::stages::lower::Lower;
use tessera_stages::stage::Stage;
use tessera_stages::device::cpu_fingerprint;
use tessera::memo::Memo;
use tessera_stages::partition::plan::kernel_signature;
use tessera_stages::context::CostSource;
use tessera_stages::stages::tune::{measure_candidates, measure_candidates_with, TuneKeyParams};
use tessera::zoo::all_backends;
use tessera_kernels::runtime::measure::MeasureOptions;
use tessera_stages::backend::{c::CBackend, Backend, BackendError, LoweredKernel, Module, TunableSet};
use tessera_stages::ir::{Graph, NodeId, Op, Tensor, TensorType};
use tessera_stages::rules::Rule;
use tessera_stages::target::{Target, TargetSet};
use tessera_store::{Digest, OpenOptions, Store};

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), OpenOptions::writable()).unwrap();
    (dir, s)
}

fn targets() -> TargetSet {
    TargetSet::parse(&["cpu -compiler=c".to_string(), "cpu -compiler=gemm".to_string()]).unwrap()
}

fn t(s: &str) -> Target {
    Target::parse(s).unwrap()
}

fn model(name: &str, seq: Option<usize>) -> Graph {
    let mut g = tessera_fixtures::build(name, 1, seq).unwrap();
    tessera_stages::passes::simplify::simplify(&mut g).unwrap();
    tessera_stages::passes::fold::fold_constants(&mut g).unwrap();
    g
}

fn first(g: &Graph, pred: impl Fn(&Op) -> bool) -> NodeId {
    NodeId(g.nodes.iter().position(|n| pred(&n.op)).expect("a matching node") as u32)
}

fn is_elementwise(op: &Op) -> bool {
    matches!(op, Op::Unary(_) | Op::Binary(_))
}

fn tune_stats(memo: &Memo) -> (u64, u64) {
    let s = memo.stats().get("tune").copied().unwrap_or_default();
    (s.executions, s.hits)
}

#[test]
fn bert_tiny_candidates_measure_once_then_hit() {
    let (_d, store) = store();
    let g = model("bert-tiny", Some(16));
    let (backends, targets) = (all_backends(), targets());
    let mm = first(&g, |op| matches!(op, Op::MatMul));
    let ew = first(&g, is_elementwise);
    let cands = vec![
        (t("cpu -compiler=c"), vec![mm]),
        (t("cpu -compiler=gemm"), vec![mm]),
        (t("cpu -compiler=c"), vec![ew]),
        (t("cpu -compiler=gemm"), vec![ew]),
        (t("cpu -compiler=c"), vec![mm]),
    ];
    let memo = Memo::new(&store);
    let ctx = Ctx::new(&memo, &targets, &backends);
    let costs = measure_candidates(&ctx, &g, &cands).unwrap();
    assert_eq!(costs.len(), cands.len());
    for i in [0, 1, 2] {
        let c = &costs[i];
        assert_eq!(c.source, CostSource::Measured, "candidate {i}: {c:?}");
        assert!(c.us.is_finite() && c.us > 0.0, "candidate {i}: {c:?}");
        let m = c.measurement.unwrap();
        assert!(m.runs >= 5 && m.min_us <= m.median_us && m.median_us <= m.p90_us, "{m:?}");
    }
    assert_eq!(costs[3].source, CostSource::Unsupported, "{:?}", costs[3]);
    assert_eq!(costs[3].us, f64::INFINITY);
    assert!(costs[3].error.as_deref().is_some_and(|e| e.contains("gemm")), "{:?}", costs[3].error);
    // A repeated candidate is the same key, measured once (and asked of the memo once per call).
    assert_eq!(costs[0].key, costs[4].key);
    assert_eq!(costs[0], costs[4]);
    assert_eq!(tune_stats(&memo), (4, 0));
    // The lowered kernel is recorded under the compile path's own lower key.
    let sig = kernel_signature(&g, &[mm], tessera_stages::backend::INLINE_CONST_MAX);
    let c = t("cpu -compiler=c");
    let no_graph = || -> anyhow::Result<tessera_stages::ir::Graph> { unreachable!("only the key is built") };
    let backend = ctx.backend(&c).unwrap();
    let config = backend.default_config(&c);
    let lower = Lower { kernel: sig.digest, target: &c, backend, graph: &no_graph, symbol: "k", config: &config };
    let lk = lower.key().unwrap();
    assert!(store.memo_lookup("lower", &lk).unwrap().is_some());

    // Same memo again, and a fresh run on the same store: all hits, same results.
    let again = measure_candidates(&ctx, &g, &cands).unwrap();
    assert_eq!(again, costs);
    assert_eq!(tune_stats(&memo), (4, 4));
    let memo2 = Memo::new(&store);
    let ctx2 = Ctx::new(&memo2, &targets, &backends);
    let lower_before = memo2.stats().get("lower").copied().unwrap_or_default();
    assert_eq!(measure_candidates(&ctx2, &g, &cands).unwrap(), costs);
    assert_eq!(tune_stats(&memo2), (0, 4));
    assert_eq!(memo2.stats().get("lower").copied().unwrap_or_default(), lower_before, "a hit lowers nothing");
}

#[test]
fn identical_kernels_of_different_layers_share_one_measurement() {
    let (_d, store) = store();
    let g = model("bert-tiny", Some(16));
    let (backends, targets) = (all_backends(), targets());
    let memo = Memo::new(&store);
    let ctx = Ctx::new(&memo, &targets, &backends);
    // Every MatMul against a 2-D weight: the Q/K/V projections of both layers have one signature.
    let mms: Vec<NodeId> = (0..g.nodes.len() as u32)
        .map(NodeId)
        .filter(|&n| matches!(g.node(n).op, Op::MatMul) && g.constant(g.node(n).inputs[1]).is_some())
        .collect();
    assert!(mms.len() >= 4, "{}", mms.len());
    let cands: Vec<(Target, Vec<NodeId>)> = mms.iter().map(|&n| (t("cpu -compiler=gemm"), vec![n])).collect();
    let costs = measure_candidates(&ctx, &g, &cands).unwrap();
    let distinct: std::collections::BTreeSet<Digest> = costs.iter().map(|c| c.key).collect();
    assert!(distinct.len() < cands.len(), "weights must not be part of the key");
    assert_eq!(tune_stats(&memo), (distinct.len() as u64, 0), "one memo call per distinct key");
}

#[test]
fn gemm_refuses_a_lone_elementwise_node_and_the_refusal_is_recorded() {
    let (_d, store) = store();
    let mut g = Graph::new("ew");
    let x = g.add_input("x", TensorType::f32([4, 8]));
    let y = g.add("relu", Op::Unary(tessera_stages::ir::UnaryOp::Relu), &[x]).unwrap();
    g.outputs.push(y);
    let (backends, targets) = (all_backends(), targets());
    let memo = Memo::new(&store);
    let ctx = Ctx::new(&memo, &targets, &backends);
    let cands = vec![(t("cpu -compiler=gemm"), vec![NodeId(0)])];
    let c = measure_candidates(&ctx, &g, &cands).unwrap().remove(0);
    assert_eq!((c.source, c.us), (CostSource::Unsupported, f64::INFINITY), "{c:?}");
    assert_eq!(tune_stats(&memo), (1, 0));
    let memo2 = Memo::new(&store);
    let ctx2 = Ctx::new(&memo2, &targets, &backends);
    let again = measure_candidates(&ctx2, &g, &cands).unwrap().remove(0);
    assert_eq!(again, c);
    assert_eq!(tune_stats(&memo2), (0, 1), "a refusal is not retried");
}

fn matmul_graph(m: usize, k: usize, n: usize) -> Graph {
    let mut g = Graph::new("mm");
    let a = g.add_input("a", TensorType::f32([m, k]));
    let w = g.add_const("w", Tensor::from_f32([k, n], &vec![0.5; k * n]));
    let y = g.add("mm", Op::MatMul, &[a, w]).unwrap();
    g.outputs.push(y);
    g
}

#[test]
fn a_bigger_matmul_measures_slower() {
    let (_d, store) = store();
    let (backends, targets) = (all_backends(), targets());
    let memo = Memo::new(&store);
    let ctx = Ctx::new(&memo, &targets, &backends);
    for target in ["cpu -compiler=c", "cpu -compiler=gemm"] {
        let tiny = measure_candidates(&ctx, &matmul_graph(2, 4, 4), &[(t(target), vec![NodeId(0)])]).unwrap().remove(0);
        let big = measure_candidates(&ctx, &matmul_graph(128, 128, 128), &[(t(target), vec![NodeId(0)])]).unwrap().remove(0);
        assert_eq!((tiny.source, big.source), (CostSource::Measured, CostSource::Measured), "{target}");
        // 2 MFLOP against 32 multiply-adds: even a threaded GEMM is far slower on the big one.
        assert!(big.us > 4.0 * tiny.us, "{target}: tiny {} us, big {} us", tiny.us, big.us);
    }
}

/// The `c` backend as it is, except that this machine "has no compiler": nothing can be measured.
struct NoCompiler(CBackend);

impl Backend for NoCompiler {
    fn spec(&self) -> &'static tessera_stages::target::BackendSpec {
        self.0.spec()
    }
    fn version(&self) -> tessera_stages::code::CodeVersion {
        self.0.version()
    }
    fn available(&self) -> Result<(), String> {
        Err("no C compiler on this machine (test)".into())
    }
    fn supports(&self, g: &Graph, n: NodeId, target: &Target) -> bool {
        self.0.supports(g, n, target)
    }
    fn rules(&self) -> Rule {
        self.0.rules()
    }
    fn colors(&self) -> (&'static str, &'static str) {
        self.0.colors()
    }
    fn estimate_us(&self, g: &Graph, nodes: &[NodeId], target: &Target) -> f64 {
        self.0.estimate_us(g, nodes, target)
    }
    fn lower(&self, target: &Target, kernel: &Graph, symbol: &str) -> Result<LoweredKernel, BackendError> {
        self.0.lower(target, kernel, symbol)
    }
    fn compile_module(&self, _: &Target, _: &[LoweredKernel]) -> Result<Module, BackendError> {
        panic!("nothing may be compiled when the backend is unavailable")
    }
}

#[test]
fn unavailable_backend_falls_back_to_the_estimate() {
    let (_d, store) = store();
    let backends: Vec<Box<dyn Backend>> = vec![Box::new(NoCompiler(CBackend))];
    let targets = TargetSet::parse(&["cpu -compiler=c".to_string()]).unwrap();
    let memo = Memo::new(&store);
    let ctx = Ctx::new(&memo, &targets, &backends);
    let g = matmul_graph(8, 8, 8);
    let c = measure_candidates(&ctx, &g, &[(t("cpu -compiler=c"), vec![NodeId(0)])]).unwrap().remove(0);
    assert_eq!(c.source, CostSource::Analytical);
    assert_eq!(c.us, CBackend.estimate_us(&g, &[NodeId(0)], &t("cpu -compiler=c")));
    assert_eq!(tune_stats(&memo), (0, 0), "an estimate is not a tune record");
}

/// How [`Faulty`] fails.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Lowering refuses the kernel, as a backend refuses an op it does not offer.
    Refuses,
    /// Lowering fails for another reason (its output fails the backend's own check).
    Breaks,
    /// The module does not compile (the generated code is wrong).
    DoesNotCompile,
    /// The compiler is missing when the module is compiled.
    NoToolchain,
}

/// The `c` backend with one fault.
struct Faulty(Fault);

impl Backend for Faulty {
    fn spec(&self) -> &'static tessera_stages::target::BackendSpec {
        CBackend.spec()
    }
    fn version(&self) -> tessera_stages::code::CodeVersion {
        CBackend.version()
    }
    fn available(&self) -> Result<(), String> {
        CBackend.available()
    }
    fn supports(&self, g: &Graph, n: NodeId, target: &Target) -> bool {
        CBackend.supports(g, n, target)
    }
    fn colors(&self) -> (&'static str, &'static str) {
        CBackend.colors()
    }
    fn estimate_us(&self, g: &Graph, nodes: &[NodeId], target: &Target) -> f64 {
        CBackend.estimate_us(g, nodes, target)
    }
    fn lower(&self, target: &Target, kernel: &Graph, symbol: &str) -> Result<LoweredKernel, BackendError> {
        match self.0 {
            Fault::Refuses => Err(BackendError::unsupported("c", format!("kernel '{symbol}' ({}): MatMul is not offered (test)", kernel.name))),
            Fault::Breaks => Err(BackendError::invalid("c", format!("kernel '{symbol}' ({}): internal error (test)", kernel.name))),
            Fault::DoesNotCompile | Fault::NoToolchain => CBackend.lower(target, kernel, symbol),
        }
    }
    fn compile_module(&self, target: &Target, kernels: &[LoweredKernel]) -> Result<Module, BackendError> {
        match self.0 {
            Fault::DoesNotCompile => Err(BackendError::compile("c", "C", kernels, "module.c:3: error: expected ';' (test)")),
            Fault::NoToolchain => Err(BackendError::toolchain("c", "a C compiler", "none on this machine (test)")),
            Fault::Refuses | Fault::Breaks => CBackend.compile_module(target, kernels),
        }
    }
}

/// One matmul candidate measured on the `c` target of a backend with `fault`.
fn measure_faulty(fault: Fault) -> anyhow::Result<tessera_stages::stages::tune::CandidateCost> {
    let (_d, store) = store();
    let backends: Vec<Box<dyn Backend>> = vec![Box::new(Faulty(fault))];
    let targets = TargetSet::parse(&["cpu -compiler=c".to_string()]).unwrap();
    let memo = Memo::new(&store);
    let ctx = Ctx::new(&memo, &targets, &backends);
    measure_candidates(&ctx, &matmul_graph(4, 4, 4), &[(t("cpu -compiler=c"), vec![NodeId(0)])]).map(|mut c| c.remove(0))
}

/// The tune stage branches on the backend's error: a refusal is an unsupported cost (the search places the
/// nodes with another backend), a lowering that breaks is reported, not hidden as a refusal.
#[test]
fn a_refused_kernel_is_unsupported_but_a_broken_lowering_is_an_error() {
    let c = measure_faulty(Fault::Refuses).unwrap();
    assert_eq!((c.source, c.us), (CostSource::Unsupported, f64::INFINITY), "{c:?}");
    assert!(c.error.as_deref().is_some_and(|e| e.starts_with("backend c: kernel '") && e.contains("MatMul is not offered (test)")), "{c:?}");
    let e = measure_faulty(Fault::Breaks).unwrap_err();
    let found = tessera_stages::stage::cause::<BackendError>(&e);
    assert!(matches!(found, Some(BackendError::Invalid { why, .. }) if why.contains("internal error (test)")), "{e:#}");
}

/// A module that does not compile is its kernels' refusal (recorded, as before); a missing compiler is no
/// kernel's fault and is reported instead.
#[test]
fn a_module_that_does_not_compile_is_refused_but_a_missing_compiler_is_an_error() {
    let c = measure_faulty(Fault::DoesNotCompile).unwrap();
    assert_eq!((c.source, c.us), (CostSource::Unsupported, f64::INFINITY), "{c:?}");
    assert!(c.error.as_deref().is_some_and(|e| e.starts_with("compile failed: backend c: C compilation failed in module of [")), "{c:?}");
    let e = measure_faulty(Fault::NoToolchain).unwrap_err();
    assert!(matches!(tessera_stages::stage::cause::<BackendError>(&e), Some(BackendError::Toolchain { tool: "a C compiler", .. })), "{e:#}");
    assert!(format!("{e:#}").contains("backend c: a C compiler is not available here: none on this machine (test)"), "{e:#}");
}

#[test]
fn bad_candidates_are_clear_errors() {
    let (_d, store) = store();
    let (backends, targets) = (all_backends(), targets());
    let memo = Memo::new(&store);
    let ctx = Ctx::new(&memo, &targets, &backends);
    let g = matmul_graph(2, 2, 2);
    let e = measure_candidates(&ctx, &g, &[(t("cpu -compiler=c"), vec![NodeId(7)])]).unwrap_err();
    assert!(format!("{e:#}").contains("node 7 is not in graph mm"), "{e:#}");
    let e = measure_candidates(&ctx, &g, &[(t("cpu -compiler=c"), vec![])]).unwrap_err();
    assert!(format!("{e:#}").contains("candidate 0") && format!("{e:#}").contains("no nodes"), "{e:#}");
}

// ---- Key ingredients: changing any one changes the key (as sccache tests its HashKeyParams). ----

fn base_params() -> TuneKeyParams {
    let g = matmul_graph(4, 4, 4);
    let sig = kernel_signature(&g, &[NodeId(0)], tessera_stages::backend::INLINE_CONST_MAX);
    TuneKeyParams::new(sig.digest, &t("cpu -compiler=c"), &CBackend, &MeasureOptions::default())
}

fn assert_changes_key(change: impl FnOnce(&mut TuneKeyParams)) {
    let base = base_params();
    assert_eq!(base.key().unwrap(), base_params().key().unwrap(), "the key is deterministic");
    let mut p = base.clone();
    change(&mut p);
    assert_ne!(p, base, "the change changed nothing");
    assert_ne!(p.key().unwrap(), base.key().unwrap());
}

#[test]
fn key_kernel_signature() {
    let other = kernel_signature(&matmul_graph(4, 4, 8), &[NodeId(0)], tessera_stages::backend::INLINE_CONST_MAX).digest;
    assert_changes_key(|p| p.kernel = other);
}

#[test]
fn key_default_only() {
    assert_changes_key(|p| p.default_only = true);
}

#[test]
fn key_target() {
    assert_changes_key(|p| p.target = t("cpu -compiler=c -opt-level=3").digest());
}

#[test]
fn key_backend_name() {
    assert_changes_key(|p| p.backend = "gemm".into());
}

#[test]
fn key_backend_version() {
    assert_changes_key(|p| p.backend_version.declared += 1);
}

/// One changed byte of the backend's source changes its code version's digest, and so the tune key.
#[test]
fn key_backend_source() {
    assert_changes_key(|p| p.backend_version = tessera_stages::code::CodeVersion::new(p.backend_version.declared, &[[9; 32]]));
}

#[test]
fn key_backend_environment() {
    assert_changes_key(|p| p.backend_env.push(("cc.version".into(), "another".into())));
}

#[test]
fn key_device_fingerprint() {
    assert_changes_key(|p| {
        let Some(tessera_stages::fingerprint::DeviceFingerprint::Cpu(fp)) = &mut p.device else { panic!("a CPU fingerprint") };
        fp.model_name.push_str(" (another machine)");
    });
    assert_changes_key(|p| p.device = None);
}

/// A GPU fingerprint as the GPU machine takes it (written out: this machine may have no GPU).
fn h100() -> tessera_stages::fingerprint::GpuFingerprint {
    tessera_stages::fingerprint::GpuFingerprint {
        name: "NVIDIA H100 80GB HBM3".into(),
        arch: "sm_90".into(),
        sm_count: 132,
        memory_bytes: 85_045_624_832,
        l2_bytes: 52_428_800,
        clock_khz: 1_980_000,
        driver_cuda: "13.0".into(),
        cublaslt_version: "130100".into(),
        cudnn_version: "91300".into(),
    }
}

/// One named change to a GPU fingerprint.
type FingerprintChange = (&'static str, fn(&mut tessera_stages::fingerprint::GpuFingerprint));

#[test]
fn key_gpu_fingerprint_each_ingredient() {
    use tessera_stages::fingerprint::{DeviceFingerprint, GpuFingerprint};
    let changes: Vec<FingerprintChange> = vec![
        ("name", |f| f.name = "NVIDIA H200".into()),
        ("arch", |f| f.arch = "sm_100".into()),
        ("sm_count", |f| f.sm_count = 114),
        ("memory_bytes", |f| f.memory_bytes /= 2),
        ("l2_bytes", |f| f.l2_bytes /= 2),
        ("clock_khz", |f| f.clock_khz -= 1000),
        ("driver_cuda", |f| f.driver_cuda = "13.1".into()),
        ("cublaslt_version", |f| f.cublaslt_version = "130200".into()),
        ("cudnn_version", |f| f.cudnn_version = "91400".into()),
    ];
    let gpu = |f: GpuFingerprint| {
        let mut p = base_params();
        p.device = Some(DeviceFingerprint::Gpu(f));
        p.key().unwrap()
    };
    assert_eq!(gpu(h100()), gpu(h100()), "deterministic");
    assert_ne!(gpu(h100()), base_params().key().unwrap(), "a GPU is not this CPU");
    for (what, change) in changes {
        let mut f = h100();
        change(&mut f);
        assert_ne!(gpu(f), gpu(h100()), "changing the GPU's {what} must change the tune key");
    }
}

#[test]
fn key_measure_options() {
    assert_changes_key(|p| p.options.budget_us *= 2);
    assert_changes_key(|p| p.options.min_runs += 1);
}

#[test]
fn key_input_seed() {
    assert_changes_key(|p| p.input_seed += 1);
}

#[test]
fn key_candidate_config_set() {
    assert_changes_key(|p| p.configs_checksum = TunableSet::from_iter(["c/v1/default", "c/v1/unrolled"]).checksum());
}

#[test]
fn key_params_are_what_the_stage_uses() {
    let p = base_params();
    assert_eq!(p.device, Some(cpu_fingerprint()));
    assert_eq!(p.backend_env, CBackend.environment(&t("cpu -compiler=c")));
    // And measure_candidates keys a candidate with exactly these parameters, target attributes included.
    let (_d, store) = store();
    let (backends, targets) = (all_backends(), targets());
    let memo = Memo::new(&store);
    let ctx = Ctx::new(&memo, &targets, &backends);
    let g = matmul_graph(4, 4, 4);
    let opts = MeasureOptions { warmup: 1, min_runs: 2, budget_us: 0, max_runs: 10 };
    let cands = vec![(t("cpu -compiler=c"), vec![NodeId(0)]), (t("cpu -compiler=c -opt-level=1"), vec![NodeId(0)])];
    let costs = measure_candidates_with(&ctx, &g, &cands, &opts).unwrap();
    let want = TuneKeyParams::new(p.kernel, &t("cpu -compiler=c"), &CBackend, &opts).key().unwrap();
    assert_eq!(costs[0].key, want);
    assert_ne!(costs[0].key, costs[1].key);
    assert_eq!(costs[0].measurement.unwrap().runs, 2);
}

/// Cold timing of every single-node candidate of bert-tiny and resnet18 on every supporting target
/// (`cargo test -p tessera --test tune -- --ignored --nocapture`): a figure for reports, not a timed test.
#[test]
#[ignore]
fn cold_single_node_candidates_of_zoo_models() {
    let (backends, targets) = (all_backends(), targets());
    for (name, seq) in [("bert-tiny", Some(16)), ("resnet18", None)] {
        let (_d, store) = store();
        let memo = Memo::new(&store);
        let ctx = Ctx::new(&memo, &targets, &backends);
        let g = model(name, seq);
        let mut cands = Vec::new();
        for n in (0..g.nodes.len() as u32).map(NodeId) {
            for target in &targets.targets {
                if ctx.backend(target).unwrap().supports(&g, n, target) {
                    cands.push((target.clone(), vec![n]));
                }
            }
        }
        let start = Instant::now();
        let costs = measure_candidates(&ctx, &g, &cands).unwrap();
        let cold = start.elapsed();
        let start = Instant::now();
        measure_candidates(&ctx, &g, &cands).unwrap();
        let warm = start.elapsed();
        let count = |s: CostSource| costs.iter().filter(|c| c.source == s).count();
        let stats = memo.stats();
        println!(
            "{name}: {} nodes, {} candidates, {} distinct keys; measured {}, unsupported {}; cold {:.2} s (lower {:.2} s, tune {:.2} s exec), warm {:.3} s",
            g.nodes.len(),
            cands.len(),
            stats["tune"].executions,
            count(CostSource::Measured),
            count(CostSource::Unsupported),
            cold.as_secs_f64(),
            stats.get("lower").map_or(0, |s| s.exec_micros) as f64 / 1e6,
            stats["tune"].exec_micros as f64 / 1e6,
            warm.as_secs_f64(),
        );
        assert!(costs.iter().all(|c| c.source != CostSource::Measured || (c.us.is_finite() && c.us > 0.0)));
    }
}
