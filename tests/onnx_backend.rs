//! The ONNX backend test suite, run through tessera's ONNX importer and reference interpreter.
//!
//! The data is the test data shipped in the `onnx` Python package (`onnx/backend/test/data/`), located through
//! `ONNX_BACKEND_DATA` or by asking `python3 -c "import onnx"`. Kinds:
//! - `pytorch-converted`, `pytorch-operator`, `simple` (and `node` when the folder exists): a folder per case
//!   with `model.onnx` and `test_data_set_*/input_*.pb, output_*.pb`; `data.json`, where present, overrides
//!   the tolerances;
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
//! A case is *unsupported* only when the importer rejects it as valid ONNX it does not support (an op, a
//! dtype, an attribute value: `ImportError::is_unsupported`); every other error or mismatch is a failure and
//! fails the test. Without data the test fails under `CI` and is skipped loudly elsewhere.

use prost::Message;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;
use tessera_stages::interp::run_graph;
use tessera_stages::ir::{DType, Tensor};
use tessera_stages::onnx::proto::{type_proto, ModelProto};
use tessera_stages::onnx::{import_bytes, load_tensor_file, ImportOptions};

const DEFAULT_RTOL: f64 = 1e-3;
const DEFAULT_ATOL: f64 = 1e-7;
/// Folders of model cases, in report order; `node` is optional (newer onnx wheels do not ship it).
const MODEL_KINDS: &[&str] = &["pytorch-converted", "pytorch-operator", "simple", "node"];

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
    Passed,
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

fn collect_cases(data: &Path) -> Vec<Case> {
    let mut cases = Vec::new();
    for kind in MODEL_KINDS {
        for dir in sorted_dir(&data.join(kind)) {
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

/// The non-initializer graph inputs of a model: name, ONNX element type, dims (None where symbolic).
fn graph_inputs(bytes: &[u8]) -> Result<Vec<(String, i32, Vec<Option<usize>>)>, String> {
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
    let declared = match graph_inputs(&bytes) {
        Ok(d) => d,
        // Let the importer report undecodable files.
        Err(_) => Vec::new(),
    };
    // Named inputs and expected outputs per data set.
    let mut sets: Vec<(BTreeMap<String, Tensor>, Vec<Tensor>)> = Vec::new();
    // Test data of a dtype the IR lacks (DOUBLE...) makes the case unsupported, as the model's inputs would.
    let load = |p: &Path| {
        load_tensor_file(p).map_err(|e| match e.unsupported_key() {
            Some(key) => Outcome::Unsupported(key),
            None => Outcome::Failed(e.to_string()),
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
    for (named, expected) in &sets {
        let opts = ImportOptions { shapes: named.iter().map(|(k, t)| (k.clone(), t.shape().to_vec())).collect() };
        let g = match import_bytes(&bytes, case.model.parent(), &case.model.display().to_string(), &opts) {
            Ok(g) => g,
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
    Outcome::Passed
}

#[derive(Default)]
struct Tally {
    passed: usize,
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
    let cases = collect_cases(&data);
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
    let mut per_kind: BTreeMap<&str, Tally> = BTreeMap::new();
    let mut total = Tally::default();
    let mut slow = Vec::new();
    for (i, outcome, secs) in results {
        let case = &cases[i];
        let label = format!("{}/{}", case.kind, case.name);
        if secs > 5.0 {
            slow.push(format!("{label} {secs:.1}s"));
        }
        let k = per_kind.entry(case.kind.as_str()).or_default();
        match outcome {
            Outcome::Passed => {
                k.passed += 1;
                total.passed += 1;
            }
            Outcome::Failed(msg) => {
                k.failed.push(label.clone());
                total.failed.push(format!("{label}: {msg}"));
            }
            Outcome::Unsupported(key) => {
                k.unsupported += 1;
                total.unsupported += 1;
                *total.unsupported_keys.entry(key).or_default() += 1;
            }
        }
    }
    for (kind, t) in &per_kind {
        println!("onnx backend [{kind}]: {} passed, {} failed, {} unsupported", t.passed, t.failed.len(), t.unsupported);
    }
    println!("onnx backend: {} passed, {} failed, {} unsupported", total.passed, total.failed.len(), total.unsupported);
    println!("onnx backend: data {}, {} cases in {:.1}s on {workers} workers", data.display(), cases.len(), started.elapsed().as_secs_f64());
    if !slow.is_empty() {
        println!("onnx backend: slow cases: {}", slow.join(", "));
    }
    if !total.unsupported_keys.is_empty() {
        let tally: Vec<String> = total.unsupported_keys.iter().map(|(k, n)| format!("{k} x{n}")).collect();
        println!("onnx backend: unsupported: {}", tally.join(", "));
    }
    if !total.failed.is_empty() {
        println!("onnx backend: failures:");
        for f in &total.failed {
            println!("  {f}");
        }
    }
    assert!(total.failed.is_empty(), "{} ONNX backend cases failed (listed above)", total.failed.len());
    assert!(total.passed > 0, "no ONNX backend case passed");
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
