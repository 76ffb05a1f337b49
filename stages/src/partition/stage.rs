//! The partition stage's work: Collage candidates, their costs (measured by the tune stage, or the backends'
//! estimates), the shortest-path search, and the execution plan with each partition's runner-up.

use crate::build::Ctx;
use crate::plan::{build_plan, Alternative, ExecPlan};
use crate::tune::{measure_candidates, CostSource as TuneSource};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use tessera_stages::ir::{Graph, NodeId, Tensor};
use tessera_stages::partition::collage::{self, CrossingModel, Limits};
use tessera_stages::partition::{check, CostSource};
use tessera_stages::target::Target;
use tessera_store::Digest;

/// Where partition costs come from: part of the partition key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum CostMode {
    /// Measure every candidate on this machine (the tune stage; recorded in the store, so measured once).
    #[default]
    Measured,
    /// The backends' analytical estimates: no measurement, the same plan on every machine.
    Analytical,
}

impl CostMode {
    pub fn name(self) -> &'static str {
        match self {
            CostMode::Measured => "measured",
            CostMode::Analytical => "analytical",
        }
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
    pub sources: Vec<&'static str>,
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
    if selection == Selection::Mix && crate::validate::applies(ctx) {
        return crate::validate::validate(ctx, g, &costed, plan);
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
    let (cost_us, sources): (Vec<f64>, Vec<&'static str>) = match ctx.costs {
        CostMode::Analytical => cands
            .iter()
            .map(|c| {
                let t = &ctx.targets.targets[c.target];
                let us = ctx.backend(t).map(|b| b.estimate_us(g, &c.nodes, t)).unwrap_or(f64::INFINITY);
                (us, "analytical")
            })
            .unzip(),
        CostMode::Measured => {
            let pairs: Vec<(Target, Vec<NodeId>)> = cands.iter().map(|c| (ctx.targets.targets[c.target].clone(), c.nodes.clone())).collect();
            measure_candidates(ctx, g, &pairs)?
                .into_iter()
                .map(|c| {
                    let source = match c.source {
                        TuneSource::Measured => "measured",
                        TuneSource::Analytical => "analytical",
                        TuneSource::Unsupported => "unsupported",
                    };
                    (c.us, source)
                })
                .unzip()
        }
    };
    Ok(CostedCandidates { cands, cost_us, sources })
}

/// The plan the search finds for `selection` over costed candidates.
pub fn plan_for(ctx: &Ctx, g: &Graph, costed: &CostedCandidates, selection: &Selection) -> Result<ExecPlan> {
    let CostedCandidates { cands, cost_us, sources } = costed;
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
    let mut outcome = collage::search_detailed(g, ctx.targets, cands, &search_costs, &CrossingModel::default())?;
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
    let used: Vec<&str> = outcome
        .winners
        .iter()
        .map(|(w, _)| {
            let i = cands.iter().position(|c| c.target == w.target && c.nodes == w.nodes).expect("a winner is a candidate");
            sources[i]
        })
        .collect();
    let source = if used.iter().all(|s| *s == "measured") {
        CostSource::Measured
    } else if used.iter().all(|s| *s == "analytical") {
        CostSource::Analytical
    } else {
        CostSource::Mixed
    };
    let parts = collage::to_partitioning(ctx.targets, &outcome.chosen, source);
    check(g, &parts).map_err(anyhow::Error::msg)?;
    let mut plan = build_plan(g, &parts, &|t: &Tensor| Digest::of(t.bytes()))?;
    for (p, chosen) in plan.partitions.iter_mut().zip(&outcome.chosen) {
        p.alternative = chosen.alternative.map(|(ti, us)| {
            let t = &ctx.targets.targets[ti];
            Alternative { backend: t.backend_name().to_string(), target: t.to_string(), cost_us: us, cost_source: ctx.costs.name().to_string() }
        });
    }
    Ok(plan)
}
