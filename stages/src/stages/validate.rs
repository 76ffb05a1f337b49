//! Validation: the searched plan measured end to end against the single-backend plans, the fastest kept.
//!
//! The search adds up candidates measured one at a time. On a real model the sum can be far off, and not by a
//! constant factor: a kernel measured alone runs on warm caches and on uniformly random inputs, while in the
//! model it follows other kernels (whose outputs evict its operands), switches thread pools on and off, and
//! sees real activations (until GELU was given a data-independent cost, the C backend's GELU cost twice as
//! much on BERT's activations as on uniform inputs: `tessera bench --profile` against `tessera explain`,
//! bench/collage.md). Where two plans' sums differ by
//! less than that error, the search's ranking is a coin toss, and a searched mix can lose to the plan that
//! simply gives every node to the best backend.
//!
//! So, with measured costs, the partition stage also builds the plans Collage compares against — each
//! backend preferred (its device's fallback running the rest) and each fallback alone — compiles them through
//! the same memoized stages (they share almost every kernel with the searched plan), and measures every
//! artifact end to end, in order then in reverse order, so drift on the machine hits all of them alike. The
//! searched plan is kept when its median beats every measured alternative by [`MARGIN`], overall and in
//! each pass; otherwise the fastest alternative is used. The margin is this machine's run-to-run noise on
//! whole models (the same two ResNet-18 builds measured 0.95x to 1.12x of each other in runs minutes apart
//! on the 2-vCPU CI-class VM), and it favours the alternative because that plan has fewer partitions and
//! crossings: of two plans within noise of each other, the simpler one. A fallback alone whose estimate is
//! more than [`SKIP_FACTOR`] times the best estimate is not built (the C backend alone on GPT-2 would cost
//! seconds to measure and cannot win); preferred-backend plans are always measured, estimates being what
//! is in doubt.
//!
//! Everything happens inside the partition stage, so its outcome is recorded with the plan (whose key holds
//! the device fingerprint and measurement settings): a rebuild measures nothing again. The report is the
//! plan's [`Validation`], shown by `tessera explain`.

use crate::partition::plan::{ExecPlan, Trial, Validation};
use crate::stages::select::{plan_for, CostedCandidates, Selection};
use crate::stages::artifact::{compile_plan, link_plan, CompiledPlan};
use crate::backend::BackendError;
use crate::context::Ctx;
use crate::device::exclusively;
use anyhow::{Context, Result};
use tessera_kernels::artifact::Artifact;
use crate::ir::Graph;
use crate::stages::link::LinkError;
use crate::stage::{cause, run, DevicePolicy, Stage};
use crate::stages::tune::MissingRecords;
use serde::Serialize;
use tessera_kernels::runtime::measure::{median, time_abba, Block};
use tessera_kernels::runtime::Executable;
use tessera_store::Digest;

/// The searched plan must beat every measured alternative's median by this fraction, overall and in each
/// pass, to be kept.
pub const MARGIN: f64 = 0.05;

/// A fallback-alone plan estimated at more than this many times the best estimate is not built or measured.
pub const SKIP_FACTOR: f64 = 2.0;

/// The end-to-end schedule, per plan and pass ([`time_abba`]: in order, then in reverse): 2 untimed runs,
/// then timed runs until at least 7 runs and 400 ms, at most 200 runs.
const BLOCK: Block = Block { warmup: 2, min_runs: 7, max_runs: 200, budget_us: 400_000.0 };

/// The schedule of plans that run on the GPU: a sample is one graph replay between CUDA events, whose spread
/// is far below [`MARGIN`] (no host thread to preempt), so 50 ms of replays per block decide what 400 ms of a
/// host plan's wall clock do. [`BLOCK`]'s budget made ResNet-50 b32's validation 1.6 s of replays.
const GPU_BLOCK: Block = Block { warmup: 2, min_runs: 10, max_runs: 200, budget_us: 50_000.0 };

/// The constants above, as the partition key records them (a change re-plans).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Constants {
    pub margin: f64,
    pub skip_factor: f64,
    /// (warmup, min_runs, max_runs, budget_us) of [`BLOCK`], then of [`GPU_BLOCK`].
    pub block: (usize, usize, usize, f64),
    pub gpu_block: (usize, usize, usize, f64),
}

/// The validation's constants (a partition key ingredient).
pub fn constants() -> Constants {
    let schedule = |b: Block| (b.warmup, b.min_runs, b.max_runs, b.budget_us);
    Constants { margin: MARGIN, skip_factor: SKIP_FACTOR, block: schedule(BLOCK), gpu_block: schedule(GPU_BLOCK) }
}

/// Seed of the random model inputs (the tune stage's, so kernels and models see the same kind of data).
const INPUT_SEED: u64 = crate::stages::tune::INPUT_SEED;

/// Whether the partition stage validates its searched plan in this context: measured costs, the searched
/// mix (not a baseline), more than one target, and every target on a device this build measures with an
/// available backend (a plan that cannot run here cannot be timed).
pub fn applies(ctx: &Ctx) -> bool {
    ctx.prefer.is_none() && ctx.targets.targets.len() > 1 && measures_end_to_end(ctx)
}

/// Whether whole artifacts for `ctx`'s targets are timed here (or, in a build from records, their timings are
/// recorded): measured costs and every target on a device this build measures with an available backend.
/// `-layout=auto` times its two layouts' artifacts under the same condition.
pub fn measures_end_to_end(ctx: &Ctx) -> bool {
    ctx.costs.measures()
        && ctx.targets.targets.iter().all(|t| {
            // A build from records times nothing: it needs the records, not a backend that runs here.
            crate::stages::tune::device_fingerprint(t).is_some()
                && ctx.backend(t).map(|b| ctx.costs.frozen() || b.available().is_ok()).unwrap_or(false)
        })
}

/// The reference plans of a target set, with their labels: each non-fallback backend preferred, then each
/// fallback alone (the configurations `tessera baselines` compares).
pub fn references(ctx: &Ctx) -> Vec<(String, Selection)> {
    let mut out = Vec::new();
    for t in ctx.targets.targets.iter().filter(|t| !t.is_least_specialized()) {
        out.push((t.backend_name().to_string(), Selection::Prefer(t.backend_name().to_string())));
    }
    for (i, t) in ctx.targets.targets.iter().enumerate().filter(|(_, t)| t.is_least_specialized()) {
        out.push((format!("{} alone", t.backend_name()), Selection::Only(i)));
    }
    out
}

/// Checks `searched` against the reference plans (see the module documentation) and returns the plan to
/// use, its [`Validation`] filled in.
pub fn validate(ctx: &Ctx, g: &Graph, costed: &CostedCandidates, searched: ExecPlan) -> Result<ExecPlan> {
    let mut plans: Vec<(String, ExecPlan)> = vec![("searched".to_string(), searched)];
    // Only a fallback alone may be left out for its estimate: preferred-backend plans are few and cheap to
    // build (their kernels were compiled for measurement already), and estimates are what is in doubt.
    let mut may_skip = vec![false];
    for (label, sel) in references(ctx) {
        let plan = plan_for(ctx, g, costed, &sel).with_context(|| format!("validation: the '{label}' plan"))?;
        may_skip.push(matches!(sel, Selection::Only(_)));
        plans.push((label, plan));
    }
    let best_estimate = plans.iter().map(|(_, p)| p.estimated_us()).fold(f64::INFINITY, f64::min);
    let mut trials: Vec<Trial> = Vec::with_capacity(plans.len());
    for (i, (label, plan)) in plans.iter().enumerate() {
        let same_as = plans[..i].iter().find(|(_, q)| q.same_placement(plan)).map(|(l, _)| l.clone());
        let skipped = match same_as {
            Some(l) => Some(format!("same placement as '{l}'")),
            None if may_skip[i] && plan.estimated_us() > SKIP_FACTOR * best_estimate => {
                Some(format!("estimate {:.0} us is over {SKIP_FACTOR}x the best estimate ({best_estimate:.0} us)", plan.estimated_us()))
            }
            None => None,
        };
        trials.push(Trial {
            label: label.clone(),
            partitions: plan.partitions.len(),
            plan: ctx.driver.store().put(&postcard::to_stdvec(plan)?)?,
            estimated_us: plan.estimated_us(),
            artifact: None,
            median_us: None,
            pass_medians_us: None,
            runs: 0,
            skipped,
        });
    }

    let to_measure: Vec<usize> = (0..trials.len()).filter(|&i| trials[i].skipped.is_none()).collect();
    if to_measure.len() > 1 {
        // The plans compile at once, each on a thread of its own: their modules' compiles (NVRTC programs, one
        // plan's after another's) were a third of a cold ViT-B/16 compile (bench/compile_times.md, 2026-11-28).
        // Plain threads, not rayon tasks: a rayon worker that waits for a module another plan's build is
        // compiling could take that build's own task and wait for itself.
        let (trials_now, plans_now) = (&trials, &plans);
        let compiled = at_once(&to_measure, |i| compile_plan(ctx, &trials_now[i].plan, &plans_now[i].1, &|| Ok(g)));
        let mut built: Vec<(usize, CompiledPlan)> = Vec::new();
        for (&i, c) in to_measure.iter().zip(compiled) {
            match c {
                Ok(c) => built.push((i, c)),
                Err(e) => skip_or_fail(&mut trials, i, &plans[i].0, e)?,
            }
        }
        // Linked only where their timings are not recorded: a model whose weights changed and nothing else
        // makes plans of the same identities, and links nothing here (each link copies every weight).
        let identities = built.iter().map(|(_, c)| timing_identity(&c.plan, &c.modules)).collect::<Result<Vec<_>>>()?;
        if built.len() > 1 && !timings_recorded(ctx, &identities)? {
            let which: Vec<usize> = (0..built.len()).collect();
            let built_now = &built;
            let linked = at_once(&which, |k| link_plan(ctx, &built_now[k].1));
            let mut kept = Vec::new();
            for ((i, c), l) in std::mem::take(&mut built).into_iter().zip(linked) {
                match l {
                    Ok(d) => {
                        trials[i].artifact = Some(d);
                        kept.push((i, c));
                    }
                    Err(e) => skip_or_fail(&mut trials, i, &plans[i].0, e)?,
                }
            }
            built = kept;
        }
        if built.len() > 1 {
            let labels: Vec<String> = built.iter().map(|(i, _)| trials[*i].label.clone()).collect();
            let identities = built.iter().map(|(_, c)| timing_identity(&c.plan, &c.modules)).collect::<Result<Vec<_>>>()?;
            let built_now = &built;
            let artifacts = || built_now.iter().map(|(_, c)| link_plan(ctx, c)).collect::<Result<Vec<_>>>();
            let timed = time_plans(ctx, &labels, identities, &artifacts)?;
            for ((i, _), [first, second]) in built.iter().zip(timed) {
                trials[*i].runs = (first.len() + second.len()) as u32;
                let all: Vec<f64> = first.iter().chain(&second).copied().collect();
                trials[*i].pass_medians_us = Some([median(&first), median(&second)]);
                trials[*i].median_us = Some(median(&all));
            }
        }
    }

    let chosen = choose(&trials);
    let validation = Validation { chosen: trials[chosen].label.clone(), margin: MARGIN, trials };
    let mut plan = plans.swap_remove(chosen).1;
    plan.validation = Some(validation);
    Ok(plan)
}

/// `work(i)` for each of `items`, each on a plain thread of its own, results in order.
fn at_once<R: Send>(items: &[usize], work: impl Fn(usize) -> Result<R> + Sync) -> Vec<Result<R>> {
    let work = &work;
    std::thread::scope(|s| {
        let handles: Vec<_> = items.iter().map(|&i| s.spawn(move || work(i))).collect();
        handles.into_iter().map(|h| h.join().expect("a plan's build does not panic")).collect()
    })
}

/// A trial plan that did not build: the searched plan must build (the compile that follows would fail
/// anyway); an alternative that does not (a backend's or the linker's refusal) is only left out, and the
/// report says why. Anything else (the store, a decoding failure) is an error.
fn skip_or_fail(trials: &mut [Trial], i: usize, label: &str, e: anyhow::Error) -> Result<()> {
    if i != 0 && is_plan_failure(&e) {
        trials[i].skipped = Some(format!("did not build: {e:#}"));
        Ok(())
    } else {
        Err(e.context(format!("validation: building the '{label}' plan")))
    }
}

/// Whether building a plan failed for the plan's own sake: a backend refused or failed on one of its
/// kernels ([`BackendError`], any variant), or the linker refused it ([`LinkError`]).
fn is_plan_failure(e: &anyhow::Error) -> bool {
    cause::<BackendError>(e).is_some() || cause::<LinkError>(e).is_some()
}

/// The trial to use: the searched plan (index 0) when it was measured and beats every measured alternative
/// by [`MARGIN`], on the overall median and on each pass's median (a plan only faster in one pass was
/// helped by drift); otherwise the fastest alternative (the first on a tie), or the searched plan when no
/// alternative was measured.
pub fn choose(trials: &[Trial]) -> usize {
    let Some(searched) = trials[0].median_us else { return 0 };
    let best_alt = trials
        .iter()
        .enumerate()
        .skip(1)
        .filter_map(|(i, t)| t.median_us.map(|m| (i, m)))
        .fold(None::<(usize, f64)>, |best, (i, m)| match best {
            Some((_, b)) if b <= m => best,
            _ => Some((i, m)),
        });
    let Some((alt_index, _)) = best_alt else { return 0 };
    let beats = |s: f64, a: f64| s <= (1.0 - MARGIN) * a;
    let clearly_faster = trials[1..].iter().filter(|t| t.median_us.is_some()).all(|t| {
        let overall = beats(searched, t.median_us.unwrap_or(f64::INFINITY));
        let passes = match (trials[0].pass_medians_us, t.pass_medians_us) {
            (Some(s), Some(a)) => beats(s[0], a[0]) && beats(s[1], a[1]),
            _ => true,
        };
        overall && passes
    });
    if clearly_faster { 0 } else { alt_index }
}

/// Bump when what [`TimePlans`] records, or how it times, changes (2: keyed by the artifacts' timing
/// identities, not their digests; 3: the identities are the plans' [`timing_identity`], known before a link).
pub const TIME_PLANS_VERSION: u32 = 3;

/// What the end-to-end time of a plan's artifact depends on, known before it is linked: everything the link
/// reads (`artifact::link_input`: the interface, the values, each constant's type, each step's target,
/// function and arguments, the modules by digest) and the link's code version and artifact format, but not
/// the constants' values. A model whose weights changed and nothing else (issue 28: a fine-tuned
/// checkpoint, the same graph) makes plans with the same identities, and validation takes the timings
/// recorded for them instead of linking and timing again. Kernels run the same time on any values of the
/// same shapes: the tune stage measures every kernel on random inputs for the same reason. A constant small
/// enough to be embedded in a kernel's code changes that kernel's module, and so the identity.
pub fn timing_identity(plan: &ExecPlan, modules: &[Digest]) -> Result<Digest> {
    let constants: Vec<_> = plan.constants.iter().map(|(_, ty)| ty).collect();
    let steps: Vec<_> = plan.partitions.iter().map(|p| (&p.target, &p.symbol, &p.args)).collect();
    Ok(tessera_store::canonical_digest(&(
        crate::stages::link::code_version(),
        tessera_kernels::artifact::FORMAT_VERSION,
        (&plan.model, &plan.inputs, &plan.input_int_bounds, &plan.outputs, &plan.values),
        constants,
        modules,
        steps,
    ))?)
}

/// Stage: the end-to-end timings of validation's artifacts, in order ([`time_abba`]'s two passes, samples in
/// microseconds). Recorded apart from the plan so that a build from records (`CostMode::Recorded`, on a
/// machine that cannot time them) makes the measured build's choice: it builds the same artifacts, finds
/// their timings under the same key, and fails, listing them, where it does not.
pub struct TimePlans<'a> {
    pub ctx: &'a Ctx<'a>,
    /// The means: the artifacts, in the order they are timed (linked when called, on a miss only).
    pub artifacts: &'a (dyn Fn() -> Result<Vec<Digest>> + Sync),
    /// Their plans' [`timing_identity`]s, which key the timings.
    pub identities: Vec<Digest>,
    /// The device fingerprint of every target (an assumed GPU's in a build from records).
    pub devices: Vec<Option<crate::fingerprint::DeviceFingerprint>>,
}

impl TimePlans<'_> {
    /// Each target's backend and its code version, in the targets' order.
    fn backend_versions(&self) -> Result<Vec<(&'static str, crate::code::CodeVersion)>> {
        self.ctx.targets.targets.iter().map(|t| self.ctx.backend(t).map(|b| (b.name(), b.version()))).collect()
    }
}

impl Stage for TimePlans<'_> {
    const NAME: &'static str = "time-plans";
    // Times under `exclusively` itself.
    const DEVICE: DevicePolicy = DevicePolicy::Own;
    type Output = Vec<[Vec<f64>; 2]>;
    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(TIME_PLANS_VERSION, &[crate::code::digests::PARTITION, crate::code::runtime_digests::RUNTIME])
    }
    fn key(&self) -> Result<Digest> {
        Ok(self
            .key_builder()
            .input("artifacts", &self.identities)
            // The artifacts run on the runtimes of their targets' backends, whose code units are in the
            // backends' versions (the shared part of the runtime is in this stage's version).
            .input("backends", &self.backend_versions()?)
            .input("input_seed", &INPUT_SEED)
            .env("schedule", &(constants().block, constants().gpu_block))
            .env("devices", &self.devices)
            .finish()?)
    }
    fn compute(&self) -> Result<Self::Output> {
        let store = self.ctx.driver.store();
        let read = (self.artifacts)()?
            .iter()
            .map(|d| Ok(Artifact::read_owned(store.get(d)?, &format!("artifact {d}"))?))
            .collect::<Result<Vec<_>>>()?;
        measure_plans(self.ctx, &read)
    }
}

/// The timings of the artifacts of plans with `identities` (labelled `labels` in errors): recorded, else
/// measured, on the artifacts `artifacts` gives (called on a miss only); a build from records that lacks
/// them fails naming each one.
pub fn time_plans(ctx: &Ctx, labels: &[String], identities: Vec<Digest>, artifacts: &(dyn Fn() -> Result<Vec<Digest>> + Sync)) -> Result<Vec<[Vec<f64>; 2]>> {
    let stage = time_plans_stage(ctx, identities, artifacts);
    if ctx.costs.frozen() {
        let key = stage.key()?;
        if !recorded(ctx, &key)? {
            let plans: Vec<String> = labels.iter().zip(&stage.identities).map(|(label, id)| format!("'{label}' plan (timing identity {id})")).collect();
            let missing = vec![format!("validation timings of {}: time-plans key {key}", plans.join(", "))];
            return Err(MissingRecords { stage: TimePlans::NAME, missing }.into());
        }
    }
    Ok(run(ctx.driver, &stage)?.1)
}

/// Whether the timings of plans with `identities` are recorded (here or on the remote tier): then
/// [`time_plans`] needs no artifact.
pub fn timings_recorded(ctx: &Ctx, identities: &[Digest]) -> Result<bool> {
    recorded(ctx, &time_plans_stage(ctx, identities.to_vec(), &|| Ok(Vec::new())).key()?)
}

fn time_plans_stage<'a>(ctx: &'a Ctx<'a>, identities: Vec<Digest>, artifacts: &'a (dyn Fn() -> Result<Vec<Digest>> + Sync)) -> TimePlans<'a> {
    let devices = ctx.targets.targets.iter().map(crate::stages::tune::device_fingerprint).collect();
    TimePlans { ctx, artifacts, identities, devices }
}

fn recorded(ctx: &Ctx, key: &Digest) -> Result<bool> {
    let store = ctx.driver.store();
    Ok(store.memo_lookup(TimePlans::NAME, key)?.is_some_and(|e| store.contains(&e.output)))
}

/// Loads every artifact, then, with the CPU to ourselves, times them in two passes ([`time_abba`]). Returns
/// each artifact's samples in microseconds.
fn measure_plans(ctx: &Ctx, artifacts: &[Artifact]) -> Result<Vec<[Vec<f64>; 2]>> {
    crate::gpu_facts::confirm(crate::device::live_gpu)?;
    let mut runs: Vec<(Executable, Vec<crate::ir::Tensor>)> = Vec::with_capacity(artifacts.len());
    for a in artifacts {
        let inputs = a.random_inputs(INPUT_SEED);
        runs.push((Executable::load_with(a, ctx.runtime)?, inputs));
    }
    let block = if runs.iter().all(|(exe, _)| exe.is_gpu()) { GPU_BLOCK } else { BLOCK };
    exclusively("cpu", move || time_abba(&mut runs, block)).map_err(anyhow::Error::from)
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
