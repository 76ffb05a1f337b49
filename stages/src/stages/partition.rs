//! Stage 2, partition: Collage candidates, their costs (measured by the tune stage, or the backends'
//! estimates), the shortest-path search, the validation of the searched plan end to end
//! ([`super::validate`]), and the execution plan with each partition's runner-up.

use crate::partition::plan::{ExecPlan, PLAN_VERSION};
use crate::stages::select::{costed_candidates, plan_for, Selection};
use crate::partition::PARTITIONER_VERSION;
use crate::context::{CostMode, Ctx, LazyGraph, Tuning};
use crate::ir::{serial::GraphDoc, Graph};
use crate::stage::{DevicePolicy, Stage};
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
/// Keyed by the document's structure, not its weights ([`GraphDoc::structure_digest`]): a model with other
/// weights (a fine-tune) takes the plan of the first model of its structure, which [`bind`] points at its own
/// constants. With measured costs the plan depends on the machine: the tune stage's version, the fingerprint
/// of every target's device, the measurement schedule and the validation's constants are key ingredients too.
pub struct Partition<'a> {
    pub ctx: &'a Ctx<'a>,
    /// The graph document's digest (the load stage's output, or precision's or layout's).
    pub graph_doc: Digest,
    /// Its structure's digest (the key ingredient).
    pub structure: Digest,
    /// The means: the graph behind `graph_doc`.
    pub graph: &'a LazyGraph<'a>,
}

/// Every ingredient of a partition key, gathered from the context (see [`Partition::params`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PartitionKeyParams {
    /// The graph document's structure ([`GraphDoc::structure_digest`]).
    pub structure: Digest,
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
    pub devices: Vec<Option<crate::fingerprint::DeviceFingerprint>>,
    /// Every target's measurement schedule ([`MeasureOptions::for_device`]).
    pub measure: Vec<MeasureOptions>,
    /// The validation's margin, skip factor and timing schedule ([`super::validate::constants`]).
    pub validation: super::validate::Constants,
    /// Which candidates and configurations are measured ([`Tuning`]), with pruning's constants.
    pub tuning: Tuning,
    pub pruning: crate::stages::prune::Constants,
}

impl<'a> Partition<'a> {
    /// The stage for document `graph_doc`, `doc` decoded.
    pub fn new(ctx: &'a Ctx<'a>, graph_doc: &Digest, doc: &GraphDoc, graph: &'a LazyGraph<'a>) -> Self {
        Partition { ctx, graph_doc: *graph_doc, structure: doc.structure_digest(lifted_above(ctx)), graph }
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
            tune_version: crate::stages::tune::code_version(),
            devices: ctx.targets.targets.iter().map(crate::stages::tune::device_fingerprint).collect(),
            measure: ctx.targets.targets.iter().map(|t| MeasureOptions::for_device(t.device())).collect(),
            validation: super::validate::constants(),
            tuning: ctx.tuning,
            pruning: crate::stages::prune::constants(),
        });
        PartitionKeyParams {
            structure: self.structure,
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
            .input_digest("structure", &self.structure)
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
                .env("validation", &m.validation)
                .env("tuning", &m.tuning.name())
                .env("pruning", &m.pruning);
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

/// The size above which a constant's values are not part of the structure: the most elements any target's
/// backend keeps inside its kernels ([`crate::backend::Backend::inline_const_max`]; larger ones are kernel
/// arguments).
pub fn lifted_above(ctx: &Ctx) -> usize {
    ctx.targets.targets.iter().map(|t| ctx.backend(t).map_or(crate::backend::INLINE_CONST_MAX, |b| b.inline_const_max())).max().unwrap_or(0)
}

/// Runs the partition stage for document `doc_digest`: its plan, bound to its own constants, and the plan's
/// digest (the stage's output where the document computed it; otherwise the bound plan, stored).
pub fn partition_document(ctx: &Ctx, doc_digest: &Digest, graph: &LazyGraph) -> Result<(Digest, ExecPlan)> {
    let doc: GraphDoc = crate::stage::load_value(ctx.driver, doc_digest)?;
    let (digest, plan) = crate::stage::run(ctx.driver, &Partition::new(ctx, doc_digest, &doc, graph))?;
    let bound = plan.bind(&doc)?;
    if bound == plan {
        return Ok((digest, plan));
    }
    Ok((ctx.driver.store().put(&postcard::to_stdvec(&bound)?)?, bound))
}

/// The selections whose plans the partition stage builds from one set of costed candidates: the one it
/// returns first (the searched mix, or the preferred backend's baseline), then validation's references.
pub fn selections(ctx: &Ctx) -> Vec<Selection> {
    let main = match &ctx.prefer {
        Some(b) => Selection::Prefer(b.clone()),
        None => Selection::Mix,
    };
    let validated = main == Selection::Mix && super::validate::applies(ctx);
    let mut out = vec![main];
    if validated {
        out.extend(super::validate::references(ctx).into_iter().map(|(_, s)| s));
    }
    out
}

/// Partitions `g` for the run's targets and builds its execution plan: the searched mix (checked end to end
/// against the single-backend plans where costs are measured, see [`crate::validate`]), or the baseline the
/// context prefers.
pub fn partition_and_plan(ctx: &Ctx, g: &Graph) -> Result<ExecPlan> {
    let selections = selections(ctx);
    let costed = match ctx.tuning {
        Tuning::Pruned if ctx.costs.measures() => crate::stages::prune::pruned_candidates(ctx, g, &selections)?,
        _ => costed_candidates(ctx, g)?,
    };
    let selection = selections[0].clone();
    let plan = plan_for(ctx, g, &costed, &selection)?;
    if selection == Selection::Mix && super::validate::applies(ctx) {
        return super::validate::validate(ctx, g, &costed, plan);
    }
    Ok(plan)
}

