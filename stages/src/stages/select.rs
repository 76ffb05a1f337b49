//! Plan selection: every candidate of a graph with its cost (measured through the tune stage, or estimated),
//! and the plan the shortest-path search finds for a selection (the searched mix, a preferred backend, one
//! target alone). Below both the partition stage and its validation, which compare such plans.

use crate::partition::collage::{self, CrossingModel, Limits};
use crate::partition::plan::{build_plan, Alternative, ExecPlan};
use crate::partition::check;
use crate::context::{CostMode, CostSource, Ctx};
use crate::ir::{Graph, NodeId, Tensor};
use crate::target::Target;
use crate::stages::tune::measure_candidates;
use anyhow::Result;
use tessera_store::Digest;

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

/// The candidates of `g` for the context's targets.
pub fn candidates(ctx: &Ctx, g: &Graph) -> Result<Vec<collage::Candidate>> {
    let lookup = |t: &Target| ctx.backend(t).ok();
    // CPU work outside any measurement: under `busy`, so no measurement of another model runs beside it.
    let _busy = crate::device::busy();
    Ok(collage::candidates(g, ctx.targets, &lookup, &Limits::default())?)
}

impl CostedCandidates {
    /// Candidates with their (cost, source, configuration), in the same order.
    pub fn new(cands: Vec<collage::Candidate>, costed: Vec<(f64, CostSource, String)>) -> CostedCandidates {
        let mut out = CostedCandidates { cands, cost_us: Vec::new(), sources: Vec::new(), configs: Vec::new() };
        for (us, source, config) in costed {
            out.cost_us.push(us);
            out.sources.push(source);
            out.configs.push(config);
        }
        out
    }
}

/// The candidates of `g` and their costs, as the context's cost mode says, every candidate measured in every
/// configuration where costs are measured (`--tuning full`; pruned tuning is `prune::pruned_candidates`).
pub fn costed_candidates(ctx: &Ctx, g: &Graph) -> Result<CostedCandidates> {
    let cands = candidates(ctx, g)?;
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
    Ok(CostedCandidates::new(cands, costed))
}

/// The search's outcome for `selection` over candidates costing `cost_us`. A preferred backend's candidates
/// cost next to nothing in the search, so it takes every node it can run; with `Only`, other targets'
/// candidates cannot be chosen. The outcome's costs are the search's, not the real ones.
pub fn search_for(ctx: &Ctx, g: &Graph, cands: &[collage::Candidate], cost_us: &[f64], selection: &Selection) -> Result<collage::SearchOutcome> {
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
    // A preferred backend takes what it can even where its values cross devices: the crossing costs would
    // otherwise keep it out of every small partition on the other device (same-device costs stay).
    let crossing = match selection {
        Selection::Prefer(_) => CrossingModel { device_latency_us: 0.0, device_us_per_byte: 0.0, ..CrossingModel::default() },
        _ => CrossingModel::default(),
    };
    let outcome = collage::search_detailed(g, ctx.targets, cands, &search_costs, &crossing)?;
    if let Some(w) = outcome.beam {
        tracing::warn!(model = %g.name, beam = w, "the exact partition search ran past its budget; a beam search chose the plan, which may not be the cheapest");
    }
    Ok(outcome)
}

/// The plan the search finds for `selection` over costed candidates.
pub fn plan_for(ctx: &Ctx, g: &Graph, costed: &CostedCandidates, selection: &Selection) -> Result<ExecPlan> {
    let CostedCandidates { cands, cost_us, sources, configs } = costed;
    let _busy = crate::device::busy();
    let mut outcome = search_for(ctx, g, cands, cost_us, selection)?;
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
                p.symbol = crate::stages::tune::symbol_in(backend, target, &p.kernel, config);
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
