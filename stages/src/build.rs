//! The stage DAG of one model, every stage a [`Stage`](crate::stage::Stage) (one module each: [`crate::stages::load`],
//! [`crate::stages::partition`], [`crate::stages::tune`], [`crate::stages::lower`], [`crate::stages::compile`], [`crate::stages::link`]) run
//! through the [`Driver`](crate::stage::Driver):
//!
//! load (graph document) -> [precision (the document in fp16, for `-precision=fp16`)] -> [layout (channels-last, for
//! `-layout=nhwc`; `auto` partitions both and keeps the faster)] -> partition (execution plan; asks tune for costs) -> lower (one call per distinct
//! kernel) -> compile (one module per backend, module-at-a-time) -> link (one artifact).
//!
//! Keys are built from upstream output digests, so an unchanged output cuts off everything after it; the
//! model graph itself is built or reloaded only when a stage that needs it misses. Nothing in a stage imports
//! this module: the context every stage reads is [`crate::context`], the stages after partition are
//! [`crate::stages::artifact`].

use crate::context::{Ctx, LazyGraph};
use crate::stages::load::{load_model, GraphSource};
use crate::partition::plan::ExecPlan;
use anyhow::{Context, Result};
use tessera_store::Digest;

/// A model after the load and partition stages: what `tessera explain` shows and compile continues from.
pub struct PlannedModel<'a> {
    /// The graph document's digest.
    pub doc: Digest,
    pub plan_digest: Digest,
    pub plan: ExecPlan,
    pub graph: LazyGraph<'a>,
    /// For reduced precision: the loaded graph and its calibration (which nodes stayed in fp32, and why).
    pub calibrated: Option<crate::stages::precision::Calibrated<'a>>,
    /// How `-layout=auto` chose between channels-first and channels-last (models with 2-D convolutions).
    pub layout: Option<crate::stages::layout::LayoutChoice>,
}

/// Runs the load and partition stages of one model.
pub fn plan_model<'a>(ctx: &Ctx<'a>, source: &dyn GraphSource) -> Result<PlannedModel<'a>> {
    let name = source.name();
    let (doc, built) = load_model(ctx, source).with_context(|| format!("model {name}: load"))?;
    let graph = LazyGraph::new(ctx.driver, doc, built);
    let (doc, graph, calibrated) = crate::stages::precision::for_targets(ctx, name, doc, graph).with_context(|| format!("model {name}: precision"))?;
    let (planned, layout) = crate::stages::layout::plan_for_targets(ctx, doc, graph).with_context(|| format!("model {name}"))?;
    let crate::stages::layout::Planned { doc, graph, plan_digest, plan } = planned;
    Ok(PlannedModel { doc, plan_digest, plan, graph, calibrated, layout })
}

