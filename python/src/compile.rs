//! `tessera.compile(...)`: the compiler from Python, through the pipeline library function the `tessera
//! compile` command runs (`tessera::cli::compile::compile`), in this process. Built only with the
//! `compiler` feature (on by default; see python/Cargo.toml for why it is a feature at all).

use crate::Error;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::BTreeMap;
use std::path::PathBuf;
use tessera::cli::build_options::BuildOptions;
use tessera_stages::partition::stage::CostMode;

/// One input path or a list of them (`str` or `os.PathLike`).
#[derive(FromPyObject)]
pub enum Inputs {
    One(PathBuf),
    Many(Vec<PathBuf>),
}

/// Compiles ONNX models (`.onnx`, named after the file stem), zoo manifests (`.toml`) or fixture specs
/// (`"fixture:mlp3:b8"`) into `out/<model>.tsr`, as `tessera compile` does with the same arguments, and
/// returns `{model name: artifact path}` in the order the CLI reports them.
///
/// `targets`: target strings (`["cpu", "cpu -compiler=gemm"]`, `["cuda -precision=fp16"]`); `None` or empty
/// means every backend this machine can run. `shapes`: `{onnx input name: (dims...)}` (the CLI's
/// `--shape`). `store`: the content-addressed store (default `$TESSERA_STORE`, else `.tessera` in the
/// working directory); `wait`: wait for another writer of it instead of failing. `costs`: `"measured"`,
/// `"analytical"` or `"recorded"` (the store's recorded measurements only, as the CLI's `--frozen`). The GIL is released while compiling. Raises `tessera.Error` with the compiler's message
/// (which names the file or model at fault); when some models fail, the others' artifacts are still
/// written and the error lists every failure.
#[pyfunction]
#[pyo3(signature = (inputs, out, *, targets=None, shapes=None, store=None, costs="measured", wait=false))]
#[allow(clippy::too_many_arguments)]
pub fn compile<'py>(
    py: Python<'py>,
    inputs: Inputs,
    out: PathBuf,
    targets: Option<Vec<String>>,
    shapes: Option<BTreeMap<String, Vec<usize>>>,
    store: Option<PathBuf>,
    costs: &str,
    wait: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let inputs: Vec<String> = match inputs {
        Inputs::One(p) => vec![path_string(p)?],
        Inputs::Many(ps) => ps.into_iter().map(path_string).collect::<PyResult<_>>()?,
    };
    let costs: CostMode = costs.parse().map_err(Error::new_err)?;
    // The CLI's `--shape NAME=D0xD1` spelling, parsed by the same code as the CLI's.
    let shapes = shapes.unwrap_or_default().into_iter().map(|(n, d)| format!("{n}={}", d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("x"))).collect();
    // `None` resolves as the CLI's does (`tessera_store::resolve_dir`: $TESSERA_STORE, else `.tessera`).
    let build = BuildOptions { targets: targets.unwrap_or_default(), shapes, store, wait, costs, frozen: false, measured_on: None, remote: None, remote_read_only: false, remote_timeout_ms: tessera::cli::build_options::DEFAULT_REMOTE_TIMEOUT_MS, remote_signing_key: None, remote_trust: None };
    let summary = py.detach(|| tessera::cli::compile::compile(&inputs, &build, &out)).map_err(|e| Error::new_err(format!("{e:#}")))?;
    if !summary.failed.is_empty() {
        let why: Vec<String> = summary.failed.iter().map(|f| f.error.clone()).collect();
        return Err(Error::new_err(format!("{} of {} models failed to compile: {}", summary.failed.len(), summary.failed.len() + summary.models, why.join("; "))));
    }
    let result = PyDict::new(py);
    for a in &summary.artifacts {
        result.set_item(&a.model, a.path.to_string_lossy().as_ref())?;
    }
    Ok(result)
}

/// The pipeline takes inputs as strings (a `fixture:` spec is not a path); a path that is not UTF-8 cannot
/// be one of them faithfully, so it is refused by name rather than mangled.
fn path_string(p: PathBuf) -> PyResult<String> {
    p.into_os_string().into_string().map_err(|p| Error::new_err(format!("{}: the path is not valid UTF-8", PathBuf::from(p).display())))
}
