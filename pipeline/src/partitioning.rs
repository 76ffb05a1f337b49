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

/// Partitions `g` for the run's targets and builds its execution plan.
pub fn partition_and_plan(ctx: &Ctx, g: &Graph) -> Result<ExecPlan> {
    let lookup = |t: &Target| ctx.backend(t).ok();
    let cands = collage::candidates(g, ctx.targets, &lookup, &Limits::default())?;
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
    // The single-backend baseline: the preferred backend's candidates cost next to nothing in the search, so it
    // takes every node it can run; reported costs stay the real ones.
    let search_costs: Vec<f64> = match &ctx.prefer {
        None => cost_us.clone(),
        Some(b) => cands
            .iter()
            .zip(&cost_us)
            .map(|(c, &us)| if ctx.targets.targets[c.target].backend_name() == b && us.is_finite() { us * 1e-6 } else { us })
            .collect(),
    };
    let mut outcome = collage::search_detailed(g, ctx.targets, &cands, &search_costs, &CrossingModel::default())?;
    if ctx.prefer.is_some() {
        // Report real costs: a chosen partition is a winner or a merge of winners (sum of their costs).
        for ch in &mut outcome.chosen {
            ch.cost_us = cands
                .iter()
                .zip(&cost_us)
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
