//! A backend written entirely in this file, plugged in only through the public registries: the proof that a
//! backend is one unit.
//!
//! `toy` runs same-shape f32 `Add` and `Relu` chains. Its compile side implements [`Backend`] (support,
//! Collage rules, estimate, configs, colours, lowering to a tiny register plan it serializes, module compile
//! into a [`ModuleFormat::named`] module); its run side implements the runtime's [`ModuleLoader`]. It is
//! described by one [`BackendSpec`] and registered with one call (`registry::register`); `cpu -compiler=toy` selects it, competes with `c` and `gemm` in the Collage search
//! on analytical costs, wins the elementwise head of `Add -> Relu -> MatMul -> Softmax`, and the artifact runs
//! through a runtime [`Registry`] holding its loader and matches the reference interpreter.

mod common {
    pub mod onnx;
}

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};
use tessera::build::Ctx;
use tessera_stages::stages::artifact::build_artifact;
use tessera::memo::Memo;
use tessera_stages::context::CostMode;
use tessera_stages::stages::partition::partition_and_plan;
use tessera_kernels::artifact::Artifact;
use tessera_kernels::runtime::{Executable, LoadedModule, ModuleLoader, Registry, RuntimeError};
use tessera_stages::backend::{registry, Backend, BackendError, FunctionInfo, LoweredKernel, Module, ModuleFormat};
use tessera_stages::interp::{random_tensor, run_graph};
use tessera_stages::ir::{BinaryOp, DType, Graph, NodeId, Op, Tensor, TensorType, UnaryOp, ValueId};
use tessera_stages::rules::{Combiner, Kinds, Rule};
use tessera_stages::target::{BackendSpec, Target, TargetSet};
use tessera_store::{OpenOptions, Store};

const NAME: &str = "toy";
const FORMAT: &str = "toy-plan";
/// Most registers a toy function uses (inputs plus one per op): a call allocates nothing.
const MAX_REGS: usize = 32;

// ---- the plan: what the compile side writes and the run side executes ----

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
enum ToyOp {
    /// regs[out] = regs[a] + regs[b]
    Add(u32, u32),
    /// regs[out] = max(regs[a], 0)
    Relu(u32),
}

/// One function: registers 0..inputs hold the inputs' elements, op `i` writes register `inputs + i`, and
/// `outputs` lists the registers stored to each output; every buffer has `len` elements.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct ToyFunction {
    inputs: u32,
    len: u64,
    ops: Vec<ToyOp>,
    outputs: Vec<u32>,
}

// ---- compile side ----

struct ToyBackend;

/// The toy's description: what targets see of it.
static SPEC: BackendSpec = BackendSpec {
    name: NAME,
    device: "cpu",
    compiler: "toy",
    doc: "same-shape f32 Add and Relu chains, run by a register plan (a test's backend)",
    options: &[],
    order: 100,
};

/// The one registration line of the compile side.
fn register_toy() {
    registry::register(&SPEC, || Box::new(ToyBackend)).unwrap();
}

/// What it cannot run (the tune stage costs such a kernel as unsupported).
fn unsupported(why: String) -> BackendError {
    BackendError::unsupported(NAME, why)
}

/// What it should never have been given.
fn invalid(why: String) -> BackendError {
    BackendError::invalid(NAME, why)
}

impl Backend for ToyBackend {
    fn spec(&self) -> &'static BackendSpec {
        &SPEC
    }
    fn version(&self) -> tessera_stages::code::CodeVersion {
        // A backend built outside tessera digests its own source the same way (here: this file).
        tessera_stages::code::CodeVersion::new(1, &[*blake3::hash(include_bytes!("toy_backend.rs").as_slice()).as_bytes()])
    }
    fn available(&self) -> Result<(), String> {
        Ok(())
    }
    fn supports(&self, g: &Graph, n: NodeId, _target: &Target) -> bool {
        let node = g.node(n);
        let out = g.ty(node.outputs[0]);
        matches!(node.op, Op::Binary(BinaryOp::Add) | Op::Unary(UnaryOp::Relu))
            && out.dtype == DType::F32
            && node.inputs.iter().all(|&v| g.ty(v) == out && g.constant(v).is_none())
    }
    /// Elementwise chains, grown one node at a time.
    fn rules(&self) -> Rule {
        let base = || Box::new(Rule::Primitive { kinds: Kinds::ELEMENTWISE });
        Rule::OnlyValid(Box::new(Rule::Union(vec![
            Rule::Primitive { kinds: Kinds::ELEMENTWISE },
            Rule::Combine { base: base(), combiners: vec![Combiner::ByKind { upstream: Kinds::ELEMENTWISE, downstream: Kinds::ELEMENTWISE }] },
        ])))
    }
    fn colors(&self) -> (&'static str, &'static str) {
        ("#e5f5e0", "#238b45")
    }
    /// A nanosecond per element: cheaper than a C call, so the toy wins what it can run.
    fn estimate_us(&self, g: &Graph, nodes: &[NodeId], _target: &Target) -> f64 {
        nodes.iter().map(|&n| g.ty(g.node(n).outputs[0]).numel() as f64 * 1e-3).sum()
    }
    fn lower(&self, target: &Target, kernel: &Graph, symbol: &str) -> Result<LoweredKernel, BackendError> {
        if target.backend_name() != NAME {
            return Err(invalid(format!("target '{target}' does not select backend {NAME}")));
        }
        let mut reg: Vec<Option<u32>> = vec![None; kernel.values.len()];
        for (i, &v) in kernel.inputs.iter().enumerate() {
            reg[v.index()] = Some(i as u32);
        }
        let r = |v: ValueId, reg: &[Option<u32>]| {
            reg[v.index()].ok_or_else(|| invalid(format!("kernel '{symbol}': value '{}' is neither an input nor computed", kernel.values[v.index()].name)))
        };
        let mut ops = Vec::new();
        for (i, node) in kernel.nodes.iter().enumerate() {
            let op = match node.op {
                Op::Binary(BinaryOp::Add) => ToyOp::Add(r(node.inputs[0], &reg)?, r(node.inputs[1], &reg)?),
                Op::Unary(UnaryOp::Relu) => ToyOp::Relu(r(node.inputs[0], &reg)?),
                ref other => return Err(unsupported(format!("kernel '{symbol}': op {} is not Add or Relu", other.name()))),
            };
            ops.push(op);
            reg[node.outputs[0].index()] = Some((kernel.inputs.len() + i) as u32);
        }
        if kernel.inputs.len() + ops.len() > MAX_REGS {
            return Err(unsupported(format!("kernel '{symbol}': {} registers, at most {MAX_REGS}", kernel.inputs.len() + ops.len())));
        }
        let outputs = kernel.outputs.iter().map(|&v| r(v, &reg)).collect::<Result<Vec<_>, _>>()?;
        let ty = |v: ValueId| kernel.ty(v).clone();
        let info = FunctionInfo {
            symbol: symbol.to_string(),
            inputs: kernel.inputs.iter().map(|&v| ty(v)).collect(),
            outputs: kernel.outputs.iter().map(|&v| ty(v)).collect(),
            scratch_bytes: 0,
        };
        let len = info.outputs[0].numel() as u64;
        let f = ToyFunction { inputs: kernel.inputs.len() as u32, len, ops, outputs };
        Ok(LoweredKernel { info, code: postcard::to_stdvec(&f).expect("plan encodes") })
    }
    fn compile_module(&self, target: &Target, kernels: &[LoweredKernel]) -> Result<Module, BackendError> {
        let functions: Vec<ToyFunction> = kernels
            .iter()
            .map(|k| postcard::from_bytes(&k.code).map_err(|e| invalid(format!("kernel '{}': {e}", k.info.symbol))))
            .collect::<Result<_, _>>()?;
        Ok(Module {
            backend: NAME.into(),
            target: target.canonical(),
            format: ModuleFormat::named(FORMAT),
            functions: kernels.iter().map(|k| k.info.clone()).collect(),
            bytes: postcard::to_stdvec(&functions).expect("plans encode"),
        })
    }
}

// ---- run side ----

/// Function calls the toy runtime served (all tests of this file; only ever compared as "more than before").
static CALLS: AtomicUsize = AtomicUsize::new(0);

struct ToyModule {
    functions: Vec<ToyFunction>,
}

struct ToyLoader;

impl ModuleLoader for ToyLoader {
    fn load(&self, m: &Module) -> Result<Box<dyn LoadedModule>, RuntimeError> {
        let fail = |msg: String| RuntimeError(format!("module of backend {}: {msg}", m.backend));
        let functions: Vec<ToyFunction> = postcard::from_bytes(&m.bytes).map_err(|e| fail(format!("corrupt toy plan: {e}")))?;
        if functions.len() != m.functions.len() {
            return Err(fail(format!("{} plans for {} functions", functions.len(), m.functions.len())));
        }
        for (f, info) in functions.iter().zip(&m.functions) {
            let regs = f.inputs as usize + f.ops.len();
            let same = info.inputs.iter().chain(&info.outputs).all(|t| t.dtype == DType::F32 && t.numel() as u64 == f.len);
            let in_range = |r: u32, before: usize| (r as usize) < before;
            let ops_ok = f.ops.iter().enumerate().all(|(i, op)| {
                let before = f.inputs as usize + i;
                match *op {
                    ToyOp::Add(a, b) => in_range(a, before) && in_range(b, before),
                    ToyOp::Relu(a) => in_range(a, before),
                }
            });
            if !same
                || regs > MAX_REGS
                || info.inputs.len() != f.inputs as usize
                || info.outputs.len() != f.outputs.len()
                || info.scratch_bytes != 0
                || !ops_ok
                || !f.outputs.iter().all(|&r| in_range(r, regs))
            {
                return Err(fail(format!("function '{}': the plan does not match its signature", info.symbol)));
            }
        }
        Ok(Box::new(ToyModule { functions }))
    }
}

impl LoadedModule for ToyModule {
    unsafe fn call(&self, index: usize, args: &[*mut u8]) -> Result<(), RuntimeError> {
        let f = self.functions.get(index).ok_or_else(|| RuntimeError(format!("module of backend {NAME}: no function {index}")))?;
        let n_in = f.inputs as usize;
        if args.len() != n_in + f.outputs.len() || args.iter().any(|p| p.is_null()) {
            return Err(RuntimeError(format!("module of backend {NAME}: function {index} takes {} non-null arguments", n_in + f.outputs.len())));
        }
        CALLS.fetch_add(1, Ordering::Relaxed);
        let mut regs = [0f32; MAX_REGS];
        for e in 0..f.len as usize {
            for (i, &p) in args[..n_in].iter().enumerate() {
                // SAFETY: the caller passes buffers of the signature's types: `len` f32 elements each (checked at load).
                regs[i] = unsafe { *(p as *const f32).add(e) };
            }
            for (i, op) in f.ops.iter().enumerate() {
                regs[n_in + i] = match *op {
                    ToyOp::Add(a, b) => regs[a as usize] + regs[b as usize],
                    ToyOp::Relu(a) => regs[a as usize].max(0.0),
                };
            }
            for (o, &r) in f.outputs.iter().enumerate() {
                // SAFETY: as above; outputs do not alias inputs.
                unsafe { *(args[n_in + o] as *mut f32).add(e) = regs[r as usize] };
            }
        }
        Ok(())
    }
}

// ---- the test ----

/// y = Softmax(Relu(x + r) @ W): the toy can run the head, gemm the MatMul, only c the Softmax.
fn model() -> Graph {
    let (m, k, n) = (32, 64, 48);
    let mut g = Graph::new("toy-mix");
    let x = g.add_input("x", TensorType::f32([m, k]));
    let r = g.add_input("r", TensorType::f32([m, k]));
    let w = random_tensor(&TensorType::f32([k, n]), 7, 0, 1);
    let w = g.add_const("w", w);
    let s = g.add("sum", Op::Binary(BinaryOp::Add), &[x, r]).unwrap();
    let a = g.add("relu", Op::Unary(UnaryOp::Relu), &[s]).unwrap();
    let p = g.add("proj", Op::MatMul, &[a, w]).unwrap();
    let y = g.add("softmax", Op::Softmax { axis: 1 }, &[p]).unwrap();
    g.outputs.push(y);
    g
}

fn rel_err(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.ty, want.ty);
    let (g, w) = (got.to_f32_vec(), want.to_f32_vec());
    let scale = w.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    let diff = g.iter().zip(&w).fold(0f64, |m, (a, b)| if a.is_nan() { f64::INFINITY } else { m.max((a - b).abs() as f64) });
    diff / scale.max(f64::MIN_POSITIVE)
}

#[test]
fn a_backend_from_outside_the_crates_compiles_and_runs_its_partitions() {
    register_toy();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), OpenOptions::writable()).unwrap();
    let memo = Memo::new(&store);
    let backends = registry::all();
    assert!(backends.iter().any(|b| b.name() == NAME), "registered backends are part of every build");
    let targets = TargetSet::parse(&["cpu -compiler=toy".to_string(), "cpu -compiler=gemm".to_string()]).unwrap();
    assert!(targets.targets.iter().any(|t| t.backend_name() == "c"), "the fallback is added");
    let ctx = Ctx::new(&memo, &targets, &backends).with_costs(CostMode::Analytical);

    let g = model();
    let plan = partition_and_plan(&ctx, &g).unwrap();
    let won = |b: &str| plan.partitions.iter().filter(|p| p.target.backend_name() == b).count();
    assert!(won(NAME) >= 1, "the toy backend won no partition: {:?}", plan.partitions.iter().map(|p| p.target.backend_name()).collect::<Vec<_>>());
    assert!(won("gemm") >= 1 && won("c") >= 1, "gemm takes the MatMul, c the Softmax");

    // The stages after partition, as `compile` runs them: constants and the plan in the store, then lower,
    // compile and link.
    for v in (0..g.values.len() as u32).map(ValueId) {
        if let Some(t) = g.constant(v) {
            store.put(t.bytes()).unwrap();
        }
    }
    let plan_digest = store.put(&postcard::to_stdvec(&plan).unwrap()).unwrap();
    let built = build_artifact(&ctx, &plan_digest, &plan, &|| Ok(&g), None).unwrap();
    let artifact = Artifact::read_owned(store.get(&built.artifact).unwrap(), "toy-mix.tsr").unwrap();
    let formats: Vec<&ModuleFormat> = artifact.body.modules.iter().map(|m| &m.format).collect();
    assert!(formats.contains(&&ModuleFormat::named(FORMAT)), "{formats:?}");

    // The built-in runtime cannot load it, and says which backend's module it cannot load.
    let e = Executable::load(&artifact).err().expect("no toy loader built in");
    assert!(e.0.contains("backend toy") && e.0.contains(FORMAT), "{e}");

    let runtime = Registry::builtin().clone().with(ModuleFormat::named(FORMAT), ToyLoader).unwrap();
    let mut exe = Executable::load_with(&artifact, &runtime).unwrap();
    let inputs: Vec<Tensor> = g.inputs.iter().enumerate().map(|(i, &v)| random_tensor(g.ty(v), 11, i as u64, 1)).collect();
    let before = CALLS.load(Ordering::Relaxed);
    let got = exe.run(&inputs).unwrap();
    assert!(CALLS.load(Ordering::Relaxed) > before, "the run never called the toy runtime");
    assert!(exe.steps().iter().any(|(b, _)| b == NAME));
    let want = run_graph(&g, &inputs).unwrap();
    assert_eq!(got.len(), want.len());
    for (got, want) in got.iter().zip(&want) {
        let e = rel_err(got, want);
        assert!(e < 1e-4, "relative error {e:e}");
    }
}

/// With measured costs, the tune stage loads the toy's modules through the runtime registry the context
/// carries: its candidates are measured, not refused.
#[test]
fn the_tune_stage_measures_a_backend_from_outside_through_the_context_registry() {
    register_toy();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), OpenOptions::writable()).unwrap();
    let memo = Memo::new(&store);
    let backends = registry::all();
    assert!(backends.iter().any(|b| b.name() == NAME), "registered backends are part of every build");
    let targets = TargetSet::parse(&["cpu -compiler=toy".to_string()]).unwrap();
    let toy = targets.targets.iter().find(|t| t.backend_name() == NAME).unwrap().clone();
    let runtime = Registry::builtin().clone().with(ModuleFormat::named(FORMAT), ToyLoader).unwrap();
    let ctx = Ctx::new(&memo, &targets, &backends).with_runtime(&runtime);
    let g = model();
    let toy_nodes: Vec<NodeId> = (0..g.nodes.len() as u32).map(NodeId).filter(|&n| ToyBackend.supports(&g, n, &toy)).collect();
    assert!(!toy_nodes.is_empty());
    let costs = tessera_stages::stages::tune::measure_candidates(&ctx, &g, &[(toy, vec![toy_nodes[0]])]).unwrap();
    assert_eq!(costs[0].source, tessera_stages::context::CostSource::Measured, "{:?}", costs[0]);
    assert!(costs[0].us.is_finite() && costs[0].us > 0.0, "{:?}", costs[0]);
}

#[test]
fn the_toy_compiler_value_is_the_registered_one() {
    assert!(Target::parse("cpu -compiler=toy2").is_err(), "an unregistered value is refused");
    register_toy();
    let t = Target::parse("cpu -compiler=toy").unwrap();
    assert_eq!(t.backend_name(), NAME);
    assert_eq!(Target::parse(r#"{"kind": "cpu", "compiler": "toy"}"#).unwrap(), t);
    assert_eq!(ToyBackend.configs(&t).names().collect::<Vec<_>>(), ["toy/v1/default"]);
    // Registering it again is a no-op; the same value for another backend, or a value the kind has, is
    // refused, naming both backends.
    register_toy();
    static OTHER: BackendSpec = BackendSpec { name: "other", device: "cpu", compiler: "toy", doc: "", options: &[], order: 101 };
    let e = tessera_stages::target::register_spec(&OTHER).unwrap_err();
    assert!(e.contains("toy") && e.contains("other"), "{e}");
    static TAKEN: BackendSpec = BackendSpec { name: "toy3", device: "cpu", compiler: "gemm", doc: "", options: &[], order: 101 };
    let e = tessera_stages::target::register_spec(&TAKEN).unwrap_err();
    assert!(e.contains("gemm") && e.contains("toy3"), "{e}");
    // A constructor must make the backend its description describes.
    let e = registry::register(&OTHER, || Box::new(ToyBackend)).unwrap_err();
    assert!(e.contains("other"), "{e}");
}

/// `x + r -> Relu -> MatMul(w) -> Softmax` as an ONNX file (the toy's elementwise head, then work for `c`).
fn write_onnx(path: &std::path::Path) {
    use common::onnx::{f32_initializer, f32_value, node, write};
    let w: Vec<f32> = (0..64 * 48).map(|i| ((i * 37 % 101) as f32 - 50.0) / 100.0).collect();
    write(
        path,
        vec![node("Add", "sum", &["x", "r"], "sum"), node("Relu", "relu", &["sum"], "relu"), node("MatMul", "proj", &["relu", "w"], "proj"), node("Softmax", "y", &["proj"], "y")],
        vec![f32_value("x", &[32, 64]), f32_value("r", &[32, 64])],
        vec![f32_value("y", &[32, 48])],
        vec![f32_initializer("w", &[64, 48], w)],
    );
}

/// Registered once, the toy is a backend of every build through the library's compile entry point, the one
/// the `tessera compile` command and Python's `tessera.compile` use: a target names it by its `-compiler`
/// value, the request compiles an ONNX model with it, and it wins the elementwise head.
#[test]
fn a_registered_backend_compiles_through_the_library_entry_point() {
    register_toy();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("toy-head.onnx");
    write_onnx(&model);
    let mut request = tessera::request::CompileRequest::new(vec![model.display().to_string()], dir.path().join("out"));
    request.targets = vec!["cpu -compiler=toy".to_string(), "cpu -compiler=gemm".to_string()];
    request.costs = CostMode::Analytical;
    request.store.dir = Some(dir.path().join("store"));
    let summary = request.compile().unwrap();
    assert!(summary.failed.is_empty(), "{:?}", summary.failed);
    assert!(summary.targets.iter().any(|t| t == "cpu -compiler=toy"), "{:?}", summary.targets);
    let by_backend = &summary.artifacts[0].partitions_by_backend;
    assert!(by_backend.get(NAME).is_some_and(|n| *n > 0), "the toy won no partition: {by_backend:?}");
    let artifact = Artifact::read_owned(std::fs::read(dir.path().join("out/toy-head.tsr")).unwrap(), "toy-head.tsr").unwrap();
    assert!(artifact.body.modules.iter().any(|m| m.format == ModuleFormat::named(FORMAT)));

    // Measured costs: the request carries the toy's loader, so its candidates are measured, not refused.
    request.costs = CostMode::Measured;
    request.runtime = Registry::builtin().clone().with(ModuleFormat::named(FORMAT), ToyLoader).unwrap();
    request.store.dir = Some(dir.path().join("store-measured"));
    request.out = dir.path().join("out-measured");
    let before = CALLS.load(Ordering::Relaxed);
    let summary = request.compile().unwrap();
    assert!(summary.failed.is_empty(), "{:?}", summary.failed);
    assert_eq!(summary.cost_source, "measured");
    assert!(CALLS.load(Ordering::Relaxed) > before, "the toy's kernels were never measured");
}
