//! The ONNX backend test suite, run through tessera's ONNX importer and reference interpreter.
//!
//! The data is the test data shipped in the `onnx` Python package (`onnx/backend/test/data/`), located through
//! `ONNX_BACKEND_DATA` or by asking `python3 -c "import onnx"`. Kinds:
//! - `pytorch-converted`, `pytorch-operator`, `simple`: a folder per case with `model.onnx` and
//!   `test_data_set_*/input_*.pb, output_*.pb`; `data.json`, where present, overrides the tolerances;
//! - `node` (counted separately): the per-op cases. Newer wheels do not ship `data/node/`, so unless the data
//!   folder has one, `scripts/onnx-node-tests.py` writes them once (from `load_model_tests(kind="node")`, in
//!   the same layout, with each case's tolerances) under Cargo's target tmp dir, keyed by the onnx version;
//!   `ONNX_NODE_DATA` may point at such a folder instead;
//! - `light`: the nine model-zoo CNNs in `light/light_<model>.onnx`, described by `real/test_<model>/data.json`
//!   (url, rtol, atol). Their inputs are not stored: ONNX's runner (`onnx/backend/test/runner/__init__.py`,
//!   `generate_dummy_data(..., random=False)`) makes each non-initializer input as
//!   `(np.arange(n).reshape(shape) / n).astype(np.float32)`, symbolic dimensions taken as 1 and only FLOAT
//!   inputs allowed; the expected output is `light_<model>_output_0.pb`. [`light_input`] reproduces that
//!   exactly (the quotient is computed in f64 and rounded once to f32, as NumPy does).
//!
//! Every case is imported (with each input's static shape given as `--shape` would) and run by the reference
//! interpreter; outputs must match with NumPy's `assert_allclose` rule `|out - ref| <= atol + rtol * |ref|`
//! (NaN equals NaN, infinities must match), after equal shapes and dtypes, with the runner's defaults
//! rtol 1e-3 / atol 1e-7 unless the case's `data.json` says otherwise.
//!
//! A shape-like operand fed by a graph input (ReduceSum's axes, Slice's starts, Expand's shape...) cannot be
//! static; such a case runs again with its integer inputs frozen into initializers of the test's values, so the
//! importer's normalization of those operands is still checked against ONNX's reference (the report counts
//! these passes).
//!
//! A case is *unsupported* only when the importer rejects it as valid ONNX it does not support (an op, a
//! dtype, an attribute value: `ImportError::is_unsupported`); every other error or mismatch is a failure and
//! fails the test. Without data the test fails under `CI` and is skipped loudly elsewhere.
//!
//! With `ONNX_BACKEND_REPORT=FILE` the test also writes every case's outcome, and the op types the importer
//! claims, as JSON to FILE: `scripts/onnx-coverage.py` turns that into bench/onnx_coverage.md.

use prost::Message;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;
use tessera_stages::interp::run_graph;
use tessera_stages::ir::{DType, Tensor};
use tessera_stages::onnx::proto::{type_proto, ModelProto};
use tessera_stages::onnx::{import_bytes, load_tensor_file, tensor_to_proto, ImportErrorKind, ImportOptions};

const DEFAULT_RTOL: f64 = 1e-3;
const DEFAULT_ATOL: f64 = 1e-7;
/// Folders of model cases, in report order.
const MODEL_KINDS: &[&str] = &["pytorch-converted", "pytorch-operator", "simple"];

/// Where the inputs of a case come from.
enum Inputs {
    /// `test_data_set_*` folders with `input_*.pb` / `output_*.pb`.
    DataSets(Vec<PathBuf>),
    /// Generated as ONNX's runner does for `light/` models; the expected output files are listed.
    Light { outputs: Vec<PathBuf> },
}

struct Case {
    kind: String,
    name: String,
    model: PathBuf,
    inputs: Inputs,
    rtol: f64,
    atol: f64,
}

enum Outcome {
    /// `frozen`: passed with integer shape inputs frozen to their test values (see `freeze_int_inputs`).
    Passed { frozen: bool },
    Failed(String),
    Unsupported(String),
}

fn data_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("ONNX_BACKEND_DATA") {
        let d = PathBuf::from(d);
        if d.is_dir() {
            return Some(d);
        }
        eprintln!("ONNX_BACKEND_DATA={} is not a directory", d.display());
        return None;
    }
    let out = std::process::Command::new("python3")
        .args(["-c", "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), 'backend', 'test', 'data'))"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    d.is_dir().then_some(d)
}

/// rtol/atol from a case's data.json (the loader's keys), falling back to the runner's defaults.
fn tolerances(json: Option<&serde_json::Value>) -> (f64, f64) {
    let get = |k: &str, d: f64| json.and_then(|j| j.get(k)).and_then(|v| v.as_f64()).unwrap_or(d);
    (get("rtol", DEFAULT_RTOL), get("atol", DEFAULT_ATOL))
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: invalid JSON: {e}", path.display())))
}

fn sorted_dir(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// Files `prefix0.pb, prefix1.pb, ...` in a folder, in numeric order.
fn numbered(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    (0..).map(|i| dir.join(format!("{prefix}{i}.pb"))).take_while(|p| p.exists()).collect()
}

/// The folder holding `node/`: the data folder's own, `ONNX_NODE_DATA`, or one generated by
/// `scripts/onnx-node-tests.py` (once per onnx version). `None` (with a message) when none can be had.
fn node_root(data: &Path) -> Option<PathBuf> {
    if data.join("node").is_dir() {
        return Some(data.to_path_buf());
    }
    if let Some(d) = std::env::var_os("ONNX_NODE_DATA") {
        let d = PathBuf::from(d);
        assert!(d.join("node").is_dir(), "ONNX_NODE_DATA={} has no node/ folder (relative paths start at tests/)", d.display());
        return Some(d);
    }
    let version = std::process::Command::new("python3").args(["-c", "import onnx; print(onnx.__version__)"]).output().ok()?;
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("onnx-node-{version}"));
    if root.join("node").join("complete").exists() {
        return Some(root);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/onnx-node-tests.py");
    let status = std::process::Command::new("python3").arg(&script).arg(&root).status();
    match status {
        Ok(s) if s.success() && root.join("node").join("complete").exists() => Some(root),
        other => {
            eprintln!("onnx backend: could not generate the node cases with {} ({other:?})", script.display());
            None
        }
    }
}

fn collect_cases(data: &Path, node_root: Option<&Path>) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut kinds: Vec<(&str, PathBuf)> = MODEL_KINDS.iter().map(|k| (*k, data.join(k))).collect();
    if let Some(root) = node_root {
        kinds.push(("node", root.join("node")));
    }
    for (kind, folder) in kinds {
        for dir in sorted_dir(&folder) {
            let model = dir.join("model.onnx");
            if !model.exists() {
                continue;
            }
            let (rtol, atol) = tolerances(read_json(&dir.join("data.json")).as_ref());
            let sets: Vec<PathBuf> = sorted_dir(&dir)
                .into_iter()
                .filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("test_data_set")))
                .collect();
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            cases.push(Case { kind: kind.to_string(), name, model, inputs: Inputs::DataSets(sets), rtol, atol });
        }
    }
    // The light model-zoo CNNs, described by real/<case>/data.json.
    for dir in sorted_dir(&data.join("real")) {
        let Some(json) = read_json(&dir.join("data.json")) else { continue };
        let Some(url) = json.get("url").and_then(|u| u.as_str()) else { continue };
        let Some(rel) = url.strip_prefix("onnx/backend/test/data/") else { continue };
        let model = data.join(rel);
        if !model.exists() {
            continue;
        }
        let stem = model.with_extension("");
        let outputs = numbered(stem.parent().unwrap(), &format!("{}_output_", stem.file_name().unwrap().to_string_lossy()));
        let (rtol, atol) = tolerances(Some(&json));
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        cases.push(Case { kind: "light".into(), name, model, inputs: Inputs::Light { outputs }, rtol, atol });
    }
    cases
}

/// A light model's input as ONNX's runner makes it: `arange(n).reshape(shape) / n` as float32.
fn light_input(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|i| (i as f64 / n as f64) as f32).collect();
    Tensor::from_f32(shape.to_vec(), &values)
}

/// A graph input as the model declares it: name, ONNX element type, dims (None where symbolic).
type DeclaredInput = (String, i32, Vec<Option<usize>>);

/// The non-initializer graph inputs of a model.
fn graph_inputs(bytes: &[u8]) -> Result<Vec<DeclaredInput>, String> {
    let m = ModelProto::decode(bytes).map_err(|e| format!("decode: {e}"))?;
    let g = m.graph.ok_or("no graph")?;
    let inits: Vec<&str> = g.initializer.iter().filter_map(|t| t.name.as_deref()).collect();
    let mut out = Vec::new();
    for vi in &g.input {
        let name = vi.name.clone().unwrap_or_default();
        if inits.contains(&name.as_str()) {
            continue;
        }
        let (elem, dims) = match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(type_proto::Value::TensorType(tt)) => {
                use tessera_stages::onnx::proto::tensor_shape_proto::dimension::Value as D;
                let dims = tt
                    .shape
                    .as_ref()
                    .map(|s| s.dim.iter().map(|d| match d.value { Some(D::DimValue(v)) if v >= 0 => Some(v as usize), _ => None }).collect())
                    .unwrap_or_default();
                (tt.elem_type.unwrap_or(0), dims)
            }
            _ => (0, Vec::new()),
        };
        out.push((name, elem, dims));
    }
    Ok(out)
}

/// NumPy's assert_allclose on two tensors (shape and dtype first).
fn compare(i: usize, got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Result<(), String> {
    if got.shape() != want.shape() {
        return Err(format!("output {i}: shape {:?}, expected {:?}", got.shape(), want.shape()));
    }
    if got.dtype() != want.dtype() {
        return Err(format!("output {i}: dtype {}, expected {}", got.dtype(), want.dtype()));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let mut bad = 0usize;
    let mut worst: Option<(usize, f64, f64)> = None;
    for (k, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let ok = if a.is_nan() || b.is_nan() {
            a.is_nan() && b.is_nan()
        } else if a.is_infinite() || b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= atol + rtol * b.abs()
        };
        if !ok {
            bad += 1;
            let excess = (a - b).abs() - rtol * b.abs();
            if worst.is_none_or(|(_, x, _)| excess > x || excess.is_nan()) {
                worst = Some((k, excess, a));
            }
        }
    }
    match worst {
        None => Ok(()),
        Some((k, _, a)) => Err(format!(
            "output {i}: {bad} of {} elements differ beyond rtol {rtol}, atol {atol}; worst at {k}: got {a}, expected {}",
            g.len(),
            w[k]
        )),
    }
}

fn run_case(case: &Case) -> Outcome {
    let bytes = match std::fs::read(&case.model) {
        Ok(b) => b,
        Err(e) => return Outcome::Failed(format!("cannot read {}: {e}", case.model.display())),
    };
    // Let the importer report undecodable files.
    let declared = graph_inputs(&bytes).unwrap_or_default();
    // Named inputs and expected outputs per data set.
    let mut sets: Vec<(BTreeMap<String, Tensor>, Vec<Tensor>)> = Vec::new();
    // Test data that does not load (a DOUBLE tensor, or a sequence or optional value that is no tensor at
    // all) belongs to a model the importer must reject as unsupported: the model's verdict names why. If the
    // model imports, the data's own unsupported dtype decides; anything else fails the case.
    let load = |p: &Path| {
        load_tensor_file(p).map_err(|e| {
            let verdict = import_bytes(&bytes, case.model.parent(), &case.model.display().to_string(), &ImportOptions::default());
            match verdict {
                Err(ie) if ie.is_unsupported() && !matches!(ie.kind, ImportErrorKind::NotStatic(_)) => {
                    Outcome::Unsupported(ie.unsupported_key().unwrap_or_default())
                }
                _ => match e.unsupported_key() {
                    Some(key) => Outcome::Unsupported(key),
                    None => Outcome::Failed(e.to_string()),
                },
            }
        })
    };
    match &case.inputs {
        Inputs::DataSets(dirs) => {
            for dir in dirs {
                let mut named = BTreeMap::new();
                for (k, p) in numbered(dir, "input_").iter().enumerate() {
                    let Some((name, _, _)) = declared.get(k) else {
                        return Outcome::Failed(format!("{} has more inputs than the model", dir.display()));
                    };
                    match load(p) {
                        Ok(t) => named.insert(name.clone(), t),
                        Err(outcome) => return outcome,
                    };
                }
                let mut outs = Vec::new();
                for p in numbered(dir, "output_") {
                    match load(&p) {
                        Ok(t) => outs.push(t),
                        Err(outcome) => return outcome,
                    }
                }
                sets.push((named, outs));
            }
        }
        Inputs::Light { outputs } => {
            let mut named = BTreeMap::new();
            for (name, elem, dims) in &declared {
                if *elem != 1 {
                    return Outcome::Failed(format!("light input '{name}' is not FLOAT; ONNX's runner cannot generate it"));
                }
                let shape: Vec<usize> = dims.iter().map(|d| d.unwrap_or(1)).collect();
                named.insert(name.clone(), light_input(&shape));
            }
            let mut outs = Vec::new();
            for p in outputs {
                match load(p) {
                    Ok(t) => outs.push(t),
                    Err(outcome) => return outcome,
                }
            }
            sets.push((named, outs));
        }
    }
    if sets.is_empty() {
        return Outcome::Failed("no test data sets".into());
    }
    let mut frozen = false;
    for (named, expected) in &sets {
        let file = case.model.display().to_string();
        let opts = ImportOptions { shapes: named.iter().map(|(k, t)| (k.clone(), t.shape().to_vec())).collect() };
        let g = match import_bytes(&bytes, case.model.parent(), &file, &opts) {
            Ok(g) => g,
            // A shape-like operand fed by a graph input (Reshape's shape, Slice's starts, ReduceSum's axes...)
            // cannot be static. To still check the importer's handling of such operands against ONNX's
            // reference, the case runs once more with its integer inputs frozen into initializers holding the
            // test's values (what a user would do by baking them into the model).
            Err(e) if matches!(e.kind, ImportErrorKind::NotStatic(_)) => {
                let Some(frozen_model) = freeze_int_inputs(&bytes, named) else {
                    return Outcome::Unsupported(e.unsupported_key().unwrap_or_default());
                };
                frozen = true;
                match import_bytes(&frozen_model, case.model.parent(), &file, &opts_without(&opts, named)) {
                    Ok(g) => g,
                    Err(e2) if e2.is_unsupported() => return Outcome::Unsupported(e2.unsupported_key().unwrap_or_default()),
                    Err(e2) => return Outcome::Failed(format!("import with integer inputs frozen: {e2}")),
                }
            }
            Err(e) if e.is_unsupported() => return Outcome::Unsupported(e.unsupported_key().unwrap_or_default()),
            Err(e) => return Outcome::Failed(format!("import: {e}")),
        };
        let mut inputs = Vec::new();
        for &v in &g.inputs {
            let name = &g.value(v).name;
            match named.get(name) {
                Some(t) => inputs.push(t.clone()),
                None => return Outcome::Failed(format!("no data for graph input '{name}'")),
            }
        }
        let got = match run_graph(&g, &inputs) {
            Ok(o) => o,
            Err(e) => return Outcome::Failed(format!("interpreter: {e}")),
        };
        if got.len() != expected.len() {
            return Outcome::Failed(format!("{} outputs, expected {}", got.len(), expected.len()));
        }
        for (i, (a, b)) in got.iter().zip(expected).enumerate() {
            if let Err(e) = compare(i, a, b, case.rtol, case.atol) {
                return Outcome::Failed(e);
            }
        }
    }
    Outcome::Passed { frozen }
}

/// The model with every integer input that has test data turned into an initializer of that value, or
/// `None` when it has no such input.
fn freeze_int_inputs(bytes: &[u8], named: &BTreeMap<String, Tensor>) -> Option<Vec<u8>> {
    let mut m = ModelProto::decode(bytes).ok()?;
    let g = m.graph.as_mut()?;
    let mut any = false;
    for (name, t) in named {
        if matches!(t.dtype(), DType::I64 | DType::I32) && !g.initializer.iter().any(|i| i.name.as_ref() == Some(name)) {
            g.initializer.push(tensor_to_proto(name, t));
            any = true;
        }
    }
    any.then(|| m.encode_to_vec())
}

/// The `--shape` options less the inputs frozen into initializers.
fn opts_without(opts: &ImportOptions, named: &BTreeMap<String, Tensor>) -> ImportOptions {
    let frozen = |k: &String| named.get(k).is_some_and(|t| matches!(t.dtype(), DType::I64 | DType::I32));
    ImportOptions { shapes: opts.shapes.iter().filter(|(k, _)| !frozen(k)).map(|(k, v)| (k.clone(), v.clone())).collect() }
}

#[derive(Default)]
struct Tally {
    passed: usize,
    /// Of the passed, how many with integer shape inputs frozen.
    frozen: usize,
    failed: Vec<String>,
    unsupported: usize,
    unsupported_keys: BTreeMap<String, usize>,
}

#[test]
fn onnx_backend_suite() {
    let Some(data) = data_dir() else {
        let msg = "ONNX backend test data not found: set ONNX_BACKEND_DATA or `pip install onnx` (scripts/test.sh does)";
        if std::env::var_os("CI").is_some() {
            panic!("{msg}; CI must run the ONNX backend suite");
        }
        eprintln!("\n!!!!!!!! SKIPPING the ONNX backend suite: {msg} !!!!!!!!\n");
        return;
    };
    let node = node_root(&data);
    let cases = collect_cases(&data, node.as_deref());
    assert!(!cases.is_empty(), "no ONNX backend cases under {}", data.display());
    let started = Instant::now();
    let next = Mutex::new(0usize);
    let results: Mutex<Vec<(usize, Outcome, f64)>> = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, 2);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = {
                    let mut n = next.lock().unwrap();
                    let i = *n;
                    *n += 1;
                    i
                };
                let Some(case) = cases.get(i) else { break };
                let t = Instant::now();
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case(case)))
                    .unwrap_or_else(|p| {
                        let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                        Outcome::Failed(format!("panicked: {}", msg.unwrap_or_default()))
                    });
                results.lock().unwrap().push((i, outcome, t.elapsed().as_secs_f64()));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by_key(|r| r.0);
    if let Some(path) = std::env::var_os("ONNX_BACKEND_REPORT") {
        write_report(Path::new(&path), &cases, &results);
    }
    let mut per_kind: BTreeMap<&str, Tally> = BTreeMap::new();
    // The suites the issue names, and the node cases, are counted apart.
    let mut total = Tally::default();
    let mut node_total = Tally::default();
    let mut slow = Vec::new();
    for (i, outcome, secs) in results {
        let case = &cases[i];
        let label = format!("{}/{}", case.kind, case.name);
        if secs > 5.0 {
            slow.push(format!("{label} {secs:.1}s"));
        }
        let k = per_kind.entry(case.kind.as_str()).or_default();
        let t = if case.kind == "node" { &mut node_total } else { &mut total };
        match outcome {
            Outcome::Passed { frozen } => {
                k.passed += 1;
                t.passed += 1;
                k.frozen += frozen as usize;
                t.frozen += frozen as usize;
            }
            Outcome::Failed(msg) => {
                k.failed.push(label.clone());
                t.failed.push(format!("{label}: {msg}"));
            }
            Outcome::Unsupported(key) => {
                k.unsupported += 1;
                t.unsupported += 1;
                *t.unsupported_keys.entry(key).or_default() += 1;
            }
        }
    }
    // The report goes straight to stderr, which libtest does not capture, so it shows in every run.
    let mut report = String::new();
    macro_rules! report {
        ($($t:tt)*) => {{
            report.push_str(&format!($($t)*));
            report.push('\n');
        }};
    }
    for (kind, t) in &per_kind {
        report!(
            "onnx backend [{kind}]: {} passed, {} failed, {} unsupported ({} of the passed with shape inputs frozen)",
            t.passed,
            t.failed.len(),
            t.unsupported,
            t.frozen
        );
    }
    report!("onnx backend: {} passed, {} failed, {} unsupported", total.passed, total.failed.len(), total.unsupported);
    report!("onnx backend: data {}, {} cases in {:.1}s on {workers} workers", data.display(), cases.len(), started.elapsed().as_secs_f64());
    if !slow.is_empty() {
        report!("onnx backend: slow cases: {}", slow.join(", "));
    }
    if node.is_some() {
        let n = &node_total;
        report!("onnx backend node tests: {} passed, {} failed, {} unsupported", n.passed, n.failed.len(), n.unsupported);
    }
    for (what, t) in [("onnx backend", &total), ("onnx backend node tests", &node_total)] {
        if !t.unsupported_keys.is_empty() {
            let mut tally: Vec<(&String, &usize)> = t.unsupported_keys.iter().collect();
            tally.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            let tally: Vec<String> = tally.iter().map(|(k, n)| format!("{k} x{n}")).collect();
            report!("{what}: unsupported: {}", tally.join(", "));
        }
        if !t.failed.is_empty() {
            report!("{what}: failures:");
            for f in &t.failed {
                report!("  {f}");
            }
        }
    }
    {
        use std::io::Write;
        let _ = std::io::stderr().lock().write_all(report.as_bytes());
    }
    let failed = total.failed.len() + node_total.failed.len();
    assert!(failed == 0, "{failed} ONNX backend cases failed (listed above)");
    assert!(total.passed > 0, "no ONNX backend case passed");
}

/// The per-case report `ONNX_BACKEND_REPORT` asks for: `{"supported_ops": [..], "cases": [{kind, name, model,
/// outcome ("passed" | "failed" | "unsupported"), detail (the failure, or the unsupported key), frozen}]}`.
fn write_report(path: &Path, cases: &[Case], results: &[(usize, Outcome, f64)]) {
    let rows: Vec<serde_json::Value> = results
        .iter()
        .map(|(i, outcome, _)| {
            let case = &cases[*i];
            let (what, detail, frozen) = match outcome {
                Outcome::Passed { frozen } => ("passed", String::new(), *frozen),
                Outcome::Failed(m) => ("failed", m.clone(), false),
                Outcome::Unsupported(k) => ("unsupported", k.clone(), false),
            };
            serde_json::json!({
                "kind": case.kind, "name": case.name, "model": case.model.display().to_string(),
                "outcome": what, "detail": detail, "frozen": frozen,
            })
        })
        .collect();
    let report = serde_json::json!({ "supported_ops": tessera_stages::onnx::ops::supported_ops(), "cases": rows });
    std::fs::write(path, serde_json::to_string_pretty(&report).unwrap())
        .unwrap_or_else(|e| panic!("ONNX_BACKEND_REPORT={}: {e}", path.display()));
}

#[test]
fn light_inputs_match_numpy() {
    // (np.arange(6).reshape(2, 3) / 6).astype(np.float32)
    let t = light_input(&[2, 3]);
    assert_eq!(t.shape(), &[2, 3]);
    assert_eq!(t.dtype(), DType::F32);
    let want: Vec<f32> = vec![0.0, 1.0 / 6.0, 2.0 / 6.0, 0.5, 4.0 / 6.0, 5.0 / 6.0].into_iter().map(|v: f64| v as f32).collect();
    assert_eq!(t.to_f32_vec(), want);
}

#[test]
fn allclose_rule() {
    let a = Tensor::from_f32([3], &[1.0, f32::NAN, f32::INFINITY]);
    assert!(compare(0, &a, &a, 1e-3, 1e-7).is_ok());
    let b = Tensor::from_f32([3], &[1.0011, f32::NAN, f32::INFINITY]);
    assert!(compare(0, &b, &a, 1e-3, 1e-7).is_err());
    let c = Tensor::from_f32([3], &[1.0009, f32::NAN, f32::INFINITY]);
    assert!(compare(0, &c, &a, 1e-3, 1e-7).is_ok());
    let d = Tensor::from_f32([3], &[1.0, 0.0, f32::INFINITY]);
    assert!(compare(0, &d, &a, 1e-3, 1e-7).is_err());
    assert!(compare(0, &Tensor::from_f32([1, 3], &[1.0, 0.0, 0.0]), &a, 1.0, 1.0).is_err());
}
