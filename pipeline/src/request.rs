//! The library's compile entry point: one typed [`CompileRequest`] that the `tessera compile` command, Python's
//! `tessera.compile` and Rust programs all build. The CLI only parses its arguments into one
//! (`cli::build_options`); every build goes through [`CompileRequest::compile`].

use crate::build::ModelResult;
use crate::job::{ModelJob, ModelSource};
use crate::explain::jobs_from_specs;
use crate::memo::Memo;
use crate::zoo::{all_backends, compile_all_in, resolve_targets, Summary};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::PathBuf;
use tessera_kernels::runtime::Registry;
use tessera_stages::calibration::CalibrationDir;
use tessera_stages::context::{CostMode, Ctx, Tuning};
use tessera_stages::device::assume_gpu;
use tessera_stages::fingerprint::GpuFingerprint;
use tessera_store::remote::keyfile::{load_signing_key, load_trust};
use tessera_store::{OpenOptions, Remote, RemoteOptions, RemoteUrl, Signing, Store, Trust};

/// One compile: which models, for which targets, with which costs, through which store, into which folder.
#[derive(Clone)]
pub struct CompileRequest {
    /// ONNX files (each named after its file stem), zoo manifests (`.toml`), or fixture specs
    /// (`fixture:MODEL[:bN][:sN][:iN]`).
    pub inputs: Vec<String>,
    /// Fixed shapes of ONNX inputs given directly, by input name.
    pub shapes: BTreeMap<String, Vec<usize>>,
    /// fp16 builds: a directory of calibration inputs ([`tessera_stages::calibration::CalibrationDir`]) used
    /// instead of random ones; None: random inputs.
    pub calibration: Option<PathBuf>,
    /// Batch sizes for the ONNX files and fixture specs given directly (manifest entries say their own):
    /// several make one artifact with a plan per size (`tessera compile --batch 1,8`); one sets the batch.
    /// For an ONNX file each size replaces the leading dimension of every input `shapes` fixes. Empty: the
    /// inputs' own batch.
    pub batches: Vec<usize>,
    /// Target strings or JSON texts; empty: every backend this machine can run.
    pub targets: Vec<String>,
    /// Where partition costs come from; [`CostMode::Recorded`] is a frozen build.
    pub costs: CostMode,
    /// With measured or recorded costs: which candidates and configurations are measured.
    pub tuning: Tuning,
    /// The GPUs that measure (`--gpus`): where measuring runs, not what is built. None: every GPU of this
    /// machine that is GPU 0's kind ([`tessera_stages::device::measuring_gpus`]).
    pub gpus: Option<Vec<usize>>,
    /// A frozen build only: the GPU the records were measured on (`tessera targets --gpu-fingerprint` there),
    /// so a machine without it builds that GPU's bytes.
    pub measured_on: Option<GpuFingerprint>,
    pub store: StoreRequest,
    /// Where artifacts go, as `<model>.tsr`.
    pub out: PathBuf,
    /// How the compiler's measurements load modules: the runtime's built-in formats, plus the loaders of
    /// backends registered from outside (`Registry::with`), whose candidates are then measured, not refused.
    pub runtime: Registry,
}

impl std::fmt::Debug for CompileRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompileRequest")
            .field("inputs", &self.inputs)
            .field("shapes", &self.shapes)
            .field("calibration", &self.calibration)
            .field("batches", &self.batches)
            .field("targets", &self.targets)
            .field("costs", &self.costs)
            .field("tuning", &self.tuning)
            .field("gpus", &self.gpus)
            .field("measured_on", &self.measured_on)
            .field("store", &self.store)
            .field("out", &self.out)
            .field("runtime", &self.runtime.formats().map(|f| f.to_string()).collect::<Vec<_>>())
            .finish()
    }
}

/// The store a build reads and writes.
#[derive(Clone, Debug, Default)]
pub struct StoreRequest {
    /// The store's folder; `None`: `$TESSERA_STORE`, else `.tessera` in the working directory.
    pub dir: Option<PathBuf>,
    /// Wait for another process holding the store instead of failing.
    pub wait: bool,
    /// A remote tier shared by many machines.
    pub remote: Option<RemoteRequest>,
}

/// A remote tier: its URL, how to use it, and the key files that sign and check its entries.
#[derive(Clone, Debug)]
pub struct RemoteRequest {
    pub url: RemoteUrl,
    pub options: RemoteOptions,
    /// An ed25519 secret key file: every memo entry written to the remote is signed with it.
    pub signing_key: Option<PathBuf>,
    /// A file of trusted public keys: a remote memo entry is used only when one of them signed it.
    pub trust: Option<PathBuf>,
    /// A credentials file (mode 0600); None: the credentials come from the environment.
    pub credentials: Option<PathBuf>,
    /// A PEM file of the CA certificates to trust instead of the system's (TLS remotes).
    pub ca: Option<PathBuf>,
}

impl CompileRequest {
    /// A request with the defaults: every backend of this machine, measured costs, the default store.
    pub fn new(inputs: Vec<String>, out: impl Into<PathBuf>) -> CompileRequest {
        CompileRequest {
            inputs,
            shapes: BTreeMap::new(),
            calibration: None,
            batches: Vec::new(),
            targets: Vec::new(),
            costs: CostMode::default(),
            tuning: Tuning::default(),
            gpus: None,
            measured_on: None,
            store: StoreRequest::default(),
            out: out.into(),
            runtime: Registry::builtin().clone(),
        }
    }

    /// The models the inputs name, [`batches`](Self::batches) applied.
    pub fn jobs(&self) -> Result<Vec<ModelJob>> {
        if self.batches.is_empty() {
            return jobs_from_specs(&self.inputs, &self.shapes);
        }
        let sizes = tessera_fixtures::batch::check_batches(&self.batches).map_err(|e| anyhow::anyhow!("--batch: {e}"))?;
        let mut jobs = Vec::new();
        for input in &self.inputs {
            let mut these = jobs_from_specs(std::slice::from_ref(input), &self.shapes)?;
            if !input.ends_with(".toml") {
                for j in &mut these {
                    with_batches(j, &sizes, input)?;
                }
            }
            jobs.extend(these);
        }
        let mut seen = std::collections::BTreeSet::new();
        for j in &jobs {
            if !seen.insert(j.name.clone()) {
                bail!("two models are named '{}': give each model once", j.name);
            }
        }
        Ok(jobs)
    }

    /// Compiles every model of the request; each artifact is written to `out/<model>.tsr`. A model that
    /// fails does not stop the others: it is listed in [`Summary::failed`] with its error.
    pub fn compile(&self) -> Result<Summary> {
        self.compile_jobs(&self.jobs()?, &|_, _| {}, &|_| {})
    }

    /// Compiles `jobs` (a share of [`jobs`](Self::jobs), for sharded builds) as the request says;
    /// `on_stage(stage, was_hit)` follows every memoized call and `on_model` every finished model.
    pub fn compile_jobs(&self, jobs: &[ModelJob], on_stage: &(dyn Fn(&'static str, bool) + Send + Sync), on_model: &(dyn Fn(&ModelResult) + Sync)) -> Result<Summary> {
        self.assume_measured_gpu()?;
        // The GPU's fingerprint is recalled from the store's machine facts where they prove it current, so a
        // warm rebuild does not initialise the driver (before the targets: the default ones ask for a GPU).
        tessera_stages::gpu_facts::keep_in(&tessera_store::resolve_dir(self.store.dir.as_deref()));
        self.check_gpus()?;
        let backends = all_backends();
        let targets = resolve_targets(&self.targets, &backends)?;
        let calibration = self.calibration.as_ref().map(|d| CalibrationDir::new(d.clone())).transpose()?;
        let mut store = self.store.open()?;
        let mut summary = {
            let memo = Memo::new(&store).with_observer(on_stage);
            let ctx = Ctx::new(&memo, &targets, &backends)
                .with_costs(self.costs)
                .with_tuning(self.tuning)
                .with_gpus(self.gpus.clone())
                .with_runtime(&self.runtime)
                .with_calibration(calibration.as_ref());
            compile_all_in(&memo, &ctx, jobs, &self.out, on_model)?
        };
        // A capped store (`tessera store config --max-size`) is brought back under its cap once the build is
        // done and its roots are set, still under this process's lock, so nothing it just built is evicted
        // that a root needs.
        summary.evicted = store.enforce_max_size().context("enforcing the store's size cap (tessera store config)")?;
        if let Some(r) = summary.evicted.as_ref().filter(|r| !r.within_cap) {
            tracing::warn!("{}", r.lines().join("; "));
        }
        Ok(summary)
    }

    /// `gpus`, when given, checked before anything is built: every GPU exists and is GPU 0's kind. A build
    /// from records measures nothing, so it does not check them.
    pub fn check_gpus(&self) -> Result<()> {
        if let (Some(gpus), false) = (&self.gpus, self.costs == CostMode::Recorded) {
            tessera_stages::device::measuring_gpus(Some(gpus)).map_err(|e| anyhow::anyhow!("--gpus: {e}"))?;
        }
        Ok(())
    }

    /// With `measured_on`: the build assumes that GPU for the rest of the process (only a frozen build may).
    pub fn assume_measured_gpu(&self) -> Result<()> {
        if let Some(fp) = &self.measured_on {
            if self.costs != CostMode::Recorded {
                bail!("measured_on needs a frozen build (recorded costs): measuring under another GPU's fingerprint would record this machine's times as its");
            }
            assume_gpu(fp.clone()).map_err(anyhow::Error::msg)?;
        }
        Ok(())
    }
}

/// `job` (from `input`, an ONNX file or a fixture spec) at the batch sizes `sizes` (checked, ascending): one
/// sets its batch, several make it a batched job (see [`ModelJob::batches`]).
fn with_batches(job: &mut ModelJob, sizes: &[usize], input: &str) -> Result<()> {
    let several = if sizes.len() > 1 { sizes.to_vec() } else { Vec::new() };
    match &mut job.source {
        ModelSource::Fixture { model, options } => {
            if input.split(':').skip(2).any(|p| p.starts_with('b')) {
                bail!("{input}: the spec gives a batch and --batch gives batch sizes; give them in one place");
            }
            for &b in [sizes[0], sizes[sizes.len() - 1]].iter() {
                tessera_fixtures::registry::resolve(model, &tessera_fixtures::ModelOptions { batch: b, ..*options }).with_context(|| format!("{input} at batch {b}"))?;
            }
            options.batch = sizes[0];
            job.name = tessera_fixtures::batch::default_batched_name(model, options, &several);
        }
        ModelSource::Onnx { shapes, .. } => {
            tessera_fixtures::batch::batch_leads(shapes).map_err(|e| anyhow::anyhow!("{input}: --batch: {e}"))?;
            *shapes = tessera_fixtures::batch::shapes_at_batch(shapes, sizes[0]);
        }
    }
    job.batches = several;
    Ok(())
}

impl StoreRequest {
    /// Opens the store for writing (waiting for another holder if asked), with the remote tier attached.
    pub fn open(&self) -> Result<Store> {
        let dir = tessera_store::resolve_dir(self.dir.as_deref());
        tessera_stages::gpu_facts::keep_in(&dir);
        let store = Store::open(&dir, OpenOptions::writable().wait(self.wait))?;
        Ok(match &self.remote {
            Some(r) => store.with_remote(Remote::new(&r.url, r.options()?)?.with_signing(r.signing()?))?,
            None => store,
        })
    }
}

impl RemoteRequest {
    /// The options with the credentials (the file's, else the environment's), the CA file and the S3 settings of
    /// the environment (errors name the file or variables, never a value).
    pub fn options(&self) -> Result<RemoteOptions> {
        let credentials = tessera_store::Credentials::load(self.credentials.as_deref())?;
        Ok(RemoteOptions { credentials, ca_file: self.ca.clone(), s3: tessera_store::S3Settings::from_env(), ..self.options.clone() })
    }

    /// The signing key and trusted keys the request names (errors name the file, never a key).
    pub fn signing(&self) -> Result<Signing> {
        let signer = self.signing_key.as_deref().map(load_signing_key).transpose().map_err(|e| anyhow::anyhow!("remote signing key: {e}"))?;
        let trust = match &self.trust {
            Some(file) => Trust::new(load_trust(file).map_err(|e| anyhow::anyhow!("remote trust file: {e}"))?),
            None => Trust::default(),
        };
        Ok(Signing { signer, trust })
    }
}
