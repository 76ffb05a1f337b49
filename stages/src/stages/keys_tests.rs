//! Key-ingredient tests of the stages and of the partition key (sccache's `HashKeyParams`
//! tests are the model): changing any one ingredient changes the key, and nothing else does.

use crate::backend::{c, Backend};
use crate::stages::compile::Compile;
use crate::context::{CostMode, Ctx};
use crate::ir::Graph;
use crate::stage::Driver;
use crate::target::{Target, TargetSet};
use tessera_store::Digest;
use crate::stages::link::{Link, LinkInput};
use crate::stages::load::{GraphSource, Load};
use crate::stages::lower::Lower;
use crate::stage::{DevicePolicy, Stage};
use crate::stages::targets::Targets;
use std::sync::OnceLock;
use crate::backend::{c::CBackend, gemm::GemmBackend};
use crate::stages::partition::{MeasuredParams, PartitionKeyParams};
use anyhow::Result;
use tessera_kernels::runtime::measure::MeasureOptions;

/// A driver that computes every call (no memo): enough to build stage values whose keys are tested.
struct Direct(tessera_store::Store);

impl Driver for Direct {
    fn store(&self) -> &tessera_store::Store {
        &self.0
    }
    fn call(&self, _: &'static str, _: Digest, _: DevicePolicy, compute: &mut dyn FnMut() -> Result<Vec<u8>>) -> Result<Digest> {
        Ok(self.0.put(&compute()?)?)
    }
}

fn target(s: &str) -> Target {
    Target::parse(s).unwrap()
}

fn d(s: &str) -> Digest {
    Digest::of(s.as_bytes())
}

/// Asserts that all keys differ from each other.
fn all_distinct(keys: &[(&str, Digest)]) {
    for (i, (a, ka)) in keys.iter().enumerate() {
        for (b, kb) in &keys[i + 1..] {
            assert_ne!(ka, kb, "changing '{a}' and changing '{b}' gave the same key");
        }
    }
}

#[test]
fn lower_key_has_every_ingredient() {
    let no_graph = || -> Result<Graph> { unreachable!("keys only") };
    let (c, llvm_o1) = (target("cpu"), target("cpu -opt-level=1"));
    let key_in = |kernel: &str, t: &Target, b: &dyn Backend, symbol: &str, config: &str| {
        Lower { kernel: d(kernel), target: t, backend: b, graph: &no_graph, symbol, config }.key().unwrap()
    };
    let key = |kernel: &str, t: &Target, b: &dyn Backend, symbol: &str| key_in(kernel, t, b, symbol, "c/v1/default");
    let base = key("k", &c, &CBackend, "f");
    all_distinct(&[
        ("base", base),
        ("kernel", key("k2", &c, &CBackend, "f")),
        ("target", key("k", &llvm_o1, &CBackend, "f")),
        // gemm differs in name and version; the version alone enters through `Stage::version`.
        ("backend", key("k", &c, &GemmBackend, "f")),
        ("config", key_in("k", &c, &CBackend, "f", "c/v1/other")),
    ]);
    // The symbol is derived from the kernel digest (and the configuration) by the plan: not an ingredient of
    // its own.
    assert_eq!(base, key("k", &c, &CBackend, "other"));
    // The backend's code version is an ingredient: the same backend with other source lowers under another key.
    let edited = SourceEdited(CBackend, crate::code::CodeVersion::new(c::VERSION, &[[7; 32]]));
    assert_ne!(base, key("k", &c, &edited, "f"));
    assert_eq!(base, key("k", &c, &SourceEdited(CBackend, CBackend.version()), "f"));
}

/// A backend whose source digests differently: the wrapped backend in all but its code version, as if one
/// byte of its generator (or its runtime) had changed.
struct SourceEdited<B>(B, crate::code::CodeVersion);

impl<B: Backend> Backend for SourceEdited<B> {
    fn spec(&self) -> &'static crate::target::BackendSpec {
        self.0.spec()
    }
    fn version(&self) -> crate::code::CodeVersion {
        self.1
    }
    fn available(&self) -> Result<(), String> {
        self.0.available()
    }
    fn supports(&self, g: &crate::ir::Graph, n: crate::ir::NodeId, target: &Target) -> bool {
        self.0.supports(g, n, target)
    }
    fn colors(&self) -> (&'static str, &'static str) {
        self.0.colors()
    }
    fn estimate_us(&self, g: &crate::ir::Graph, nodes: &[crate::ir::NodeId], target: &Target) -> f64 {
        self.0.estimate_us(g, nodes, target)
    }
    fn lower(&self, target: &Target, kernel: &crate::ir::Graph, symbol: &str) -> Result<crate::backend::LoweredKernel, crate::backend::BackendError> {
        self.0.lower(target, kernel, symbol)
    }
    fn compile_module(&self, target: &Target, kernels: &[crate::backend::LoweredKernel]) -> Result<crate::backend::Module, crate::backend::BackendError> {
        self.0.compile_module(target, kernels)
    }
}

/// Every backend's code version is its declared number with the digests of its own source units (its
/// generator, and the runtime of its module format), so a changed byte of either (which changes its unit's
/// digest: `code::tests`) changes its version.
#[test]
fn backend_versions_follow_their_source_units() {
    use crate::code::{digests, runtime_digests, CodeVersion};
    use crate::backend::{cublas, cuda, cudnn, cutlass, gemm};
    let expected = [
        ("c", CodeVersion::new(c::VERSION, &[digests::BACKEND_C, runtime_digests::RUNTIME_C])),
        ("gemm", CodeVersion::new(gemm::VERSION, &[digests::BACKEND_GEMM, runtime_digests::RUNTIME_GEMM])),
        ("cuda", CodeVersion::new(cuda::VERSION, &[digests::BACKEND_CUDA, runtime_digests::RUNTIME_CUDA])),
        ("cublas", CodeVersion::new(cublas::VERSION, &[digests::BACKEND_CUBLAS, runtime_digests::RUNTIME_CUDA])),
        ("cudnn", CodeVersion::new(cudnn::VERSION, &[digests::BACKEND_CUDNN, runtime_digests::RUNTIME_CUDA])),
        ("cutlass", CodeVersion::new(cutlass::VERSION, &[digests::BACKEND_CUTLASS, runtime_digests::RUNTIME_CUDA])),
    ];
    for b in crate::backend::registry::all() {
        let (_, v) = expected.iter().find(|(n, _)| *n == b.name()).unwrap_or_else(|| panic!("backend {} has no expectation here", b.name()));
        assert_eq!(b.version(), *v, "backend {}", b.name());
    }
    // Each stage's version is built on its own unit.
    assert_eq!(crate::stages::tune::code_version(), CodeVersion::new(crate::stages::tune::TUNE_VERSION, &[digests::TUNE, runtime_digests::RUNTIME]));
    assert_eq!(crate::stages::partition::code_version(), CodeVersion::new(crate::partition::plan::PLAN_VERSION, &[digests::PARTITION]));
    assert_eq!(crate::passes::code_version(), CodeVersion::new(crate::passes::PASSES_VERSION, &[digests::PASSES]));
}

#[test]
fn compile_key_has_every_ingredient() {
    let t = tempfile::tempdir().unwrap();
    let driver = Direct(tessera_store::Store::open(t.path(), Default::default()).unwrap());
    let (c, c_o1) = (target("cpu"), target("cpu -opt-level=1"));
    let env = |v: &str| vec![("cc".to_string(), v.to_string())];
    let key = |t: &Target, b: &dyn Backend, lowered: &[Digest], toolchain: Vec<(String, String)>| {
        Compile { target: t, backend: b, lowered, toolchain, driver: &driver }.key().unwrap()
    };
    let one = [d("a")];
    all_distinct(&[
        ("base", key(&c, &CBackend, &one, env("gcc 12"))),
        ("target", key(&c_o1, &CBackend, &one, env("gcc 12"))),
        ("backend", key(&c, &GemmBackend, &one, env("gcc 12"))),
        ("lowered kernels", key(&c, &CBackend, &[d("a"), d("b")], env("gcc 12"))),
        ("toolchain", key(&c, &CBackend, &one, env("gcc 13"))),
    ]);
}

#[test]
fn link_key_has_every_ingredient() {
    let no_input = || -> Result<LinkInput> { unreachable!("keys only") };
    let key = |plan: &str, modules: &[Digest], format_version: u32| {
        Link { plan_digest: &d(plan), modules, format_version, input: &no_input }.key().unwrap()
    };
    all_distinct(&[
        ("base", key("p", &[d("m")], 1)),
        ("plan", key("p2", &[d("m")], 1)),
        ("modules", key("p", &[d("m"), d("n")], 1)),
        ("artifact format", key("p", &[d("m")], 2)),
    ]);
}

#[test]
fn link_batches_key_has_every_ingredient() {
    let no_payloads = || -> Result<Vec<Vec<u8>>> { unreachable!("keys only") };
    let key = |plans: &[(u64, Digest)], format_version: u32| {
        crate::stages::link::LinkBatches { model: "m", plans, format_version, payloads: &no_payloads }.key().unwrap()
    };
    all_distinct(&[
        ("base", key(&[(1, d("a")), (8, d("b"))], 4)),
        ("a plan's artifact", key(&[(1, d("a")), (8, d("c"))], 4)),
        ("a batch size", key(&[(1, d("a")), (16, d("b"))], 4)),
        ("another plan", key(&[(1, d("a")), (8, d("b")), (32, d("c"))], 4)),
        ("artifact format", key(&[(1, d("a")), (8, d("b"))], 5)),
    ]);
}

#[test]
fn targets_key_has_the_target_set() {
    let a = TargetSet::parse(&["cpu".to_string()]).unwrap();
    let b = TargetSet::parse(&["cpu".to_string(), "cpu -compiler=gemm".to_string()]).unwrap();
    assert_ne!(Targets { targets: &a }.key().unwrap(), Targets { targets: &b }.key().unwrap());
}

#[test]
fn partition_key_has_every_ingredient() {
    let base = PartitionKeyParams {
        structure: d("g"),
        targets: d("t"),
        cost_mode: CostMode::Measured,
        prefer: None,
        partitioner_version: 1,
        backends: vec![("cpu".into(), "c".into(), crate::code::CodeVersion::new(1, &[[1; 32]]))],
        measured: Some(MeasuredParams {
            tune_version: crate::code::CodeVersion::new(1, &[[1; 32]]),
            devices: vec![Some(crate::device::cpu_fingerprint())],
            measure: vec![MeasureOptions::default()],
            validation: crate::stages::validate::constants(),
            tuning: crate::context::Tuning::Pruned,
            pruning: crate::stages::prune::constants(),
        }),
    };
    let with = |f: &dyn Fn(&mut PartitionKeyParams)| {
        let mut p = base.clone();
        f(&mut p);
        p.key().unwrap()
    };
    let m = |f: &dyn Fn(&mut MeasuredParams)| with(&|p| f(p.measured.as_mut().unwrap()));
    all_distinct(&[
        ("base", base.key().unwrap()),
        ("graph structure", with(&|p| p.structure = d("g2"))),
        ("targets", with(&|p| p.targets = d("t2"))),
        ("cost mode", with(&|p| {
            p.cost_mode = CostMode::Analytical;
            p.measured = None
        })),
        ("prefer", with(&|p| p.prefer = Some("gemm".into()))),
        ("partitioner version", with(&|p| p.partitioner_version = 2)),
        ("backend versions", with(&|p| p.backends[0].2.declared = 2)),
        ("backend source", with(&|p| p.backends[0].2 = crate::code::CodeVersion::new(1, &[[2; 32]]))),
        ("tune version", m(&|x| x.tune_version.declared = 2)),
        ("tune source", m(&|x| x.tune_version = crate::code::CodeVersion::new(1, &[[2; 32]]))),
        ("device fingerprint", m(&|x| x.devices = vec![None])),
        ("measurement schedule", m(&|x| x.measure[0].min_runs += 1)),
        ("validation margin", m(&|x| x.validation.margin = 0.1)),
        ("validation skip factor", m(&|x| x.validation.skip_factor = 3.0)),
        ("validation schedule", m(&|x| x.validation.block.1 += 1)),
        ("tuning policy", m(&|x| x.tuning = crate::context::Tuning::Full)),
        ("pruning slack", m(&|x| x.pruning.slack += 1.0)),
        ("pruning config slack", m(&|x| x.pruning.config_slack += 1.0)),
    ]);
    // A build from records makes the measured build's plan: the same key.
    assert_eq!(with(&|p| p.cost_mode = CostMode::Recorded.keyed()), base.key().unwrap());
}

#[test]
fn time_plans_key_has_every_ingredient() {
    use crate::stages::validate::TimePlans;
    let t = tempfile::tempdir().unwrap();
    let driver = Direct(tessera_store::Store::open(t.path(), Default::default()).unwrap());
    let targets = crate::target::TargetSet::from_targets(vec![target("cpu"), target("cpu -compiler=gemm")]).unwrap();
    let backends: Vec<Box<dyn Backend>> = vec![Box::new(CBackend), Box::new(GemmBackend)];
    let ctx = Ctx::new(&driver, &targets, &backends);
    let cpu = Some(crate::device::cpu_fingerprint());
    // The artifacts themselves are the stage's means (read for timing on a miss), not its key.
    let key = |identities: &[Digest], devices: Vec<Option<crate::fingerprint::DeviceFingerprint>>| {
        TimePlans { ctx: &ctx, artifacts: &|| Ok(Vec::new()), identities: identities.to_vec(), devices }.key().unwrap()
    };
    all_distinct(&[
        ("base", key(&[d("a"), d("b")], vec![cpu.clone(), cpu.clone()])),
        // The artifacts' timing identities are the key (another weights file, the same identities and timings).
        ("identities", key(&[d("a"), d("x")], vec![cpu.clone(), cpu.clone()])),
        // The order is the timing order (in order, then reversed): another order is another measurement.
        ("order", key(&[d("b"), d("a")], vec![cpu.clone(), cpu.clone()])),
        ("devices", key(&[d("a"), d("b")], vec![cpu.clone(), None])),
    ]);
    // The backends' code versions (their generators and their formats' runtimes) are ingredients: an edited
    // `gemm` executor re-times the plans that run on it.
    let edited: Vec<Box<dyn Backend>> = vec![Box::new(CBackend), Box::new(SourceEdited(GemmBackend, crate::code::CodeVersion::new(crate::backend::gemm::VERSION, &[[7; 32]])))];
    let edited_ctx = Ctx::new(&driver, &targets, &edited);
    let edited_key = TimePlans { ctx: &edited_ctx, artifacts: &|| Ok(Vec::new()), identities: vec![d("a"), d("b")], devices: vec![cpu.clone(), cpu.clone()] }.key().unwrap();
    assert_ne!(edited_key, key(&[d("a"), d("b")], vec![cpu.clone(), cpu.clone()]));
}

/// A graph source with a recipe, and one keyed by its document.
struct Source {
    recipe: Option<Digest>,
}

impl GraphSource for Source {
    fn name(&self) -> &str {
        "m"
    }
    fn recipe(&self, _: &dyn crate::stage::Driver) -> Result<Option<Digest>> {
        Ok(self.recipe)
    }
    fn build(&self) -> Result<Graph> {
        unreachable!("keys only")
    }
}

#[test]
fn load_key_is_the_recipe_or_the_document() {
    let t = tempfile::tempdir().unwrap();
    let store = tessera_store::Store::open(t.path(), Default::default()).unwrap();
    let key_with = |recipe: Option<&str>, document: Option<&[u8]>, passes: u8| {
        let passes_version = crate::code::CodeVersion::new(1, &[[passes; 32]]);
        let source = Source { recipe: recipe.map(d) };
        let load = Load { source: &source, store: &store, recipe: source.recipe, document: document.map(<[u8]>::to_vec), passes_version, built: OnceLock::new() };
        load.key().unwrap()
    };
    let key = |recipe: Option<&str>, document: Option<&[u8]>| key_with(recipe, document, 1);
    all_distinct(&[
        ("recipe", key(Some("r"), None)),
        ("other recipe", key(Some("r2"), None)),
        ("passes version", key_with(Some("r"), None, 2)),
        ("document", key(None, Some(b"doc"))),
        ("other document", key(None, Some(b"doc2"))),
        ("document, passes version", key_with(None, Some(b"doc"), 2)),
    ]);
    // With a recipe, the document (built only for sources without one) does not enter the key.
    assert_eq!(key(Some("r"), None), key(Some("r"), Some(b"doc")));
}

#[test]
fn precision_and_calibrate_keys_have_every_ingredient() {
    use crate::calibration::Ranges;
    use crate::stages::calibrate::Calibrate;
    use crate::context::LazyGraph;
    use crate::stages::precision::ReducePrecision;
    use crate::target::{Overflow, Precision};
    let t = tempfile::tempdir().unwrap();
    let driver = Direct(tessera_store::Store::open(t.path(), tessera_store::OpenOptions::writable()).unwrap());
    let g = LazyGraph::new(&driver, d("g"), None);
    let ranges = Ranges { runs: 1, max_abs: vec![] };
    let key = |doc: &str, precision, overflow, r: &str| {
        ReducePrecision { doc: d(doc), graph: &g, precision, overflow, ranges: Some((d(r), ranges.clone())), store: &driver.0, built: OnceLock::new() }
            .key()
            .unwrap()
    };
    all_distinct(&[
        ("base", key("g", Precision::Fp16, Overflow::KeepFp32, "r")),
        ("graph", key("g2", Precision::Fp16, Overflow::KeepFp32, "r")),
        ("precision", key("g", Precision::Fp32, Overflow::KeepFp32, "r")),
        ("overflow", key("g", Precision::Fp16, Overflow::Error, "r")),
        ("overflow bf16", key("g", Precision::Fp16, Overflow::Bf16, "r")),
        ("precision bf16", key("g", Precision::Bf16, Overflow::KeepFp32, "r")),
        ("ranges", key("g", Precision::Fp16, Overflow::KeepFp32, "r2")),
    ]);
    assert_ne!(Calibrate { doc: d("g"), graph: &g, given: None }.key().unwrap(), Calibrate { doc: d("g2"), graph: &g, given: None }.key().unwrap());
    // The user's calibration inputs enter by content.
    let inputs = |v: f32| {
        let dir = t.path().join(format!("cal-{v}"));
        std::fs::create_dir_all(&dir).unwrap();
        crate::npy::write(&dir.join("x.npy"), &crate::ir::Tensor::from_f32([2], &[v, v])).unwrap();
        crate::calibration::CalibrationInputs::read(&dir).unwrap()
    };
    let (a, b) = (inputs(0.5), inputs(0.25));
    let cal = |given| Calibrate { doc: d("g"), graph: &g, given }.key().unwrap();
    assert_ne!(cal(Some(&a)), cal(Some(&b)));
    assert_ne!(cal(Some(&a)), cal(None));
    assert_eq!(cal(Some(&a)), cal(Some(&inputs(0.5))));
}

#[test]
fn layout_key_has_every_ingredient() {
    use crate::context::LazyGraph;
    use crate::stages::layout::ChannelsLast;
    let t = tempfile::tempdir().unwrap();
    let driver = Direct(tessera_store::Store::open(t.path(), tessera_store::OpenOptions::writable()).unwrap());
    let g = LazyGraph::new(&driver, d("g"), None);
    let key = |doc: &str| ChannelsLast { doc: d(doc), graph: &g, store: &driver.0, built: OnceLock::new() }.key().unwrap();
    all_distinct(&[("base", key("g")), ("graph", key("g2"))]);
    assert_eq!(key("g"), key("g"));
}
