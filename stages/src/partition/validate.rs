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

use super::plan::{ExecPlan, Trial, Validation};
use super::select::{plan_for, CostedCandidates, Selection};
use crate::artifact::build_artifact;
use crate::backend::BackendError;
use crate::context::Ctx;
use crate::device::exclusively;
use anyhow::{Context, Result};
use tessera_kernels::artifact::Artifact;
use crate::ir::Graph;
use crate::link::LinkError;
use crate::stage::{cause, run, DevicePolicy, Stage};
use crate::tune::MissingRecords;
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

/// The constants above, as the partition key records them (a change re-plans).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Constants {
    pub margin: f64,
    pub skip_factor: f64,
    /// (warmup, min_runs, max_runs, budget_us) of [`BLOCK`].
    pub block: (usize, usize, usize, f64),
}

/// The validation's constants (a partition key ingredient).
pub fn constants() -> Constants {
    Constants { margin: MARGIN, skip_factor: SKIP_FACTOR, block: (BLOCK.warmup, BLOCK.min_runs, BLOCK.max_runs, BLOCK.budget_us) }
}

/// Seed of the random model inputs (the tune stage's, so kernels and models see the same kind of data).
const INPUT_SEED: u64 = crate::tune::INPUT_SEED;

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
            crate::tune::device_fingerprint(t).is_some()
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
        let mut artifacts: Vec<(usize, Digest)> = Vec::new();
        // The plans build at once, each on a thread of its own: their modules' compiles (NVRTC programs, one
        // plan's after another's) were a third of a cold ViT-B/16 compile (bench/compile.md, session 36).
        // Plain threads, not rayon tasks: a rayon worker that waits for a module another plan's build is
        // compiling could take that build's own task and wait for itself.
        let (trials_now, plans_now) = (&trials, &plans);
        let built: Vec<Result<crate::artifact::BuiltArtifact>> = std::thread::scope(|s| {
            let handles: Vec<_> = to_measure.iter().map(|&i| s.spawn(move || build_artifact(ctx, &trials_now[i].plan, &plans_now[i].1, &|| Ok(g)))).collect();
            handles.into_iter().map(|h| h.join().expect("a plan's build does not panic")).collect()
        });
        for (&i, built) in to_measure.iter().zip(built) {
            let label = &plans[i].0;
            match built {
                Ok(b) => artifacts.push((i, b.artifact)),
                // The searched plan must build (the compile that follows would fail anyway); an alternative
                // that does not (a backend's or the linker's refusal) is only left out, and the report says
                // why. Anything else (the store, a decoding failure) is an error.
                Err(e) if i != 0 && is_plan_failure(&e) => trials[i].skipped = Some(format!("did not build: {e:#}")),
                Err(e) => return Err(e.context(format!("validation: building the '{label}' plan"))),
            }
        }
        if artifacts.len() > 1 {
            let labeled: Vec<(String, Digest)> = artifacts.iter().map(|(i, d)| (trials[*i].label.clone(), *d)).collect();
            let timed = time_plans(ctx, &labeled)?;
            for ((i, digest), [first, second]) in artifacts.iter().zip(timed) {
                trials[*i].artifact = Some(*digest);
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

/// Bump when what [`TimePlans`] records, or how it times, changes (2: keyed by [`timing_identity`], not by
/// the artifacts' digests).
pub const TIME_PLANS_VERSION: u32 = 2;

/// What an artifact's end-to-end time depends on: every plan of it (steps, modules, buffers, constants'
/// types and places) but not its constants' values, which the body names by digest. A model whose weights
/// changed and nothing else (issue 28: a fine-tuned checkpoint, the same graph) links artifacts of other
/// digests with the same identity, and validation takes the timings recorded for them instead of timing
/// again. Kernels run the same time on any values of the same shapes: the tune stage measures every kernel
/// on random inputs for the same reason. A constant small enough to be embedded in a kernel's code changes
/// that kernel's module, and so the identity.
pub fn timing_identity(a: &Artifact) -> Result<Digest> {
    let plans: Vec<tessera_kernels::artifact::Body> = (0..a.plan_count())
        .map(|i| {
            let mut body = a.plan(i).clone();
            for c in &mut body.constants {
                c.digest = [0; 32];
            }
            body
        })
        .collect();
    Ok(tessera_store::canonical_digest(&(a.batches(), &plans, a.data().len() as u64))?)
}

/// Stage: the end-to-end timings of validation's artifacts, in order ([`time_abba`]'s two passes, samples in
/// microseconds). Recorded apart from the plan so that a build from records (`CostMode::Recorded`, on a
/// machine that cannot time them) makes the measured build's choice: it builds the same artifacts, finds
/// their timings under the same key, and fails, listing them, where it does not.
pub struct TimePlans<'a> {
    pub ctx: &'a Ctx<'a>,
    /// The artifacts, read, in the order they are timed (the means: their identities are the key).
    pub artifacts: Vec<Artifact>,
    /// Their [`timing_identity`]s, which key the timings.
    pub identities: Vec<Digest>,
    /// The device fingerprint of every target (an assumed GPU's in a build from records).
    pub devices: Vec<Option<crate::device::DeviceFingerprint>>,
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
            .env("schedule", &(BLOCK.warmup, BLOCK.min_runs, BLOCK.max_runs, BLOCK.budget_us))
            .env("devices", &self.devices)
            .finish()?)
    }
    fn compute(&self) -> Result<Self::Output> {
        measure_plans(self.ctx, &self.artifacts)
    }
}

/// The timings of `artifacts` (label, digest): recorded, else measured; a build from records that lacks them
/// fails naming each one.
pub fn time_plans(ctx: &Ctx, artifacts: &[(String, Digest)]) -> Result<Vec<[Vec<f64>; 2]>> {
    let devices = ctx.targets.targets.iter().map(crate::tune::device_fingerprint).collect();
    let store = ctx.driver.store();
    // Read once: for the identities here and, on a miss, for timing.
    let read = artifacts
        .iter()
        .map(|(label, d)| Ok(Artifact::read_owned(store.get(d)?, &format!("'{label}' artifact {d}"))?))
        .collect::<Result<Vec<_>>>()?;
    let identities = read.iter().map(timing_identity).collect::<Result<Vec<_>>>()?;
    let stage = TimePlans { ctx, artifacts: read, identities, devices };
    if ctx.costs.frozen() {
        let key = stage.key()?;
        if !store.memo_lookup(TimePlans::NAME, &key)?.is_some_and(|e| store.contains(&e.output)) {
            let plans: Vec<String> = artifacts.iter().map(|(label, d)| format!("'{label}' artifact {d}")).collect();
            let missing = vec![format!("validation timings of {}: time-plans key {key}", plans.join(", "))];
            return Err(MissingRecords { stage: TimePlans::NAME, missing }.into());
        }
    }
    Ok(run(ctx.driver, &stage)?.1)
}

/// Loads every artifact, then, with the CPU to ourselves, times them in two passes ([`time_abba`]). Returns
/// each artifact's samples in microseconds.
fn measure_plans(ctx: &Ctx, artifacts: &[Artifact]) -> Result<Vec<[Vec<f64>; 2]>> {
    let mut runs: Vec<(Executable, Vec<crate::ir::Tensor>)> = Vec::with_capacity(artifacts.len());
    for a in artifacts {
        let inputs = a.random_inputs(INPUT_SEED);
        runs.push((Executable::load_with(a, ctx.runtime)?, inputs));
    }
    exclusively("cpu", move || time_abba(&mut runs, BLOCK)).map_err(anyhow::Error::from)
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;
