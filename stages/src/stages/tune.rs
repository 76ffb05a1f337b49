//! Stage 4, tune: the measured cost of a candidate partition, memoized in the store under a complete key.
//!
//! A candidate is a target and a list of nodes of a model graph. Its cost is the median run time of its
//! kernel as the target's backend compiles it, on this machine, on random non-zero inputs. Results are keyed
//! by the kernel signature (structure, shapes, dtypes, attributes; not weight values), so identical candidates
//! across layers, models and runs are measured once; see [`TuneKeyParams`] for everything else in the key.
//!
//! On a miss, the kernel is lowered through the same lower stage the compile path uses
//! ([`Lower`](crate::stages::lower::Lower)), so a kernel measured while partitioning is never lowered
//! again when the model compiles. The missed kernels of one target go into one module per core (a handful
//! of C compiles per call), all compiled in parallel (rayon). A target's GPU kernels are measured as soon as
//! its modules are built, on every measuring GPU at once, while other targets compile; host measurements
//! start only when every module is built, one function at a time under the device's lock
//! ([`device::exclusively`](crate::device::exclusively), on a thread pool of its own), so no compile of ours
//! competes with a host timing run and two measurements never overlap on one device in this process (a GPU
//! measurement times the GPU with CUDA events, so compiles on the cores beside it do not change it). A zoo runs the partition
//! stages of its models one at a time (the pipeline's `build::compile_models`) for the same
//! reason: work outside the lock (graph loads, signatures, store reads) would otherwise share the cores.
//!
//! Outcomes:
//! - `Measured`: the median, with the full [`Measurement`] recorded.
//! - `Unsupported` (cost `+inf`): the backend refused to lower the kernel ([`BackendError::Unsupported`]), or
//!   its module failed to compile; recorded with the error text, so it is not retried on every run (a new
//!   backend version changes the key). Any other lowering failure, and a missing toolchain, is an error.
//! - `Analytical`: nothing can be measured (the backend is unavailable here, or the device has no
//!   fingerprint yet): the backend's `estimate_us`. Not recorded, since it is cheap and not a tune result.

use crate::backend::{Backend, BackendError, FunctionInfo, LoweredKernel};
use crate::context::{CostSource, Ctx};
use crate::stages::lower::Lower;
use crate::device::{cpu_fingerprint, exclusively, gpu_fingerprint};
use crate::fingerprint::DeviceFingerprint;
use crate::interp::{int_input_bounds, random_tensor};
use crate::ir::{extract_subgraph, Graph, NodeId, Tensor};
use crate::partition::plan::{config_symbol, kernel_signature, kernel_symbol};
use crate::stage::{cause, run, DevicePolicy, Stage};
use crate::target::Target;
use anyhow::{anyhow, bail, Context, Result};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tessera_kernels::runtime::cuda::measure::{measure_gpu_function, GpuMeasureError};
use tessera_kernels::runtime::measure::{measure_function, MeasureOptions, Measurement};
use tessera_kernels::runtime::LoadedModule;
use tessera_store::Digest;

/// Bump when what the tune stage records, or how it measures, changes. (5: every configuration of a kernel
/// measured, the fastest recorded as best; 4: p10/p90 interpolated, as
/// `tessera bench` reports them.)
pub const TUNE_VERSION: u32 = 5;

/// The tune stage's code version: [`TUNE_VERSION`] with the digests of the stage's source and of the runtime
/// that measures.
pub fn code_version() -> crate::code::CodeVersion {
    crate::code::CodeVersion::new(TUNE_VERSION, &[crate::code::digests::TUNE, crate::code::runtime_digests::RUNTIME])
}

/// Seed of the random kernel inputs (per input `i`, stream `i`; see `interp::random`).
pub const INPUT_SEED: u64 = 0x7e55_e7a5;

/// The cost of one candidate.
#[derive(Clone, Debug, PartialEq)]
pub struct CandidateCost {
    /// Microseconds per run: the measured median, the estimate, or `+inf` when unsupported.
    pub us: f64,
    pub source: CostSource,
    /// The tune key (also for analytical costs, which are not recorded under it).
    pub key: Digest,
    /// Why the backend could not run the candidate (`Unsupported` only).
    pub error: Option<String>,
    /// The full measurement (`Measured` only).
    pub measurement: Option<Measurement>,
    /// The backend configuration the cost is for: the fastest measured, else the backend's default.
    pub config: String,
}

/// The tune stage's recorded output for one key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuneRecord {
    pub kernel: Digest,
    /// Canonical target string.
    pub target: String,
    pub backend: String,
    pub outcome: TuneOutcome,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum TuneOutcome {
    /// Every configuration measured (the CPU backends have one; configurations the device refused are
    /// left out), and the fastest of them by median.
    Measured { best: String, measurements: Vec<(String, Measurement)> },
    /// The backend refused the kernel: its message.
    Unsupported { error: String },
}

/// Every ingredient of a tune key, in one place (sccache's `HashKeyParams`); [`TuneKeyParams::key`] hashes
/// exactly these, and `tests/tune.rs` checks that changing any one changes the key.
#[derive(Clone, Debug, PartialEq)]
pub struct TuneKeyParams {
    /// The kernel signature: structure, shapes, dtypes, attributes, inlined small constants; not weights.
    pub kernel: Digest,
    /// The canonical target's digest: every backend option (opt-level, fast-math, march...).
    pub target: Digest,
    pub backend: String,
    pub backend_version: crate::code::CodeVersion,
    /// The backend's toolchain facts (`Backend::environment`): compiler, version, flags.
    pub backend_env: Vec<(String, String)>,
    /// The machine measured on; `None` where the device has no fingerprint (nothing is measured then).
    pub device: Option<DeviceFingerprint>,
    /// The measurement schedule.
    pub options: MeasureOptions,
    /// The seed of the random inputs.
    pub input_seed: u64,
    /// Checksum of the backend's candidate-config set (`Backend::configs`, a `TunableSet`, as CubeCL's
    /// autotune keys do): a new config invalidates old winners.
    pub configs_checksum: Digest,
    /// Only the default configuration is measured ([`ConfigScope::DefaultOnly`] on a backend with a tuning
    /// space): a record that must not answer for the full measurement.
    pub default_only: bool,
}

/// Which configurations of a kernel the tune stage measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigScope {
    /// Every configuration the backend offers for it (within the target's `-tune-configs` budget).
    All,
    /// The backend's default only: what pruned tuning ranks candidates by before it tunes the few that can win.
    DefaultOnly,
}

impl TuneKeyParams {
    /// The parameters of measuring `kernel` for `target` with `backend` on this machine.
    pub fn new(kernel: Digest, target: &Target, backend: &dyn Backend, options: &MeasureOptions) -> TuneKeyParams {
        TuneKeyParams {
            kernel,
            target: target.digest(),
            backend: backend.name().to_string(),
            backend_version: backend.version(),
            backend_env: backend.environment(target),
            device: device_fingerprint(target),
            options: *options,
            input_seed: INPUT_SEED,
            configs_checksum: backend.configs(target).checksum(),
            default_only: false,
        }
    }

    /// The same measurement restricted to `scope`: default-only where the backend has more than one
    /// configuration (with one, both scopes measure the same thing and share the key).
    pub fn scoped(mut self, scope: ConfigScope, backend: &dyn Backend, target: &Target) -> TuneKeyParams {
        self.default_only = scope == ConfigScope::DefaultOnly && backend.configs(target).len() > 1;
        self
    }

    /// The tune key.
    pub fn key(&self) -> Result<Digest> {
        Ok(code_version()
            .key_builder(Tune::NAME)
            .input_digest("kernel", &self.kernel)
            .input_digest("target", &self.target)
            .input("backend", &(&self.backend, self.backend_version))
            .input("configs", &self.configs_checksum)
            .input("default_only", &self.default_only)
            .input("measure_options", &self.options)
            .input("input_seed", &self.input_seed)
            .env("toolchain", &self.backend_env)
            .env("device", &self.device)
            .finish()?)
    }
}

/// The fingerprint of the device a target runs on, if tessera knows how to take one.
pub fn device_fingerprint(target: &Target) -> Option<DeviceFingerprint> {
    match target.device() {
        "cpu" => Some(cpu_fingerprint()),
        "cuda" => gpu_fingerprint(),
        _ => None,
    }
}

/// A build from recorded measurements only (`CostMode::Recorded`) needed records the store does not hold.
/// Every missing record of the call is listed, so one run tells what to measure or import.
#[derive(Debug, Clone, PartialEq)]
pub struct MissingRecords {
    /// The stage whose records are missing ("tune", "time-plans").
    pub stage: &'static str,
    /// One line per missing record: what it measures and its key.
    pub missing: Vec<String>,
}

impl std::fmt::Display for MissingRecords {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "frozen build: {} {} record(s) are not in the store (measure them with a build that may measure, on the \
             machine they are for, or import them: `tessera store export --stage tune --stage time-plans` there, \
             `tessera store import` here):",
            self.missing.len(),
            self.stage
        )?;
        for (i, m) in self.missing.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "  {m}")?;
        }
        Ok(())
    }
}

impl std::error::Error for MissingRecords {}

/// Measures candidates, each with its device's schedule ([`MeasureOptions::for_device`]).
pub fn measure_candidates(ctx: &Ctx, g: &Graph, cands: &[(Target, Vec<NodeId>)]) -> Result<Vec<CandidateCost>> {
    measure_all(ctx, g, cands, None, ConfigScope::All)
}

/// Measures candidates in `scope`, each with its device's schedule.
pub fn measure_candidates_in(ctx: &Ctx, g: &Graph, cands: &[(Target, Vec<NodeId>)], scope: ConfigScope) -> Result<Vec<CandidateCost>> {
    measure_all(ctx, g, cands, None, scope)
}

/// Measures candidates, every one with the schedule `opts`.
pub fn measure_candidates_with(ctx: &Ctx, g: &Graph, cands: &[(Target, Vec<NodeId>)], opts: &MeasureOptions) -> Result<Vec<CandidateCost>> {
    measure_all(ctx, g, cands, Some(opts), ConfigScope::All)
}

/// One candidate after its key is known.
struct Keyed<'a> {
    target: &'a Target,
    backend: &'a dyn Backend,
    kernel: Digest,
    /// The tune key's ingredients, and the key they hash to.
    params: TuneKeyParams,
    key: Digest,
    /// Whether it can be measured here (else: analytical).
    measurable: bool,
    /// Its measurement schedule.
    opts: MeasureOptions,
    /// The backend's default configuration on its target.
    default_config: String,
}

/// A missed kernel, to lower and compile.
struct Miss<'a> {
    key: Digest,
    target: &'a Target,
    backend: &'a dyn Backend,
    kernel_graph: Graph,
    kernel: Digest,
    /// The configurations to measure (`Backend::configs_for`), the default first.
    configs: Vec<String>,
}

impl<'a> Miss<'a> {
    fn new(key: Digest, target: &'a Target, backend: &'a dyn Backend, kernel_graph: Graph, kernel: Digest, default_only: bool) -> Result<Miss<'a>> {
        let mut configs = configs_to_measure(backend, target, &kernel_graph)?;
        if default_only {
            configs.truncate(1);
        }
        Ok(Miss { key, target, backend, kernel_graph, kernel, configs })
    }
}

/// The configurations of `kernel` the tune stage measures on `target`: the backend's (`Backend::configs_for`,
/// the default first), each checked to be in its tunable set, at most the target's budget
/// (`-tune-configs`; the budget is in the tune key through the target's digest).
pub fn configs_to_measure(backend: &dyn Backend, target: &Target, kernel: &Graph) -> Result<Vec<String>> {
    let mut configs = backend.configs_for(target, kernel);
    let all = backend.configs(target);
    if let Some(c) = configs.iter().find(|c| !all.names().any(|n| n == c.as_str())) {
        bail!("backend {}: configuration '{c}' is not in its tunable set for {target}", backend.name());
    }
    if configs.is_empty() {
        bail!("backend {}: no configuration to measure on {target}", backend.name());
    }
    if let Some(budget) = target.tune_budget() {
        configs.truncate(budget);
    }
    Ok(configs)
}

/// A missed kernel after its module is built.
enum Prepared {
    Ready { module: usize, index: usize, info: FunctionInfo, int_bounds: Vec<i64> },
    Refused(String),
}

/// Built modules and, per tune key, where each configuration's function is (in the miss's order).
#[derive(Default)]
struct Batch {
    /// Compiled, not loaded: each measuring thread loads the modules it measures on its own GPU
    /// ([`Loaded`]).
    modules: Vec<crate::backend::Module>,
    kernels: BTreeMap<Digest, Vec<(String, Prepared)>>,
}

/// One measuring thread's modules, loaded where it measures (its GPU, or the host) when first needed, by
/// (batch, module of the batch). A thread of its own, so the lock is never contended: it only makes the
/// loaded modules shareable with the tune stage's compute closure.
struct Loaded {
    modules: std::sync::Mutex<LoadedModules>,
    /// Time spent loading them, in microseconds (reported with the measurements).
    load_micros: std::sync::atomic::AtomicU64,
}

/// Loaded modules by (batch, module of the batch).
type LoadedModules = BTreeMap<(usize, usize), Box<dyn LoadedModule>>;

impl Loaded {
    fn new() -> Loaded {
        Loaded { modules: Default::default(), load_micros: Default::default() }
    }

    /// Runs `f` on the loaded modules after loading those of `preps` (of batch `batch`, whose modules are
    /// `modules`) not loaded yet.
    fn with<R>(&self, ctx: &Ctx, batch: usize, modules: &[crate::backend::Module], preps: &[(String, Prepared)], f: impl FnOnce(&LoadedModules) -> Result<R>) -> Result<R> {
        let mut loaded = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        for (_, prep) in preps {
            if let Prepared::Ready { module, .. } = prep {
                if !loaded.contains_key(&(batch, *module)) {
                    let m = &modules[*module];
                    let started = std::time::Instant::now();
                    let l = ctx.runtime.load(m).map_err(|e| anyhow!("target {}: loading a tune module: {e}", m.target))?;
                    loaded.insert((batch, *module), l);
                    self.load_micros.fetch_add(started.elapsed().as_micros() as u64, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        f(&loaded)
    }
}

/// Measures candidates (see the module documentation), with `opts` or each device's schedule; costs come
/// back in `cands` order.
fn measure_all(ctx: &Ctx, g: &Graph, cands: &[(Target, Vec<NodeId>)], opts: Option<&MeasureOptions>, scope: ConfigScope) -> Result<Vec<CandidateCost>> {
    // Keys and misses: CPU work (a signature per candidate), under `busy` so that no measurement of another
    // model's kernels runs beside it; released before `prepare`, which takes it per compile.
    let busy = crate::device::busy();
    let mut planned = Vec::with_capacity(cands.len());
    for (i, (target, nodes)) in cands.iter().enumerate() {
        let what = || format!("candidate {i} ({target}, nodes {nodes:?})");
        if nodes.is_empty() {
            bail!("{}: no nodes", what());
        }
        if let Some(n) = nodes.iter().find(|n| n.index() >= g.nodes.len()) {
            bail!("{}: node {} is not in graph {} ({} nodes)", what(), n.0, g.name, g.nodes.len());
        }
        let backend = ctx.backend(target).with_context(what)?;
        let kernel = kernel_signature(g, nodes, backend.inline_const_max()).digest;
        let opts = opts.copied().unwrap_or_else(|| MeasureOptions::for_device(target.device()));
        let params = TuneKeyParams::new(kernel, target, backend, &opts).scoped(scope, backend, target);
        // A build from records measures nothing, so it needs only the device's fingerprint (an assumed GPU's
        // on a machine without it), not a backend that can run here.
        let measurable = params.device.is_some() && (ctx.costs.frozen() || backend.available().is_ok());
        let key = params.key()?;
        planned.push(Keyed { target, backend, kernel, params, key, measurable, opts, default_config: backend.default_config(target) });
    }

    // Misses, one per key, grouped by target (the store is only peeked at: the memo calls below count).
    let store = ctx.driver.store();
    let mut misses: BTreeMap<&Target, Vec<Miss>> = BTreeMap::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut missing = Vec::new();
    for (p, (_, nodes)) in planned.iter().zip(cands) {
        if !seen.insert(p.key) {
            continue;
        }
        if !p.measurable {
            // A frozen build never estimates: a candidate whose device has no fingerprint here (a GPU target
            // on a machine without that GPU, and no --measured-on) has no record to be found by.
            if ctx.costs.frozen() {
                let ops: Vec<&str> = nodes.iter().map(|&n| g.node(n).op.name()).collect();
                missing.push(format!(
                    "target {}, kernel {} ({} in graph {}): no {} device here to find its record by (give the fingerprint of the machine that measured it: --measured-on FILE, from `tessera targets --gpu-fingerprint` there)",
                    p.target,
                    p.kernel,
                    ops.join("+"),
                    g.name,
                    p.target.device()
                ));
            }
            continue;
        }
        let recorded = store.memo_lookup(Tune::NAME, &p.key)?.is_some_and(|e| store.contains(&e.output));
        if !recorded && ctx.costs.frozen() {
            let ops: Vec<&str> = nodes.iter().map(|&n| g.node(n).op.name()).collect();
            missing.push(format!("target {}, kernel {} ({} in graph {}): tune key {}", p.target, p.kernel, ops.join("+"), g.name, p.key));
        } else if !recorded {
            let sig = kernel_signature(g, nodes, p.backend.inline_const_max());
            let kernel_graph = extract_subgraph(g, &sig);
            misses.entry(p.target).or_default().push(Miss::new(p.key, p.target, p.backend, kernel_graph, p.kernel, p.params.default_only)?);
        }
    }

    drop(busy);
    if !missing.is_empty() {
        return Err(MissingRecords { stage: Tune::NAME, missing }.into());
    }

    // Lower and compile every target's misses, targets in parallel; each target's missed GPU kernels are
    // measured as soon as its batch is built, on every measuring GPU at once (a thread per GPU taking kernels
    // as they come), while the other targets still compile. The rest (records to read, the odd kernel gone
    // since it was looked up, host kernels) is measured on this thread once every batch is built, so no
    // compile of ours shares the cores with a host measurement.
    let targets: Vec<(&Target, Vec<Miss>)> = misses.into_iter().collect();
    let batch_of: BTreeMap<Digest, usize> = targets.iter().enumerate().flat_map(|(b, (_, ms))| ms.iter().map(move |m| (m.key, b))).collect();
    let batches: Vec<std::sync::OnceLock<Batch>> = targets.iter().map(|_| std::sync::OnceLock::new()).collect();
    let record_of = |p: &Keyed, nodes: &[NodeId], loaded: &Loaded| -> Result<TuneRecord> {
        let measure = || -> Result<TuneRecord> {
            let built = batch_of.get(&p.key).and_then(|&b| batches[b].get().and_then(|batch| batch.kernels.get(&p.key).map(|prep| (b, batch, prep))));
            let outcome = match built {
                Some((b, batch, prep)) => loaded.with(ctx, b, &batch.modules, prep, |m| run_prepared(m, b, prep, &p.opts, p.target))?,
                None if ctx.costs.frozen() => {
                    return Err(MissingRecords { stage: Tune::NAME, missing: vec![format!("target {}, kernel {}: tune key {} (gone since it was looked up)", p.target, p.kernel, p.key)] }.into())
                }
                None => {
                    // Recorded when peeked at, gone since (gc), or a race: build this one alone.
                    let sig = kernel_signature(g, nodes, p.backend.inline_const_max());
                    let miss = Miss::new(p.key, p.target, p.backend, extract_subgraph(g, &sig), p.kernel, p.params.default_only)?;
                    let alone = prepare(ctx, std::slice::from_ref(&miss))?;
                    let prep = &alone.kernels[&p.key];
                    Loaded::new().with(ctx, 0, &alone.modules, prep, |m| run_prepared(m, 0, prep, &p.opts, p.target))?
                }
            };
            Ok(TuneRecord { kernel: p.kernel, target: p.target.canonical(), backend: p.backend.name().to_string(), outcome })
        };
        let (_, record) = run(ctx.driver, &Tune { params: &p.params, measure: &measure })?;
        if record.kernel != p.kernel {
            bail!("tune record {} is for kernel {}, expected {}", p.key, record.kernel, p.kernel);
        }
        Ok(record)
    };
    let mut firsts: BTreeMap<Digest, usize> = BTreeMap::new();
    for (i, p) in planned.iter().enumerate() {
        if p.measurable {
            firsts.entry(p.key).or_insert(i);
        }
    }
    let (on_gpus, mut here): (Vec<usize>, Vec<usize>) =
        firsts.values().copied().partition(|&i| planned[i].target.device() == "cuda" && batch_of.contains_key(&planned[i].key));
    let mut gpu_items_of: Vec<Vec<usize>> = vec![Vec::new(); targets.len()];
    for &i in &on_gpus {
        gpu_items_of[batch_of[&planned[i].key]].push(i);
    }
    let prepare_all = |send: &(dyn Fn(usize) + Sync)| -> Result<()> {
        (0..targets.len()).into_par_iter().try_for_each(|b| {
            let batch = prepare(ctx, &targets[b].1)?;
            // Set once: `b` is this closure's alone.
            let _ = batches[b].set(batch);
            gpu_items_of[b].iter().for_each(|&i| send(i));
            Ok(())
        })
    };
    let mut records: BTreeMap<Digest, TuneRecord> = BTreeMap::new();
    if on_gpus.is_empty() {
        prepare_all(&|_| {})?;
    } else {
        let gpus = crate::device::measuring_gpus(ctx.gpus.as_deref()).map_err(|e| anyhow!("measuring on the GPU: {e}"))?;
        let measured = on_every_gpu(&gpus, on_gpus.len(), prepare_all, |i, loaded| record_of(&planned[i], &cands[i].1, loaded))?;
        records.extend(measured.into_iter().map(|(i, r)| (planned[i].key, r)));
    }
    let loaded_here = Loaded::new();
    here.sort_unstable();
    for i in here {
        records.insert(planned[i].key, record_of(&planned[i], &cands[i].1, &loaded_here)?);
    }

    let mut out = Vec::with_capacity(cands.len());
    for (p, (_, nodes)) in planned.iter().zip(cands) {
        if !p.measurable {
            out.push(CandidateCost {
                us: p.backend.estimate_us(g, nodes, p.target),
                source: CostSource::Analytical,
                key: p.key,
                error: None,
                measurement: None,
                config: p.default_config.clone(),
            });
            continue;
        }
        let record = records.get(&p.key).with_context(|| format!("tune {}: no record made", p.key))?;
        out.push(match &record.outcome {
            TuneOutcome::Measured { best, measurements } => {
                let m = measurements
                    .iter()
                    .find(|(c, _)| c == best)
                    .map(|(_, m)| *m)
                    .with_context(|| format!("tune record {}: best config '{best}' has no measurement", p.key))?;
                // The search uses the median (robust to the odd preemption; validation measures whole plans
                // the same way). The record keeps every figure.
                CandidateCost { us: m.median_us, source: CostSource::Measured, key: p.key, error: None, measurement: Some(m), config: best.clone() }
            }
            TuneOutcome::Unsupported { error } => CandidateCost {
                us: f64::INFINITY,
                source: CostSource::Unsupported,
                key: p.key,
                error: Some(error.clone()),
                measurement: None,
                config: p.default_config.clone(),
            },
        });
    }
    Ok(out)
}

/// Kernels the tune stage sent to each GPU to measure, in this process (see [`measured_by_gpu`]).
static MEASURED_BY_GPU: std::sync::Mutex<BTreeMap<usize, usize>> = std::sync::Mutex::new(BTreeMap::new());

/// How many kernels the tune stage has sent to each GPU (by index) to measure in this process so far:
/// for reports and tests of multi-GPU tuning.
pub fn measured_by_gpu() -> BTreeMap<usize, usize> {
    MEASURED_BY_GPU.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Runs `work(item, loaded)` on the GPUs `gpus` at once for each of the `count` items `feed` sends (it runs on
/// this thread, and may send from any thread): a thread per GPU (the GPU current on it,
/// [`tessera_kernels::runtime::cuda::device::on`]), each taking the next item sent as it finishes one, with
/// the modules it loads on its GPU ([`Loaded`]). Results come back in item order; an error (the first by
/// item, or `feed`'s) stops the rest.
fn on_every_gpu<R: Send>(
    gpus: &[usize],
    count: usize,
    feed: impl FnOnce(&(dyn Fn(usize) + Sync)) -> Result<()>,
    work: impl Fn(usize, &Loaded) -> Result<R> + Sync,
) -> Result<Vec<(usize, R)>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tessera_kernels::runtime::cuda::device;
    let started = std::time::Instant::now();
    let profile_before = tessera_kernels::runtime::cuda::measure::profile();
    let (send, received) = std::sync::mpsc::channel::<usize>();
    let received = std::sync::Mutex::new(received);
    let failed = AtomicBool::new(false);
    let loading = std::sync::atomic::AtomicU64::new(0);
    let threads = gpus.len().min(count).max(1);
    let (fed, per_gpu): (Result<()>, Vec<Vec<(usize, Result<R>)>>) = std::thread::scope(|s| {
        let handles: Vec<_> = gpus[..threads]
            .iter()
            .map(|&gpu| {
                let (received, failed, work, loading) = (&received, &failed, &work, &loading);
                s.spawn(move || {
                    device::on(gpu, || {
                        let loaded = Loaded::new();
                        let mut done = Vec::new();
                        while !failed.load(Ordering::Relaxed) {
                            // Waits for the next item; none once `feed` is done and every item is taken.
                            let next = received.lock().unwrap_or_else(|p| p.into_inner()).recv();
                            let Ok(item) = next else { break };
                            let r = work(item, &loaded);
                            if r.is_err() {
                                failed.store(true, Ordering::Relaxed);
                            }
                            done.push((item, r));
                        }
                        loading.fetch_add(loaded.load_micros.into_inner(), Ordering::Relaxed);
                        done
                    })
                })
            })
            .collect();
        let fed = feed(&|item| {
            // Fails only once every GPU thread has stopped (after an error), which the result reports.
            let _ = send.send(item);
        });
        if fed.is_err() {
            failed.store(true, Ordering::Relaxed);
        }
        drop(send);
        (fed, handles.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect())
    });
    fed?;
    let counts: Vec<String> = gpus[..threads].iter().zip(&per_gpu).map(|(g, d)| format!("GPU {g}: {}", d.len())).collect();
    {
        let mut by_gpu = MEASURED_BY_GPU.lock().unwrap_or_else(|p| p.into_inner());
        for (g, d) in gpus[..threads].iter().zip(&per_gpu) {
            *by_gpu.entry(*g).or_default() += d.len();
        }
    }
    let loading_seconds = loading.into_inner() as f64 / 1e6;
    // Where the measuring threads' time went, summed over them (the rest of `seconds` times GPUs: waiting for
    // kernels still compiling, drawing inputs, the store).
    let p = tessera_kernels::runtime::cuda::measure::profile().since(&profile_before);
    let s = |us: u64| us as f64 / 1e6;
    tracing::info!(
        target: "tessera::tune",
        kernels = count,
        functions = p.functions,
        loading_seconds,
        setup_seconds = s(p.setup_us),
        launches_seconds = s(p.launches_us),
        capture_seconds = s(p.capture_us),
        timing_seconds = s(p.timing_us),
        seconds = started.elapsed().as_secs_f64(),
        "tune: {} kernels measured on {} GPU(s) ({})",
        count,
        threads,
        counts.join(", ")
    );
    let mut all: Vec<(usize, Result<R>)> = per_gpu.into_iter().flatten().collect();
    all.sort_by_key(|(item, _)| *item);
    all.into_iter().map(|(item, r)| r.map(|r| (item, r))).collect()
}

/// Measures every configuration of one prepared kernel, each under the device lock, and keeps the fastest by
/// median (the first of equals: the default comes first). A configuration whose lowering or compile was
/// refused, or that the GPU refuses before running (a library algorithm needing more workspace than planned,
/// a heuristic rank the library does not offer), is left out; when all are, the kernel is unsupported, with
/// the first one's reason.
fn run_prepared(modules: &LoadedModules, batch: usize, preps: &[(String, Prepared)], opts: &MeasureOptions, target: &Target) -> Result<TuneOutcome> {
    let mut measurements: Vec<(String, Measurement)> = Vec::new();
    let mut first_error: Option<String> = None;
    // The configurations of a kernel take the same inputs (drawn once: the draw of a large weight costs more
    // than a measurement of it on the GPU).
    let mut drawn: Option<(&[tessera_kernels::tensor::TensorType], &[i64], Vec<Tensor>)> = None;
    for (config, prep) in preps {
        let refused = match prep {
            Prepared::Refused(error) => Some(error.clone()),
            Prepared::Ready { module, index, info, int_bounds } => {
                if !drawn.as_ref().is_some_and(|(types, bounds, _)| *types == info.inputs.as_slice() && *bounds == int_bounds.as_slice()) {
                    let inputs = info.inputs.iter().enumerate().map(|(i, ty)| random_tensor(ty, INPUT_SEED, i as u64, int_bounds[i])).collect();
                    drawn = Some((&info.inputs, int_bounds, inputs));
                }
                let inputs = &drawn.as_ref().expect("drawn above").2;
                let module = modules.get(&(batch, *module)).map(|m| m.as_ref()).context("a tune module measured before it was loaded")?;
                // GPU modules are timed on the GPU (CUDA events over a captured graph), host modules on the CPU.
                match exclusively(target.device(), || match module.gpu() {
                    Some(_) => measure_gpu_function(module, *index, info, inputs, opts),
                    None => measure_function(module, *index, info, inputs, opts).map_err(GpuMeasureError::Failed),
                }) {
                    Ok(m) => {
                        measurements.push((config.clone(), m));
                        None
                    }
                    Err(GpuMeasureError::Refused(error)) => Some(error),
                    Err(GpuMeasureError::Failed(e)) => bail!("target {target}, configuration '{config}': {e}"),
                }
            }
        };
        if let Some(e) = refused {
            let e = if preps.len() > 1 { format!("configuration '{config}': {e}") } else { e };
            first_error.get_or_insert(e);
        }
    }
    let best = measurements.iter().fold(None::<&(String, Measurement)>, |best, m| match best {
        Some(b) if b.1.median_us <= m.1.median_us => Some(b),
        _ => Some(m),
    });
    Ok(match best {
        Some((best, _)) => TuneOutcome::Measured { best: best.clone(), measurements },
        None => TuneOutcome::Unsupported { error: first_error.unwrap_or_else(|| "no configuration to measure".into()) },
    })
}

/// Lowers (memoized, shared with the compile path) and compiles one target's missed kernels into a module
/// per core; if one fails, each of its kernels alone, so one bad kernel costs only itself.
fn prepare(ctx: &Ctx, misses: &[Miss]) -> Result<Batch> {
    // Every configuration of every miss, each lowered to its own function.
    let jobs: Vec<(&Miss, &str, usize)> = misses.iter().flat_map(|m| m.configs.iter().enumerate().map(move |(i, c)| (m, c.as_str(), i))).collect();
    /// A tune key, the configuration's slot, its lowering (or why it was refused), its inputs' int bounds.
    type Lowered = (Digest, usize, std::result::Result<LoweredKernel, String>, Vec<i64>);
    let lowered: Vec<Lowered> = jobs
        .par_iter()
        .map(|&(m, config, i)| Ok((m.key, i, lower(ctx, m, config)?, int_input_bounds(&m.kernel_graph))))
        .collect::<Result<_>>()?;
    let mut batch = Batch::default();
    let Some(first) = misses.first() else { return Ok(batch) };
    let (target, backend) = (first.target, first.backend);
    // Slots in each miss's configuration order, filled below.
    let mut slots: BTreeMap<Digest, Vec<Option<Prepared>>> = misses.iter().map(|m| (m.key, m.configs.iter().map(|_| None).collect())).collect();
    let mut ok: Vec<(Digest, usize, LoweredKernel, Vec<i64>)> = Vec::new();
    for (key, i, l, bounds) in lowered {
        match l {
            Ok(lk) => ok.push((key, i, lk, bounds)),
            Err(e) => slots.get_mut(&key).expect("a miss's key")[i] = Some(Prepared::Refused(e)),
        }
    }
    let finish = |mut batch: Batch, slots: BTreeMap<Digest, Vec<Option<Prepared>>>| -> Result<Batch> {
        let mut slots = slots;
        for m in misses {
            let Some(row) = slots.remove(&m.key) else { continue };
            let row: Vec<(String, Prepared)> = m
                .configs
                .iter()
                .cloned()
                .zip(row)
                .map(|(c, p)| p.map(|p| (c, p)).with_context(|| format!("tune {}: a configuration was neither built nor refused", m.key)))
                .collect::<Result<_>>()?;
            batch.kernels.insert(m.key, row);
        }
        Ok(batch)
    };
    if ok.is_empty() {
        return finish(batch, slots);
    }
    // One module per core's share of the kernels, compiled in parallel (C and NVRTC compiles are
    // single-threaded and partition stages run one model at a time, so this is where the cores are used); a
    // module that fails to compile is retried kernel by kernel. A missing toolchain is no kernel's fault: it is
    // reported, never recorded as a refusal. (A module per kernel, for better balance, was measured on the
    // H200 on 2026-11-27: BERT-base b8's cold compile 22.1 -> 20.8 s, but ResNet-50 b1's 31.0 -> 55.2 s.)
    let lks: Vec<LoweredKernel> = ok.iter().map(|(_, _, lk, _)| lk.clone()).collect();
    let chunk = lks.len().div_ceil(rayon::current_num_threads().max(1));
    let chunks: Vec<Vec<usize>> = (0..lks.len()).collect::<Vec<_>>().chunks(chunk.max(1)).map(|c| c.to_vec()).collect();
    let compile = |members: &[usize]| {
        let _busy = crate::device::busy();
        let group: Vec<LoweredKernel> = members.iter().map(|&i| lks[i].clone()).collect();
        backend.compile_module(target, &group)
    };
    let started = std::time::Instant::now();
    let groups: Vec<(Vec<usize>, std::result::Result<crate::backend::Module, BackendError>)> = chunks
        .par_iter()
        .flat_map_iter(|members| match compile(members) {
            Ok(m) => vec![(members.clone(), Ok(m))],
            Err(e) if members.len() == 1 || matches!(e, BackendError::Toolchain { .. }) => vec![(members.clone(), Err(e))],
            Err(_) => members.iter().map(|&i| (vec![i], compile(&[i]))).collect(),
        })
        .collect();
    tracing::debug!(target: "tessera::tune", "tune: {} kernels for {target} compiled as {} modules in {:.2} s", lks.len(), groups.len(), started.elapsed().as_secs_f64());
    for (members, module) in groups {
        let module = match module {
            Ok(m) => m,
            Err(e @ BackendError::Toolchain { .. }) => return Err(anyhow::Error::new(e).context(format!("target {target}: compiling kernels to measure"))),
            Err(e) => {
                for i in members {
                    slots.get_mut(&ok[i].0).expect("a miss's key")[ok[i].1] = Some(Prepared::Refused(format!("compile failed: {e}")));
                }
                continue;
            }
        };
        let mi = batch.modules.len();
        for i in members {
            let (key, slot, lk, bounds) = &ok[i];
            let index = module
                .functions
                .iter()
                .position(|f| f.symbol == lk.info.symbol)
                .with_context(|| format!("target {target}: the compiled module has no function {}", lk.info.symbol))?;
            slots.get_mut(key).expect("a miss's key")[*slot] = Some(Prepared::Ready { module: mi, index, info: lk.info.clone(), int_bounds: bounds.clone() });
        }
        batch.modules.push(module);
    }
    finish(batch, slots)
}

/// Lowers one kernel through the lower stage (the compile path's, so it is lowered once). `Err(text)` when
/// the backend refuses it ([`BackendError::Unsupported`], also when another caller of the key ran it); any
/// other failure (a backend's invalid request or internal error, the store) is an error.
fn lower(ctx: &Ctx, m: &Miss, config: &str) -> Result<std::result::Result<LoweredKernel, String>> {
    let symbol = symbol_in(m.backend, m.target, &m.kernel, config);
    let graph = || Ok(m.kernel_graph.clone());
    let stage = Lower { kernel: m.kernel, target: m.target, backend: m.backend, graph: &graph, symbol: &symbol, config };
    match run(ctx.driver, &stage) {
        Ok((_, lk)) => Ok(Ok(lk)),
        Err(e) => match cause::<BackendError>(&e) {
            Some(refused @ BackendError::Unsupported { .. }) => Ok(Err(refused.to_string())),
            _ => Err(e),
        },
    }
}

/// The function name of `kernel` lowered in `config`: the kernel's symbol for the backend's default, else
/// [`config_symbol`] (so every configuration of a kernel can share one module).
pub fn symbol_in(backend: &dyn Backend, target: &Target, kernel: &Digest, config: &str) -> String {
    if config == backend.default_config(target) {
        kernel_symbol(kernel)
    } else {
        config_symbol(kernel, config)
    }
}

/// Stage: tune one candidate kernel (see the module documentation); its key is [`TuneKeyParams::key`].
/// Stage: measure one kernel on one target. Its key ingredients are [`TuneKeyParams`]; the measuring closure
/// is the means (the kernel prepared in its target's batch, or prepared alone), not an ingredient.
pub(crate) struct Tune<'a> {
    params: &'a TuneKeyParams,
    /// The one compute body: measure the prepared kernel (or prepare it alone).
    measure: &'a (dyn Fn() -> Result<TuneRecord> + Sync),
}

impl Stage for Tune<'_> {
    const NAME: &'static str = "tune";
    // Compiles under `busy` and measures under `exclusively` itself.
    const DEVICE: DevicePolicy = DevicePolicy::Own;
    type Output = TuneRecord;
    fn version(&self) -> crate::code::CodeVersion {
        code_version()
    }
    fn key(&self) -> Result<Digest> {
        self.params.key()
    }
    fn compute(&self) -> Result<TuneRecord> {
        (self.measure)()
    }
}

#[cfg(test)]
#[path = "tune_tests.rs"]
mod tests;
