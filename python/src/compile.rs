//! `tessera.compile(...)`: the compiler from Python, through the library's compile entry point that the
//! `tessera compile` command uses too (`tessera::request::CompileRequest`), in this process. Built only with the
//! `compiler` feature (on by default; see python/Cargo.toml for why it is a feature at all).

use crate::Error;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::collections::BTreeMap;
use std::path::PathBuf;
use tessera::request::{CompileRequest, RemoteRequest, StoreRequest};
use tessera_stages::context::CostMode;

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
/// `--shape`). `batch`: batch sizes, as the CLI's `--batch` (`[1, 8]`: one artifact with a plan per size).
/// `calibration`: a directory of fp16 calibration inputs (the CLI's `--calibration`: `<input>.npy` per model
/// input, one sample per directory) used instead of random inputs. `store`: the content-addressed store (default `$TESSERA_STORE`, else `.tessera` in the
/// working directory); `wait`: wait for another writer of it instead of failing. `costs`: `"measured"`,
/// `"analytical"` or `"recorded"` (the store's recorded measurements only, as the CLI's `--frozen`). `remote`: a
/// remote tier URL as the CLI's `--remote` takes it (default `$TESSERA_REMOTE`; signing and trust key files from
/// `$TESSERA_REMOTE_SIGNING_KEY` and `$TESSERA_REMOTE_TRUST`, the credentials file and CA file from
/// `$TESSERA_REMOTE_CREDENTIALS` and `$TESSERA_REMOTE_CA`, credentials otherwise from the environment, as the CLI
/// reads them); `remote_read_only`: never
/// write to it. `gpus`: the GPUs that measure (the CLI's `--gpus`: indices; `None` is every GPU of GPU 0's
/// kind), checked before anything is built. The GIL is released while compiling. Raises `tessera.Error` with the compiler's message
/// (which names the file or model at fault); when some models fail, the others' artifacts are still
/// written and the error lists every failure.
#[pyfunction]
#[pyo3(signature = (inputs, out, *, targets=None, shapes=None, batch=None, calibration=None, store=None, costs="measured", wait=false, remote=None, remote_read_only=false, gpus=None))]
#[allow(clippy::too_many_arguments)]
pub fn compile<'py>(
    py: Python<'py>,
    inputs: Inputs,
    out: PathBuf,
    targets: Option<Vec<String>>,
    shapes: Option<BTreeMap<String, Vec<usize>>>,
    batch: Option<Vec<usize>>,
    calibration: Option<PathBuf>,
    store: Option<PathBuf>,
    costs: &str,
    wait: bool,
    remote: Option<String>,
    remote_read_only: bool,
    gpus: Option<Vec<usize>>,
) -> PyResult<Bound<'py, PyDict>> {
    let inputs: Vec<String> = match inputs {
        Inputs::One(p) => vec![path_string(p)?],
        Inputs::Many(ps) => ps.into_iter().map(path_string).collect::<PyResult<_>>()?,
    };
    let costs: CostMode = costs.parse().map_err(|e: tessera_stages::context::UnknownName| Error::new_err(e.to_string()))?;
    // A store of `None` resolves as the CLI's does (`tessera_store::resolve_dir`: $TESSERA_STORE, else `.tessera`).
    let request = CompileRequest {
        shapes: shapes.unwrap_or_default(),
        calibration,
        batches: batch.unwrap_or_default(),
        targets: targets.unwrap_or_default(),
        costs,
        gpus,
        store: StoreRequest { dir: store, wait, remote: remote_request(remote, remote_read_only)? },
        ..CompileRequest::new(inputs, out)
    };
    let summary = py.detach(|| request.compile()).map_err(|e| Error::new_err(format!("{e:#}")))?;
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

/// The remote tier `remote` (or `$TESSERA_REMOTE`) names, with the key files of the environment, as the CLI
/// reads them.
fn remote_request(remote: Option<String>, read_only: bool) -> PyResult<Option<RemoteRequest>> {
    let Some(url) = remote.or_else(|| std::env::var("TESSERA_REMOTE").ok()).filter(|u| !u.is_empty()) else { return Ok(None) };
    let url: tessera_store::RemoteUrl = url.parse().map_err(|e| Error::new_err(format!("remote: {e}")))?;
    let env_path = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    Ok(Some(RemoteRequest {
        url,
        options: tessera_store::RemoteOptions { read_only, ..Default::default() },
        signing_key: env_path(tessera_store::SIGNING_KEY_ENV),
        trust: env_path(tessera_store::TRUST_ENV),
        credentials: env_path(tessera_store::CREDENTIALS_ENV),
        ca: env_path(tessera_store::CA_ENV),
    }))
}

/// The pipeline takes inputs as strings (a `fixture:` spec is not a path); a path that is not UTF-8 cannot
/// be one of them faithfully, so it is refused by name rather than mangled.
fn path_string(p: PathBuf) -> PyResult<String> {
    p.into_os_string().into_string().map_err(|p| Error::new_err(format!("{}: the path is not valid UTF-8", PathBuf::from(p).display())))
}
