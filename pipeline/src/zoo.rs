//! Compiling a zoo: turning command-line inputs (ONNX files, manifests) into jobs, running them in parallel,
//! writing artifacts and summarizing the run.

use crate::build::{compile_models, Ctx, ModelResult};
use crate::job::{ModelJob, ModelSource};
use crate::memo::{Memo, RunStageStats};
use crate::provenance::{write_artifact, BuildRecord};
use tessera_stages::context::CostMode;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tessera_fixtures::{load_manifest, Precision, Source};
use tessera_stages::backend::Backend;
use tessera_stages::target::{Target, TargetSet};
use tessera_store::Digest;

/// Turns inputs into jobs: `.onnx` files (named after the file stem, shapes from `--shape`) and `.toml`
/// manifests (every entry). Names must be unique across the run: they name the artifact files.
pub fn jobs_from_inputs(inputs: &[PathBuf], shapes: &BTreeMap<String, Vec<usize>>) -> Result<Vec<ModelJob>> {
    let mut jobs = Vec::new();
    for input in inputs {
        match input.extension().and_then(|e| e.to_str()) {
            Some("onnx") => {
                let name = input
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .with_context(|| format!("{}: the file name is not valid UTF-8", input.display()))?
                    .to_string();
                jobs.push(ModelJob { name, source: ModelSource::Onnx { path: input.clone(), shapes: shapes.clone() }, batches: Vec::new() });
            }
            Some("toml") => {
                let m = load_manifest(input)?;
                for e in m.entries {
                    if e.precision != Precision::Fp32 {
                        bail!(
                            "{}: entry '{}' asks for {} precision; the CPU backends compile fp32 only",
                            input.display(),
                            e.name,
                            e.precision
                        );
                    }
                    let source = match e.source {
                        Source::Fixture { model, options } => ModelSource::Fixture { model, options },
                        Source::Onnx { resolved, shapes, .. } => ModelSource::Onnx { path: resolved, shapes },
                    };
                    jobs.push(ModelJob { name: e.name, source, batches: e.batches });
                }
            }
            _ => bail!("{}: expected an ONNX model (.onnx) or a zoo manifest (.toml)", input.display()),
        }
    }
    let mut seen = BTreeSet::new();
    for j in &jobs {
        if !seen.insert(j.name.clone()) {
            bail!("two models are named '{}': artifact names must be unique (rename one in its manifest)", j.name);
        }
    }
    if jobs.is_empty() {
        bail!("nothing to compile: give ONNX files or zoo manifests");
    }
    Ok(jobs)
}

/// The backends compiled into this build, available or not.
pub fn all_backends() -> Vec<Box<dyn Backend>> {
    tessera_stages::backend::registry::all()
}

/// Canonical targets: the given ones, or every backend this machine can run.
pub fn resolve_targets(given: &[String], backends: &[Box<dyn Backend>]) -> Result<TargetSet> {
    let set = if given.is_empty() {
        // Every backend whose artifacts can run on this machine. Where a GPU is present the zoo compiles for
        // the GPU alone: the runtime runs plans that mix host and GPU partitions (`-t cpu -t cuda`), but with
        // the crossing costs the search never puts a zoo partition on the host (analytical costs, 2026-11-24),
        // and compiling and measuring every host candidate with the C compiler would only cost compile time.
        // On the GPU that is `cuda`, `cublas` and `cudnn` (the libraries' modules are descriptions, so they
        // are always available to compile; loading needs the libraries, which come with the CUDA toolkit), and
        // not `cutlass`, which is opt-in (`Backend::opt_in`).
        let mut ts = Vec::new();
        // (A recalled fingerprint answers without initialising the driver: `tessera_stages::gpu_facts`.)
        let gpu = tessera_stages::device::this_gpu().is_some() || tessera_kernels::runtime::cuda::available().is_ok();
        for kind in tessera_stages::target::KINDS {
            if (kind.name == "cuda") != gpu {
                continue;
            }
            for spec in kind.backends() {
                // An opt-in backend (`cutlass`) only where named.
                // (Opt-in first: `cutlass`'s availability probe asks Python where CUTLASS is, a process.)
                if backends.iter().any(|b| b.name() == spec.name && b.opt_in().is_none() && b.available().is_ok()) {
                    ts.push(Target::parse(&format!("{} -compiler={}", kind.name, spec.compiler))?);
                }
            }
        }
        if ts.is_empty() {
            bail!("no backend can run on this machine (is a C compiler installed?)");
        }
        TargetSet::from_targets(ts)?
    } else {
        TargetSet::parse(given)?
    };
    for t in &set.targets {
        let b = backends
            .iter()
            .find(|b| b.name() == t.backend_name())
            .with_context(|| format!("target '{t}': backend '{}' is not part of this build yet", t.backend_name()))?;
        b.available().map_err(|why| anyhow::anyhow!("target '{t}': backend '{}' cannot run here: {why}", b.name()))?;
    }
    Ok(set)
}

/// Summary of a compile run (what `tessera compile` prints, and `--json`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Summary {
    pub targets: Vec<String>,
    pub models: usize,
    pub partitions: usize,
    pub unique_kernels: usize,
    /// partitions / unique kernels: how much work identical partitions saved.
    pub dedupe_ratio: f64,
    pub stages: BTreeMap<String, RunStageStats>,
    pub seconds: f64,
    pub cost_source: String,
    pub artifacts: Vec<ArtifactRow>,
    /// Models that failed, with the error; the others still compiled.
    pub failed: Vec<FailedModel>,
    /// What the remote tier did (objects fetched, rejected, uploaded; whether it was disabled), when one
    /// was configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<tessera_store::RemoteStats>,    /// What enforcing the store's size cap evicted after the build, when the store has a cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evicted: Option<tessera_store::EvictReport>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FailedModel {
    pub model: String,
    pub error: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ArtifactRow {
    pub model: String,
    pub path: PathBuf,
    /// The payload digest (the store's artifact object, as the linker wrote it): the file at `path` is that
    /// payload with provenance stamped on, so its own blake3 differs; `tessera inspect` shows both.
    pub digest: Digest,
    /// The file's size.
    pub bytes: u64,
    pub partitions: usize,
    pub partitions_by_backend: BTreeMap<String, usize>,
    /// Partitions per tuned configuration other than their backend's default.
    #[serde(default)]
    pub tuned_configs: BTreeMap<String, usize>,
    /// For a batched artifact, its largest plan's estimate.
    pub estimated_us: f64,
    /// A batched artifact's plans, one per batch size (each with the payload digest of the model's
    /// single-plan artifact at that size, in the store); absent for one plan.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plans: Vec<crate::build::PlanResult>,
    /// Distinct (backend, kernel signature) pairs of this model, for tests and reports.
    #[serde(skip)]
    pub kernels: BTreeSet<(String, Digest)>,
}

/// Compiles every job in parallel, writes `out/<name>.tsr` (the linker's payload with the build's provenance
/// stamped on), records a gc root per model, and summarizes.
pub fn compile_all(
    memo: &Memo,
    targets: &TargetSet,
    backends: &[Box<dyn Backend>],
    jobs: &[ModelJob],
    out: &Path,
    costs: CostMode,
    on_model: &(dyn Fn(&ModelResult) + Sync),
) -> Result<Summary> {
    let ctx = Ctx::new(memo, targets, backends).with_costs(costs);
    compile_all_in(memo, &ctx, jobs, out, on_model)
}

/// [`compile_all`] under a context the caller configured (a preferred backend, a runtime registry); `ctx`
/// must drive through `memo`.
pub fn compile_all_in(memo: &Memo, ctx: &Ctx, jobs: &[ModelJob], out: &Path, on_model: &(dyn Fn(&ModelResult) + Sync)) -> Result<Summary> {
    let (targets, costs) = (ctx.targets, ctx.costs);
    let start = Instant::now();
    tessera_stages::stage::run_digest(memo, &tessera_stages::stages::targets::Targets { targets })?;
    // One bad model must not cost the rest of the zoo: every model compiles, failures are reported at the end.
    let outcomes: Vec<Result<ModelResult>> = compile_models(ctx, jobs, on_model);
    let mut results = Vec::new();
    let mut failed = Vec::new();
    for (job, outcome) in jobs.iter().zip(outcomes) {
        match outcome {
            Ok(r) => results.push(r),
            Err(e) => failed.push(FailedModel { model: job.name.clone(), error: format!("{e:#}") }),
        }
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating output folder {}", out.display()))?;
    let store = memo.store();
    let record = BuildRecord::of(ctx)?;
    let mut rows = Vec::new();
    for r in &results {
        let path = out.join(format!("{}.tsr", r.name));
        let bytes = write_artifact(store, &r.artifact, &record.provenance(&r.origin), &path)?;
        store.set_root(&format!("model:{}", r.name), &r.objects)?;
        rows.push(ArtifactRow {
            model: r.name.clone(),
            path,
            digest: r.artifact,
            bytes,
            partitions: r.partitions,
            partitions_by_backend: r.partitions_by_backend.clone(),
            tuned_configs: r.tuned_configs.clone(),
            estimated_us: r.estimated_us,
            plans: r.plans.clone(),
            kernels: r.lowered.clone(),
        });
    }
    store.flush()?;
    let partitions: usize = results.iter().map(|r| r.partitions).sum();
    let unique: BTreeSet<Digest> = results.iter().flat_map(|r| r.kernels.iter().copied()).collect();
    let stages = memo.stats().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    Ok(Summary {
        targets: targets.targets.iter().map(|t| t.to_string()).collect(),
        models: results.len(),
        partitions,
        unique_kernels: unique.len(),
        dedupe_ratio: if unique.is_empty() { 1.0 } else { partitions as f64 / unique.len() as f64 },
        stages,
        seconds: start.elapsed().as_secs_f64(),
        cost_source: results.first().map(|r| r.cost_source.clone()).unwrap_or_else(|| costs.name().to_string()),
        artifacts: rows,
        failed,
        remote: store.remote_stats(),
        evicted: None,
    })
}
