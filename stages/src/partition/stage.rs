//! Stage 2, partition: Collage candidates, their costs (measured by the tune stage, or the backends'
//! estimates), the shortest-path search, the validation of the searched plan end to end
//! ([`super::validate`]), and the execution plan with each partition's runner-up.

use super::collage::{self, CrossingModel, Limits};
use super::plan::{build_plan, Alternative, ExecPlan, PLAN_VERSION};
use super::{check, PARTITIONER_VERSION};
use crate::context::{CostMode, CostSource, Ctx, LazyGraph};
use crate::ir::{Graph, NodeId, Tensor};
use crate::stage::{DevicePolicy, Stage};
use crate::target::Target;
use crate::tune::measure_candidates;
use anyhow::{bail, Result};
use serde::Serialize;
use tessera_kernels::runtime::measure::MeasureOptions;
use tessera_store::Digest;

/// The partition stage's code version: [`PLAN_VERSION`] with the digest of the partitioner's source.
pub fn code_version() -> crate::code::CodeVersion {
    crate::code::CodeVersion::new(PLAN_VERSION, &[crate::code::digests::PARTITION])
}

/// Stage: partition one model's graph for the run's targets. Output: the execution plan.
///
/// With measured costs the plan depends on the machine: the tune stage's version, the fingerprint of every
/// target's device, the measurement schedule and the validation's constants are key ingredients too.
pub struct Partition<'a> {
    pub ctx: &'a Ctx<'a>,
    /// The graph document's digest (the load stage's output).
    pub graph_doc: Digest,
    /// The means: the graph behind `graph_doc`.
    pub graph: &'a LazyGraph<'a>,
}

/// Every ingredient of a partition key, gathered from the context (see [`Partition::params`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PartitionKeyParams {
    pub graph_doc: Digest,
    pub targets: Digest,
    pub cost_mode: CostMode,
    pub prefer: Option<String>,
    pub partitioner_version: u32,
    /// (canonical target, backend name, backend code version) of every target.
    pub backends: Vec<(String, String, crate::code::CodeVersion)>,
    /// Measured costs only: what makes a measurement.
    pub measured: Option<MeasuredParams>,
}

/// The partition key's ingredients that only measured costs have.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MeasuredParams {
    pub tune_version: crate::code::CodeVersion,
    /// The device fingerprint of every target (the tune stage keys its records with the same).
    pub devices: Vec<Option<crate::device::DeviceFingerprint>>,
    /// Every target's measurement schedule ([`MeasureOptions::for_device`]).
    pub measure: Vec<MeasureOptions>,
    /// The validation's margin, skip factor and timing schedule ([`super::validate::constants`]).
    pub validation: super::validate::Constants,
}

impl<'a> Partition<'a> {
    pub fn new(ctx: &'a Ctx<'a>, graph_doc: &Digest, graph: &'a LazyGraph<'a>) -> Self {
        Partition { ctx, graph_doc: *graph_doc, graph }
    }

    /// The key's ingredients.
    pub fn params(&self) -> PartitionKeyParams {
        let ctx = self.ctx;
        let backends = ctx
            .targets
            .targets
            .iter()
            .filter_map(|t| ctx.backend(t).ok().map(|b| (t.to_string(), b.name().to_string(), b.version())))
            .collect();
        let measured = ctx.costs.measures().then(|| MeasuredParams {
            tune_version: crate::tune::code_version(),
            devices: ctx.targets.targets.iter().map(crate::tune::device_fingerprint).collect(),
            measure: ctx.targets.targets.iter().map(|t| MeasureOptions::for_device(t.device())).collect(),
            validation: super::validate::constants(),
        });
        PartitionKeyParams {
            graph_doc: self.graph_doc,
            targets: ctx.targets.digest(),
            cost_mode: ctx.costs.keyed(),
            prefer: ctx.prefer.clone(),
            partitioner_version: PARTITIONER_VERSION,
            backends,
            measured,
        }
    }
}

impl PartitionKeyParams {
    /// The partition key.
    pub fn key(&self) -> Result<Digest> {
        let mut k = code_version()
            .key_builder(Partition::NAME)
            .input_digest("graph", &self.graph_doc)
            .input_digest("targets", &self.targets)
            .input("cost_source", self.cost_mode.name())
            .input("prefer", &self.prefer)
            .env("partitioner", &self.partitioner_version)
            .env("backends", &self.backends);
        if let Some(m) = &self.measured {
            k = k
                .env("tune", &m.tune_version)
                .env("devices", &m.devices)
                .env("measure", &m.measure)
                .env("validation", &m.validation);
        }
        Ok(k.finish()?)
    }
}

impl Stage for Partition<'_> {
    const NAME: &'static str = "partition";
    // Measures (through the tune stage) and guards its own CPU work.
    const DEVICE: DevicePolicy = DevicePolicy::Own;
    type Output = ExecPlan;
    fn version(&self) -> crate::code::CodeVersion {
        code_version()
    }
    fn key(&self) -> Result<Digest> {
        self.params().key()
    }
    fn compute(&self) -> Result<ExecPlan> {
        let g = self.graph.get()?;
        let p = partition_and_plan(self.ctx, g)?;
        // Constants were stored with the graph document; make sure (cheaply) they still are.
        let store = self.ctx.driver.store();
        for (d, _) in &p.constants {
            if !store.contains(d) {
                bail!("constant object {d} is missing from the store");
            }
        }
        Ok(p)
    }
}

/// Which plan the search is asked for.
#[derive(Clone, Debug, PartialEq)]
pub enum Selection {
    /// The searched mix: every target competes on its measured (or estimated) costs.
    Mix,
    /// Collage's single-backend baseline: this backend takes every node it can run, the others the rest.
    Prefer(String),
    /// Only this target (an index in the target set) runs anything: a device's fallback alone.
    Only(usize),
}

/// Every candidate of a graph with its cost and where the cost came from.
pub struct CostedCandidates {
    pub cands: Vec<collage::Candidate>,
    pub cost_us: Vec<f64>,
    pub sources: Vec<CostSource>,
    /// The backend configuration each cost is for (the tune stage's fastest, else the default).
    pub configs: Vec<String>,
}

/// Partitions `g` for the run's targets and builds its execution plan: the searched mix (checked end to end
/// against the single-backend plans where costs are measured, see [`crate::validate`]), or the baseline the
/// context prefers.
pub fn partition_and_plan(ctx: &Ctx, g: &Graph) -> Result<ExecPlan> {
    let costed = costed_candidates(ctx, g)?;
    let selection = match &ctx.prefer {
        Some(b) => Selection::Prefer(b.clone()),
        None => Selection::Mix,
    };
    let plan = plan_for(ctx, g, &costed, &selection)?;
    if selection == Selection::Mix && super::validate::applies(ctx) {
        return super::validate::validate(ctx, g, &costed, plan);
    }
    Ok(plan)
}

/// The candidates of `g` and their costs, as the context's cost mode says.
pub fn costed_candidates(ctx: &Ctx, g: &Graph) -> Result<CostedCandidates> {
    let lookup = |t: &Target| ctx.backend(t).ok();
    // CPU work outside any measurement: under `busy`, so no measurement of another model runs beside it.
    let cands = {
        let _busy = crate::device::busy();
        collage::candidates(g, ctx.targets, &lookup, &Limits::default())?
    };
    let costed: Vec<(f64, CostSource, String)> = match ctx.costs {
        CostMode::Analytical => cands
            .iter()
            .map(|c| {
                let t = &ctx.targets.targets[c.target];
                let backend = ctx.backend(t).ok();
                let us = backend.map(|b| b.estimate_us(g, &c.nodes, t)).unwrap_or(f64::INFINITY);
                (us, CostSource::Analytical, backend.map(|b| b.default_config(t)).unwrap_or_default())
            })
            .collect(),
        CostMode::Measured | CostMode::Recorded => {
            let pairs: Vec<(Target, Vec<NodeId>)> = cands.iter().map(|c| (ctx.targets.targets[c.target].clone(), c.nodes.clone())).collect();
            measure_candidates(ctx, g, &pairs)?.into_iter().map(|c| (c.us, c.source, c.config)).collect()
        }
    };
    let mut out = CostedCandidates { cands, cost_us: Vec::new(), sources: Vec::new(), configs: Vec::new() };
    for (us, source, config) in costed {
        out.cost_us.push(us);
        out.sources.push(source);
        out.configs.push(config);
    }
    Ok(out)
}

/// The plan the search finds for `selection` over costed candidates.
pub fn plan_for(ctx: &Ctx, g: &Graph, costed: &CostedCandidates, selection: &Selection) -> Result<ExecPlan> {
    let CostedCandidates { cands, cost_us, sources, configs } = costed;
    // A preferred backend's candidates cost next to nothing in the search, so it takes every node it can run;
    // with `Only`, other targets' candidates cannot be chosen. Reported costs stay the real ones.
    let search_costs: Vec<f64> = cands
        .iter()
        .zip(cost_us)
        .map(|(c, &us)| match selection {
            Selection::Mix => us,
            Selection::Prefer(b) if ctx.targets.targets[c.target].backend_name() == b && us.is_finite() => us * 1e-6,
            Selection::Prefer(_) => us,
            Selection::Only(t) if c.target == *t => us,
            Selection::Only(_) => f64::INFINITY,
        })
        .collect();
    let _busy = crate::device::busy();
    // A preferred backend takes what it can even where its values cross devices: the crossing costs would
    // otherwise keep it out of every small partition on the other device (same-device costs stay).
    let crossing = match selection {
        Selection::Prefer(_) => CrossingModel { device_latency_us: 0.0, device_us_per_byte: 0.0, ..CrossingModel::default() },
        _ => CrossingModel::default(),
    };
    let mut outcome = collage::search_detailed(g, ctx.targets, cands, &search_costs, &crossing)?;
    if matches!(selection, Selection::Prefer(_)) {
        // Report real costs: a chosen partition is a winner or a merge of winners (sum of their costs).
        for ch in &mut outcome.chosen {
            ch.cost_us = cands
                .iter()
                .zip(cost_us)
                .filter(|(c, _)| c.target == ch.target && c.nodes.iter().all(|n| ch.nodes.contains(n)))
                .filter(|(c, _)| outcome.winners.iter().any(|(w, _)| w.target == c.target && w.nodes == c.nodes))
                .map(|(_, &us)| us)
                .sum();
        }
    }
    let used: Vec<CostSource> = outcome
        .winners
        .iter()
        .map(|(w, _)| {
            let i = cands.iter().position(|c| c.target == w.target && c.nodes == w.nodes).expect("a winner is a candidate");
            sources[i]
        })
        .collect();
    let source = CostSource::of_plan(used);
    let parts = collage::to_partitioning(ctx.targets, &outcome.chosen, source);
    check(g, &parts).map_err(anyhow::Error::msg)?;
    let mut plan = build_plan(g, &parts, &|t: &Tensor| Digest::of(t.bytes()), &|t| ctx.backend(t).map_or(crate::backend::INLINE_CONST_MAX, |b| b.inline_const_max()))?;
    for (p, chosen) in plan.partitions.iter_mut().zip(&outcome.chosen) {
        // A partition that is a measured candidate runs in the configuration measured fastest (a merge of
        // winners was never measured as one kernel: its backend's default).
        let target = &ctx.targets.targets[chosen.target];
        let measured = cands.iter().position(|c| c.target == chosen.target && c.nodes == chosen.nodes).map(|i| &configs[i]);
        if let (Some(config), Ok(backend)) = (measured, ctx.backend(target)) {
            if *config != backend.default_config(target) {
                p.symbol = crate::tune::symbol_in(backend, target, &p.kernel, config);
                p.config = Some(config.clone());
            }
        }
        p.alternative = chosen.alternative.map(|(ti, us)| {
            let t = &ctx.targets.targets[ti];
            Alternative { backend: t.backend_name().to_string(), target: t.to_string(), cost_us: us, cost_source: ctx.costs.name().to_string() }
        });
    }
    Ok(plan)
}
