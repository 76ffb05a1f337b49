//! A backend with a tuning space: the tune stage measures every configuration of a kernel, records each
//! measurement and the fastest, the plan carries the winner, and the compile path lowers the kernel in it.
//!
//! The backend, `reps`, is the `c` backend with two configurations of every kernel: `x16` (its default) runs
//! the generated function sixteen times per call, `x1` once. Both compute the same outputs; `x1` is the faster
//! by a wide margin, so measurement must pick the configuration that is not the default.

use tessera::build::Ctx;
use tessera::memo::Memo;
use tessera_kernels::artifact::Artifact;
use tessera_kernels::runtime::Executable;
use tessera_stages::backend::{c::CBackend, registry, Backend, BackendError, LoweredKernel, Module, TunableSet};
use tessera_stages::stages::artifact::build_artifact;
use tessera_stages::interp::{random_tensor, run_graph};
use tessera_stages::ir::{Graph, NodeId, Op, Tensor, TensorType, ValueId};
use tessera_stages::rules::Rule;
use tessera_stages::partition::plan::config_symbol;
use tessera_stages::context::CostMode;
use tessera_stages::stages::partition::partition_and_plan;
use tessera_stages::context::CostSource;
use tessera_stages::stages::tune::{measure_candidates, TuneOutcome, TuneRecord};
use tessera_stages::target::{BackendSpec, Target, TargetSet};
use tessera_store::{OpenOptions, Store};

const NAME: &str = "reps";
const SLOW: &str = "reps/v1/x16";
const FAST: &str = "reps/v1/x1";

struct Reps;

static SPEC: BackendSpec = BackendSpec { name: NAME, device: "cpu", compiler: NAME, doc: "c's lowering, measured in two configurations (a test's backend)", options: &[], order: 100 };

/// The `c` target the wrapped backend lowers and compiles for.
fn c_target() -> Target {
    Target::parse("cpu -compiler=c").unwrap()
}

impl Backend for Reps {
    fn spec(&self) -> &'static BackendSpec {
        &SPEC
    }
    fn version(&self) -> tessera_stages::code::CodeVersion {
        // A backend built outside tessera digests its own source the same way (here: this file).
        tessera_stages::code::CodeVersion::new(1, &[*blake3::hash(include_bytes!("tune_configs.rs").as_slice()).as_bytes()])
    }
    fn available(&self) -> Result<(), String> {
        CBackend.available()
    }
    fn supports(&self, g: &Graph, n: NodeId, _target: &Target) -> bool {
        matches!(g.nodes[n.index()].op, Op::MatMul)
    }
    fn rules(&self) -> Rule {
        CBackend.rules()
    }
    fn configs(&self, _target: &Target) -> TunableSet {
        [SLOW, FAST].into_iter().collect()
    }
    fn default_config(&self, _target: &Target) -> String {
        SLOW.to_string()
    }
    fn configs_for(&self, _target: &Target, _kernel: &Graph) -> Vec<String> {
        vec![SLOW.to_string(), FAST.to_string()]
    }
    fn colors(&self) -> (&'static str, &'static str) {
        ("#eee", "#333")
    }
    fn estimate_us(&self, g: &Graph, nodes: &[NodeId], _target: &Target) -> f64 {
        CBackend.estimate_us(g, nodes, &c_target())
    }
    fn lower(&self, target: &Target, kernel: &Graph, symbol: &str) -> Result<LoweredKernel, BackendError> {
        self.lower_config(target, kernel, symbol, SLOW)
    }
    fn lower_config(&self, _target: &Target, kernel: &Graph, symbol: &str, config: &str) -> Result<LoweredKernel, BackendError> {
        match config {
            FAST => CBackend.lower(&c_target(), kernel, symbol),
            SLOW => {
                let once = format!("{symbol}_once");
                let mut lk = CBackend.lower(&c_target(), kernel, &once)?;
                let mut code = String::from_utf8(lk.code).expect("C source");
                code.push_str(&format!("void {symbol}(void* const* args) {{\n    for (int r = 0; r < 16; r++) {once}(args);\n}}\n"));
                lk.code = code.into_bytes();
                lk.info.symbol = symbol.to_string();
                Ok(lk)
            }
            other => Err(BackendError::unsupported(NAME, format!("no configuration '{other}'"))),
        }
    }
    fn compile_module(&self, _target: &Target, kernels: &[LoweredKernel]) -> Result<Module, BackendError> {
        CBackend.compile_module(&c_target(), kernels)
    }
}

fn setup() -> (Vec<Box<dyn Backend>>, TargetSet) {
    // Registering twice (tests of one process) is allowed for the same backend.
    registry::register(&SPEC, || Box::new(Reps)).unwrap();
    let backends = registry::all();
    let targets = TargetSet::parse(&[format!("cpu -compiler={NAME}")]).unwrap();
    (backends, targets)
}

fn matmul_graph(m: usize, k: usize, n: usize) -> Graph {
    let mut g = Graph::new("mm");
    let a = g.add_input("a", TensorType::f32([m, k]));
    let w: Vec<f32> = (0..k * n).map(|i| ((i % 7) as f32 - 3.0) * 0.25).collect();
    let w = g.add_const("w", Tensor::from_f32([k, n], &w));
    let y = g.add("mm", Op::MatMul, &[a, w]).unwrap();
    g.outputs.push(y);
    g
}

#[test]
fn every_configuration_is_measured_and_the_fastest_wins() {
    let (backends, targets) = setup();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), OpenOptions::writable()).unwrap();
    let memo = Memo::new(&store);
    let ctx = Ctx::new(&memo, &targets, &backends);
    let g = matmul_graph(64, 64, 64);
    let target = Target::parse(&format!("cpu -compiler={NAME}")).unwrap();
    let cost = measure_candidates(&ctx, &g, &[(target.clone(), vec![NodeId(0)])]).unwrap().remove(0);
    assert_eq!(cost.source, CostSource::Measured, "{cost:?}");
    assert_eq!(cost.config, FAST, "the sixteen-fold configuration won: {cost:?}");

    // The record holds both measurements, the winner's the faster.
    let entry = store.memo_lookup("tune", &cost.key).unwrap().expect("a tune record");
    let record: TuneRecord = postcard::from_bytes(&store.get(&entry.output).unwrap()).unwrap();
    let TuneOutcome::Measured { best, measurements } = record.outcome else { panic!("measured: {:?}", record.outcome) };
    assert_eq!(best, FAST);
    let names: Vec<&str> = measurements.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(names, [SLOW, FAST]);
    let us = |c: &str| measurements.iter().find(|(n, _)| n == c).unwrap().1.median_us;
    assert!(us(SLOW) > 4.0 * us(FAST), "x16 {} us, x1 {} us", us(SLOW), us(FAST));
    assert_eq!(cost.us, us(FAST));

    // Measured once: a second call is served from the record.
    let again = measure_candidates(&ctx, &g, &[(target, vec![NodeId(0)])]).unwrap().remove(0);
    assert_eq!(again, cost);
    assert_eq!(memo.stats().get("tune").map(|s| (s.executions, s.hits)), Some((1, 1)));
}

#[test]
fn the_plan_carries_the_winner_and_the_artifact_runs_it() {
    let (backends, targets) = setup();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), OpenOptions::writable()).unwrap();
    let memo = Memo::new(&store);
    let ctx = Ctx::new(&memo, &targets, &backends).with_costs(CostMode::Measured).with_prefer(Some(NAME.to_string()));
    let g = matmul_graph(48, 64, 32);
    let plan = partition_and_plan(&ctx, &g).unwrap();
    let [p] = &plan.partitions[..] else { panic!("one partition: {:?}", plan.partitions) };
    assert_eq!(p.target.backend_name(), NAME);
    assert_eq!(p.config.as_deref(), Some(FAST));
    assert_eq!(p.symbol, config_symbol(&p.kernel, FAST));

    for v in (0..g.values.len() as u32).map(ValueId) {
        if let Some(t) = g.constant(v) {
            store.put(t.bytes()).unwrap();
        }
    }
    let plan_digest = store.put(&postcard::to_stdvec(&plan).unwrap()).unwrap();
    let lowered = |memo: &Memo| memo.stats().get("lower").copied().unwrap_or_default();
    let before = lowered(&memo);
    let built = build_artifact(&ctx, &plan_digest, &plan, &|| Ok(&g), None).unwrap();
    // The kernel was lowered in the winning configuration while it was tuned: the build lowers nothing anew.
    let after = lowered(&memo);
    assert_eq!(after.executions, before.executions, "the build lowered again: {before:?} -> {after:?}");
    assert_eq!(after.hits, before.hits + 1, "{before:?} -> {after:?}");
    let artifact = Artifact::read_owned(store.get(&built.artifact).unwrap(), "reps.tsr").unwrap();
    let mut exe = Executable::load(&artifact).unwrap();
    let inputs: Vec<Tensor> = g.inputs.iter().enumerate().map(|(i, &v)| random_tensor(g.ty(v), 5, i as u64, 1)).collect();
    let got = exe.run(&inputs).unwrap();
    let want = run_graph(&g, &inputs).unwrap();
    let (got, want) = (got[0].to_f32_vec(), want[0].to_f32_vec());
    assert!(got.iter().all(|v| v.is_finite()), "non-finite outputs");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
    assert!(err < 1e-5, "relative error {err:e}");
}

/// Pruned tuning (the default) ranks candidates by their default configuration and tunes the plan's in
/// every configuration: the kernel gets a default-only record (the default alone) and a full one (both),
/// and the plan runs the faster. Full tuning measures every configuration at once: one record.
#[test]
fn pruned_tuning_ranks_by_the_default_then_tunes_the_plans_kernel() {
    use tessera_kernels::runtime::measure::MeasureOptions;
    use tessera_stages::context::Tuning;
    use tessera_stages::partition::plan::kernel_signature;
    use tessera_stages::stages::tune::{ConfigScope, TuneKeyParams};
    let (backends, targets) = setup();
    let g = matmul_graph(48, 64, 32);
    let target = Target::parse(&format!("cpu -compiler={NAME}")).unwrap();
    let kernel = kernel_signature(&g, &[NodeId(0)], Reps.inline_const_max()).digest;
    let opts = MeasureOptions::for_device("cpu");
    let measured = |store: &Store, scope: ConfigScope| -> Option<Vec<String>> {
        let key = TuneKeyParams::new(kernel, &target, &Reps, &opts).scoped(scope, &Reps, &target).key().unwrap();
        let entry = store.memo_lookup("tune", &key).unwrap()?;
        let record: TuneRecord = postcard::from_bytes(&store.get(&entry.output).unwrap()).unwrap();
        let TuneOutcome::Measured { measurements, .. } = record.outcome else { panic!("measured: {:?}", record.outcome) };
        Some(measurements.into_iter().map(|(c, _)| c).collect())
    };
    for tuning in [Tuning::Pruned, Tuning::Full] {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), OpenOptions::writable()).unwrap();
        let memo = Memo::new(&store);
        // The backend preferred, as in the test above: validation would time its plan against the fallback
        // `c` alone, which runs the same code as `x1` (a coin toss between equals).
        let ctx = Ctx::new(&memo, &targets, &backends).with_costs(CostMode::Measured).with_tuning(tuning).with_prefer(Some(NAME.to_string()));
        let plan = partition_and_plan(&ctx, &g).unwrap();
        let [p] = &plan.partitions[..] else { panic!("one partition: {:?}", plan.partitions) };
        assert_eq!(p.config.as_deref(), Some(FAST), "{tuning:?}");
        let (default_only, all) = (measured(&store, ConfigScope::DefaultOnly), measured(&store, ConfigScope::All));
        assert_eq!(all, Some(vec![SLOW.to_string(), FAST.to_string()]), "{tuning:?}");
        match tuning {
            Tuning::Pruned => assert_eq!(default_only, Some(vec![SLOW.to_string()])),
            Tuning::Full => assert_eq!(default_only, None),
        }
    }
}
