//! Stage: layout. The model's graph document with its convolution chains channels-last, for `-layout=nhwc`
//! and `-layout=auto` (see [`crate::passes::layout`]), between precision and partition; and the choice
//! `-layout=auto` makes between the two documents' plans ([`plan_for_targets`]).
//!
//! An nchw build partitions the document the precision stage made. The rewrite is keyed by that document's
//! digest, so every model's channels-last graph (and its permuted weights, stored by digest) is computed once
//! and shared by every target set asking for it.
//!
//! Why auto, measured: channels-last is not faster everywhere. On an H200 in fp16 (2026-11-26,
//! bench/gpu_layout.md) it took ResNet-50 at batch 32 from 2.59 to 1.13 ms and ResNeXt-50 at batch 32 from
//! 3.40 to 1.41 ms (cuDNN's NHWC kernels, no transforms), but MobileNetV2 at batch 1 went from 0.163 to
//! 0.194 ms, EfficientNet-B0 from 0.368 to 0.396 and ConvNeXt-T from 0.70 to 0.84 (their depthwise layers run on
//! our own kernels either way, and ConvNeXt's exported permutes around its channel LayerNorms stay). Where
//! that measurement leaves no doubt, auto plans channels-last alone ([`channels_last_by_rule`]).

use crate::stages::artifact::{compile_plan, link_plan};
use crate::context::{Ctx, LazyGraph};
use crate::ir::{serial::GraphDoc, Graph, Tensor};
use crate::partition::plan::ExecPlan;
use crate::stage::{run_digest, DevicePolicy, Stage};
use crate::target::Layout;
use anyhow::{Context, Result};
use serde::Serialize;
use std::sync::OnceLock;
use tessera_kernels::runtime::measure::median;
use tessera_store::Digest;

/// The stage's code version (with [`crate::passes::PASSES_VERSION`] in the key: the rewrite is a pass).
pub const LAYOUT_VERSION: u32 = 1;

/// Stage: layout. Output: the rewritten graph document (constants stored separately, by digest).
pub struct ChannelsLast<'a> {
    /// The document it rewrites.
    pub doc: Digest,
    pub graph: &'a LazyGraph<'a>,
    pub store: &'a tessera_store::Store,
    pub(crate) built: OnceLock<Graph>,
}

impl Stage for ChannelsLast<'_> {
    const NAME: &'static str = "layout";
    const DEVICE: DevicePolicy = DevicePolicy::Busy;
    type Output = Vec<u8>;
    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(LAYOUT_VERSION, &[crate::code::digests::LAYOUT])
    }
    fn key(&self) -> Result<Digest> {
        Ok(self.key_builder().env("passes", &crate::passes::code_version()).input_digest("graph", &self.doc).input("layout", &Layout::Nhwc).finish()?)
    }
    fn compute(&self) -> Result<Vec<u8>> {
        let g = self.graph.get()?;
        let h = crate::passes::layout::to_channels_last(g).with_context(|| format!("graph '{}': rewriting it channels-last", g.name))?;
        let doc = GraphDoc::from_graph(&h, |t: &Tensor| self.store.put(t.bytes()))?;
        let bytes = postcard::to_stdvec(&doc)?;
        let _ = self.built.set(h);
        Ok(bytes)
    }
    // Stored as the postcard encoding of `GraphDoc` itself, as the load stage stores its document.
    fn encode(out: &Vec<u8>) -> Result<Vec<u8>> {
        Ok(out.clone())
    }
    fn decode(bytes: &[u8]) -> Result<Vec<u8>> {
        Ok(bytes.to_vec())
    }
}

/// One layout's plan under `-layout=auto`: its document and plan, the plan's estimate and, where measured, its
/// artifact's end-to-end median.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayoutTrial {
    pub layout: Layout,
    pub doc: Digest,
    pub plan: Digest,
    pub partitions: usize,
    pub estimated_us: f64,
    /// The artifact timed, where this build linked it (not where its timings were recorded already).
    pub artifact: Option<Digest>,
    pub median_us: Option<f64>,
}

impl LayoutTrial {
    /// The trial of plan `p` for `layout`, before any artifact is built or timed.
    fn unmeasured(layout: Layout, p: &Planned) -> LayoutTrial {
        LayoutTrial { layout, doc: p.doc, plan: p.plan_digest, partitions: p.plan.partitions.len(), estimated_us: p.plan.estimated_us(), artifact: None, median_us: None }
    }
}

/// How `-layout=auto` chose (`tessera explain` shows it).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LayoutChoice {
    pub chosen: Layout,
    /// "measured end to end" or "estimates" (analytical costs, or a device this build does not time).
    pub by: String,
    pub trials: Vec<LayoutTrial>,
}

impl LayoutChoice {
    /// The store objects of the layout not chosen (its document, plan and artifact), kept with the model's
    /// so that a warm rebuild finds them and times nothing again.
    pub fn roots(&self) -> Vec<Digest> {
        self.trials.iter().filter(|t| t.layout != self.chosen).flat_map(|t| [Some(t.doc), Some(t.plan), t.artifact]).flatten().collect()
    }
}

/// A model planned for one layout: its document, graph, plan digest and plan.
pub struct Planned<'a> {
    pub doc: Digest,
    pub graph: LazyGraph<'a>,
    pub plan_digest: Digest,
    pub plan: ExecPlan,
}

fn partition<'a>(ctx: &Ctx<'a>, doc: Digest, graph: LazyGraph<'a>) -> Result<Planned<'a>> {
    let (plan_digest, plan) = crate::stages::partition::partition_document(ctx, &doc, &graph).context("partition")?;
    Ok(Planned { doc, graph, plan_digest, plan })
}

/// The document `doc` channels-last, and its graph if it was built here.
fn channels_last<'a>(ctx: &Ctx<'a>, doc: Digest, graph: &LazyGraph<'a>) -> Result<(Digest, LazyGraph<'a>)> {
    let stage = ChannelsLast { doc, graph, store: ctx.driver.store(), built: OnceLock::new() };
    let rewritten = run_digest(ctx.driver, &stage).context("layout")?;
    let built = stage.built.into_inner();
    Ok((rewritten, LazyGraph::new(ctx.driver, rewritten, built)))
}

/// Why `-layout=auto` keeps the document `doc` channels-last without planning it channels-first, if it does:
/// 16-bit builds with `cudnn` among the targets, of a model with no depthwise convolution. Measured (H200,
/// fp16, bench/gpu_layout.md): channels-last won every such model by 1.6-2.4x (ResNet-50 b1 0.522 -> 0.317 ms,
/// b32 2.59 -> 1.13, ResNeXt-50 b32 3.40 -> 1.41), for a structural reason (cuDNN's fp16 tensor-core kernels
/// transform NCHW operands to NHWC and back inside every call), while the models it lost all have depthwise
/// layers (MobileNetV2, EfficientNet-B0), which run on our own kernels either way; those still plan both.
/// Planning one layout halves the partition and tune work of a cold compile (ResNet-50 b1: 8.9 s channels-last
/// alone against about 30 s for both, bench/compile_times.md). Reads the graph's structure only (no weights).
fn channels_last_by_rule(ctx: &Ctx, doc: &Digest) -> Result<Option<String>> {
    use crate::target::Precision;
    let half = matches!(ctx.targets.precision()?, Precision::Fp16 | Precision::Bf16);
    let cudnn = ctx.targets.targets.iter().any(|t| ctx.backend(t).is_ok_and(|b| b.native_channels_last_half()));
    if !half || !cudnn {
        return Ok(None);
    }
    let d: GraphDoc = crate::stage::load_value(ctx.driver, doc)?;
    let depthwise = d.nodes.iter().any(|n| match &n.op {
        crate::ir::Op::Conv(a) => a.group > 1 && d.values[n.inputs[0] as usize].ty.shape.get(1) == Some(&a.group),
        _ => false,
    });
    Ok((!depthwise).then(|| "rule: a 16-bit build with cudnn and no depthwise convolution".to_string()))
}

/// The plan for `ctx`'s layout of the document `doc` (what the precision stage made): nchw partitions it as it
/// is, nhwc its channels-last rewrite, auto both, keeping the faster. Faster is measured end to end where
/// artifacts are timed ([`crate::stages::validate::measures_end_to_end`]: both are built through the
/// memoized stages and timed in two passes, as validation times its plans; the nchw plan is kept on a tie),
/// else the lower estimate. A model the rewrite leaves unchanged (no 2-D convolution) is planned once.
pub fn plan_for_targets<'a>(ctx: &Ctx<'a>, doc: Digest, graph: LazyGraph<'a>) -> Result<(Planned<'a>, Option<LayoutChoice>)> {
    match ctx.targets.layout()? {
        Layout::Nchw => Ok((partition(ctx, doc, graph)?, None)),
        Layout::Nhwc => {
            let (d, g) = channels_last(ctx, doc, &graph)?;
            Ok((partition(ctx, d, g)?, None))
        }
        Layout::Auto => {
            let (d, g) = channels_last(ctx, doc, &graph)?;
            if d == doc {
                return Ok((partition(ctx, doc, graph)?, None));
            }
            if let Some(why) = channels_last_by_rule(ctx, &doc)? {
                let last = partition(ctx, d, g)?;
                let trials = vec![LayoutTrial::unmeasured(Layout::Nhwc, &last)];
                return Ok((last, Some(LayoutChoice { chosen: Layout::Nhwc, by: why, trials })));
            }
            let first = partition(ctx, doc, graph)?;
            let last = partition(ctx, d, g)?;
            let mut trials: Vec<LayoutTrial> = [(Layout::Nchw, &first), (Layout::Nhwc, &last)].into_iter().map(|(layout, p)| LayoutTrial::unmeasured(layout, p)).collect();
            let measured = crate::stages::validate::measures_end_to_end(ctx);
            if measured {
                use crate::stages::validate::{time_plans, timing_identity, timings_recorded};
                let mut compiled = Vec::with_capacity(2);
                for (t, p) in trials.iter().zip([&first, &last]) {
                    compiled.push(compile_plan(ctx, &p.plan_digest, &p.plan, &|| p.graph.get()).with_context(|| format!("building the {} plan", t.layout.name()))?);
                }
                let labels: Vec<String> = trials.iter().map(|t| t.layout.name().to_string()).collect();
                let identities = compiled.iter().map(|c| timing_identity(&c.plan, &c.modules)).collect::<Result<Vec<_>>>()?;
                // Linked only to be timed: not where the timings of these plans are recorded (a weights change).
                if !timings_recorded(ctx, &identities)? {
                    for ((t, c), label) in trials.iter_mut().zip(&compiled).zip(&labels) {
                        t.artifact = Some(link_plan(ctx, c).with_context(|| format!("building the {label} plan"))?);
                    }
                }
                let artifacts = || compiled.iter().map(|c| link_plan(ctx, c)).collect::<Result<Vec<_>>>();
                let timed = time_plans(ctx, &labels, identities, &artifacts)?;
                for (t, [a, b]) in trials.iter_mut().zip(timed) {
                    let all: Vec<f64> = a.iter().chain(&b).copied().collect();
                    t.median_us = Some(median(&all));
                }
            }
            let score = |t: &LayoutTrial| t.median_us.unwrap_or(t.estimated_us);
            let chosen = if score(&trials[1]) < score(&trials[0]) { Layout::Nhwc } else { Layout::Nchw };
            let choice = LayoutChoice { chosen, by: if measured { "measured end to end" } else { "estimates" }.to_string(), trials };
            Ok((if chosen == Layout::Nhwc { last } else { first }, Some(choice)))
        }
    }
}
