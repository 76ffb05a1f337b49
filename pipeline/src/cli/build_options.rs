//! The options every command that builds models shares (`compile`, `explain`, `baselines`): targets, input
//! shapes, the store, and where partition costs come from. One definition, so the commands cannot drift apart;
//! parsed into the library's [`CompileRequest`] (and its [`StoreRequest`]), which does the rest.

use crate::request::{CompileRequest, RemoteRequest, StoreRequest};
use tessera_stages::context::{CostMode, Tuning};
use crate::zoo::resolve_targets;
use anyhow::{bail, Context, Result};
use tessera_stages::device::assume_gpu;
use tessera_stages::fingerprint::GpuFingerprint;
use clap::Args;
use std::collections::BTreeMap;
use std::path::PathBuf;
use tessera_stages::backend::Backend;
use tessera_stages::calibration::CalibrationDir;
use tessera_stages::target::TargetSet;
use std::path::Path;
use tessera_store::{RemoteOptions, RemoteUrl, Store};

#[derive(Args, Debug)]
pub struct BuildOptions {
    /// Target, e.g. `cpu`, `cpu -compiler=gemm`, or JSON; repeat for several. Default: every backend this
    /// machine can run.
    #[arg(long = "target", short = 't')]
    pub targets: Vec<String>,
    /// Fix an ONNX input's shape, e.g. `--shape input_ids=1x128` (applies to ONNX files given directly).
    #[arg(long = "shape")]
    pub shapes: Vec<String>,
    /// fp16 builds: calibrate on these inputs instead of random ones: `<input name>.npy` for each model input
    /// (the names `tessera run --out` writes), one sample per directory; a directory without `.npy` files
    /// holds one sample per subdirectory, and `DIR/<model name>/` is used for that model where it exists.
    #[arg(long, value_name = "DIR")]
    pub calibration: Option<PathBuf>,
    /// The store (default: $TESSERA_STORE, else .tessera in the working directory).
    #[arg(long, env = "TESSERA_STORE")]
    pub store: Option<PathBuf>,
    /// Wait for a process holding the store alone (gc, eviction, repair) instead of failing; other
    /// compiles and readers share the store and are never waited for.
    #[arg(long)]
    pub wait: bool,
    /// A remote tier shared by many machines: `redis://HOST:PORT[/DB]` (`rediss://` for TLS),
    /// `https://HOST[:PORT]/PATH` (WebDAV; `http://` without TLS) or `s3://BUCKET[/PREFIX]`, `?ro` for read-only
    /// (default: $TESSERA_REMOTE). Reads fall through the local store to it and back-fill; writes go to both.
    /// Never put credentials in the URL (see --remote-credentials). Whoever can write it can put code into
    /// artifacts: see the README.
    #[arg(long, env = "TESSERA_REMOTE", value_name = "URL", value_parser = RemoteUrlParser)]
    pub remote: Option<RemoteUrl>,
    /// Never write to the remote tier (machines that must not; the same as `?ro` in the URL).
    #[arg(long)]
    pub remote_read_only: bool,
    /// With `--remote`: how long connecting to the remote, and its answer to a first small request, may take
    /// (milliseconds) before it counts as down; a remote found down is not asked again in this run (one
    /// warning) and the build goes on with the local store.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_REMOTE_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub remote_timeout_ms: u64,
    /// With `--remote`: read its credentials from FILE (mode 0600, `NAME=VALUE` lines:
    /// TESSERA_REMOTE_USER, TESSERA_REMOTE_PASSWORD, TESSERA_REMOTE_TOKEN, AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) instead of the environment variables of those names.
    /// Default: $TESSERA_REMOTE_CREDENTIALS.
    #[arg(long, env = tessera_store::CREDENTIALS_ENV, value_name = "FILE")]
    pub remote_credentials: Option<PathBuf>,
    /// With a TLS `--remote` (rediss://, https://, an https S3 endpoint): trust only the CA certificates in
    /// FILE (PEM) instead of the system's, for a server whose certificate a private CA signed. Default:
    /// $TESSERA_REMOTE_CA.
    #[arg(long, env = tessera_store::CA_ENV, value_name = "FILE")]
    pub remote_ca: Option<PathBuf>,
    /// With `--remote`: sign every memo entry written to the remote with this ed25519 secret key file
    /// (`tessera store keygen` makes one; mode 0600). Default: $TESSERA_REMOTE_SIGNING_KEY.
    #[arg(long, env = tessera_store::SIGNING_KEY_ENV, value_name = "FILE")]
    pub remote_signing_key: Option<PathBuf>,
    /// With `--remote`: use a remote memo entry only when it is signed by one of the public keys in FILE
    /// (lines `ed25519 <64 hex digits> [comment]`); others are rejected and computed here. Without it,
    /// entries are used signed or not. Default: $TESSERA_REMOTE_TRUST.
    #[arg(long, env = tessera_store::TRUST_ENV, value_name = "FILE")]
    pub remote_trust: Option<PathBuf>,
    /// Where partition costs come from: measured on this machine (recorded in the store), or the backends'
    /// analytical estimates (no measurement; the same plan on every machine).
    #[arg(long, default_value = "measured", value_parser = clap::builder::TypedValueParser::map(clap::builder::PossibleValuesParser::new(CostMode::NAMES), |s| s.parse::<CostMode>().expect("a listed name")))]
    pub costs: CostMode,
    /// With measured costs: `pruned` measures the candidates the backends' estimates say can win (and tunes
    /// the configurations of the competitive ones), `full` every candidate in every configuration.
    #[arg(long, default_value = "pruned", value_parser = clap::builder::TypedValueParser::map(clap::builder::PossibleValuesParser::new(Tuning::NAMES), |s| s.parse::<Tuning>().expect("a listed name")))]
    pub tuning: Tuning,
    /// With measured costs: the GPUs that measure, `all` (every GPU of this machine that is GPU 0's kind) or
    /// indices like `0,1`. Where measuring runs, not what is built: the artifacts and records do not depend on it.
    #[arg(long, value_name = "all|I,J,..", default_value = "all", value_parser = parse_gpus_arg)]
    pub gpus: GpuList,
    /// Build from recorded measurements only (the same as `--costs recorded`): the tune records and plan
    /// timings in the store, from an earlier measured build or imported (`tessera store import`). Nothing is
    /// measured; a missing record fails the build with the list of every one missing.
    #[arg(long)]
    pub frozen: bool,
    /// With `--frozen`: the GPU the records were measured on, as `tessera targets --gpu-fingerprint` printed
    /// it there (JSON). Builds for that GPU on a machine without it (CI), with the bytes it built there.
    #[arg(long, value_name = "FILE", requires = "frozen")]
    pub measured_on: Option<PathBuf>,
}

impl BuildOptions {
    /// Where partition costs come from, `--frozen` applied; with `--measured-on`, the build assumes that GPU
    /// for the rest of the process ([`tessera_stages::device::assume_gpu`]).
    pub fn cost_mode(&self) -> Result<CostMode> {
        let mode = self.costs()?;
        if let Some(fp) = self.measured_on()? {
            let file = self.measured_on.as_ref().expect("read from it");
            assume_gpu(fp).map_err(|e| anyhow::anyhow!("--measured-on {}: {e}", file.display()))?;
        }
        Ok(mode)
    }

    /// Where partition costs come from, `--frozen` applied and checked against `--costs` and `--measured-on`.
    fn costs(&self) -> Result<CostMode> {
        let mode = match (self.frozen, self.costs) {
            (false, c) => c,
            (true, CostMode::Measured | CostMode::Recorded) => CostMode::Recorded,
            (true, c) => bail!("--frozen builds from recorded measurements; it cannot be combined with --costs {}", c.name()),
        };
        if let (Some(file), false) = (&self.measured_on, mode == CostMode::Recorded) {
            bail!("--measured-on {} needs --frozen: measuring under another GPU's fingerprint would record this machine's times as its", file.display());
        }
        Ok(mode)
    }

    /// The GPU fingerprint `--measured-on` names, read from its file.
    pub fn measured_on(&self) -> Result<Option<GpuFingerprint>> {
        let Some(file) = &self.measured_on else { return Ok(None) };
        let text = std::fs::read_to_string(file).with_context(|| format!("--measured-on: reading {}", file.display()))?;
        let fp: GpuFingerprint = serde_json::from_str(&text)
            .with_context(|| format!("--measured-on {}: not a GPU fingerprint as `tessera targets --gpu-fingerprint` prints it", file.display()))?;
        Ok(Some(fp))
    }

    /// The `--shape` arguments by input name; an input given twice is an error.
    pub fn shapes(&self) -> Result<BTreeMap<String, Vec<usize>>> {
        parse_shapes(&self.shapes)
    }

    /// The `--calibration` directory, checked to be one.
    pub fn calibration(&self) -> Result<Option<CalibrationDir>> {
        self.calibration.as_ref().map(|d| CalibrationDir::new(d.clone()).context("--calibration")).transpose()
    }

    /// The canonical target set (the given targets, or every backend this machine can run).
    pub fn targets(&self, backends: &[Box<dyn Backend>]) -> Result<TargetSet> {
        resolve_targets(&self.targets, backends)
    }

    /// The store these options name (`--store`, `--wait`, `--remote` and its keys).
    pub fn store_request(&self) -> StoreRequest {
        StoreRequest {
            dir: self.store.clone(),
            wait: self.wait,
            remote: self.remote.as_ref().map(|url| RemoteRequest {
                url: url.clone(),
                options: self.remote_options(),
                signing_key: self.remote_signing_key.clone(),
                trust: self.remote_trust.clone(),
                credentials: self.remote_credentials.clone(),
                ca: self.remote_ca.clone(),
            }),
        }
    }

    /// Opens the store for writing, waiting for a holder that has the store alone (gc, repair) if `--wait` was given, with the remote tier
    /// attached when `--remote` (or $TESSERA_REMOTE) names one.
    pub fn open_store(&self) -> Result<Store> {
        self.store_request().open()
    }

    /// The library request these options and the command's inputs and output folder make.
    pub fn request(&self, inputs: &[String], out: &Path) -> Result<CompileRequest> {
        Ok(CompileRequest {
            inputs: inputs.to_vec(),
            shapes: self.shapes()?,
            calibration: self.calibration.clone(),
            batches: Vec::new(),
            targets: self.targets.clone(),
            // The request assumes the measured GPU when it compiles.
            costs: self.costs()?,
            tuning: self.tuning,
            gpus: self.gpus.0.clone(),
            measured_on: self.measured_on()?,
            store: self.store_request(),
            out: out.to_path_buf(),
            runtime: tessera_kernels::runtime::Registry::builtin().clone(),
        })
    }

    /// How the remote tier is used: `--remote-read-only`, `--remote-timeout-ms` (the credentials, CA file and
    /// S3 settings are added when the store is opened: [`RemoteRequest`]).
    pub fn remote_options(&self) -> RemoteOptions {
        RemoteOptions { read_only: self.remote_read_only, timeout: std::time::Duration::from_millis(self.remote_timeout_ms), ..Default::default() }
    }
}

/// `--gpus`: None for `all`.
#[derive(Clone, Debug)]
pub struct GpuList(pub Option<Vec<usize>>);

fn parse_gpus_arg(text: &str) -> Result<GpuList, tessera_stages::device::DeviceError> {
    tessera_stages::device::parse_gpus(text).map(GpuList)
}

/// `--remote-timeout-ms`'s default: the store's [`tessera_store::DEFAULT_REMOTE_TIMEOUT`].
pub const DEFAULT_REMOTE_TIMEOUT_MS: u64 = tessera_store::DEFAULT_REMOTE_TIMEOUT.as_millis() as u64;

/// Parses `--remote`. Not a plain `value_parser` function: clap would show the rejected value in its error, and
/// a URL refused for carrying a password must not be shown; the store's error shows it masked.
#[derive(Clone)]
struct RemoteUrlParser;

impl clap::builder::TypedValueParser for RemoteUrlParser {
    type Value = RemoteUrl;
    fn parse_ref(&self, cmd: &clap::Command, _: Option<&clap::Arg>, value: &std::ffi::OsStr) -> Result<RemoteUrl, clap::Error> {
        let fail = |msg: String| clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("--remote: {msg}\n")).with_cmd(cmd);
        let s = value.to_str().ok_or_else(|| fail("the URL is not valid UTF-8".into()))?;
        s.parse::<RemoteUrl>().map_err(|e| fail(e.to_string()))
    }
}

/// Parses `--shape NAME=DxD` arguments into input name -> dims; an input given twice is an error.
pub fn parse_shapes(args: &[String]) -> Result<BTreeMap<String, Vec<usize>>> {
    let mut shapes = BTreeMap::new();
    for s in args {
        let (name, dims) = tessera_stages::onnx::parse_shape_arg(s).map_err(anyhow::Error::msg)?;
        if shapes.insert(name.clone(), dims).is_some() {
            bail!("--shape given twice for input '{name}'");
        }
    }
    Ok(shapes)
}
