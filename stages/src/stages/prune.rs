//! Pruned tuning: measure the candidates that can be in the best plan, not all of them.
//!
//! Full measurement times every candidate of a graph in every configuration its backend offers, and most of
//! them are in no plan worth running (a GEMM on the `c` backend beside cuBLASLt's, a fusion whose parts run
//! better apart). Pruning lets the backends' analytical estimates say what could win and the search say what
//! does:
//!
//! 1. Probes: per target, the [`PROBES`] candidates whose estimates are closest to the lowest estimate for
//!    the same nodes, measured first, so that every backend's estimates meet measurements.
//! 2. Calibration: per target, the median of measured / estimated time over its measured candidates. A
//!    backend's estimates are off on a given machine by a factor that varies less from kernel to kernel
//!    than between backends (the `c` backend's GEMMs are estimated ten times too slow on the 2-core build
//!    machine; the GPU libraries' small calls too fast).
//! 3. Rounds: the search runs with the measured candidates at their times and every other one at an
//!    optimistic bound, its calibrated estimate divided by [`Constants::slack`]. The unmeasured candidates
//!    of the plan it finds are measured, and the search runs again, until its plan holds measured candidates
//!    only. That plan then beats every plan with an unmeasured candidate, even at that candidate's bound: the
//!    rest cannot win unless an estimate is off by more than the slack. The rounds search for every plan
//!    the partition stage builds from these costs (the searched mix and validation's references: each
//!    backend preferred, each fallback alone), so each of them is made of measured candidates too; a
//!    fallback alone only while its plan is within validation's skip factor of the mix's (at the bounds),
//!    since validation does not build it beyond that.
//! 4. Configurations: the rounds measure default configurations. The plan's candidates, and the measured
//!    candidates within [`Constants::config_slack`] of one of them on the same nodes, are then measured in
//!    every configuration their backends offer (the `cuda` GEMM's tiles and split-K, the libraries'
//!    algorithm ranks); tuning only makes them faster, so the plan's standing holds.
//!
//! Unmeasured candidates keep their calibrated estimates (cost source `analytical`), which are above their
//! optimistic bounds, so the final search picks none of them over the plan the rounds ended on. Every
//! decision follows from estimates (deterministic) and measured times (recorded in the store), so a build
//! from records (`--frozen`) makes the same decisions and reads exactly the records the measured build wrote.

use crate::partition::collage::Candidate;
use super::select::{candidates, search_for, CostedCandidates, Selection};
use crate::context::{CostSource, Ctx};
use crate::ir::{Graph, NodeId};
use crate::target::Target;
use crate::stages::tune::{measure_candidates_in, CandidateCost, ConfigScope};
use anyhow::Result;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// An unmeasured candidate's optimistic bound is its calibrated estimate divided by this.
pub const SLACK: f64 = 2.0;

/// Measured candidates within this factor of a plan candidate on the same nodes are tuned in every
/// configuration too (split-K or another tile can be worth this much on one problem).
pub const CONFIG_SLACK: f64 = 2.0;

/// Per target, this many candidates closest to the lowest estimate of their nodes are measured first.
pub const PROBES: usize = 3;

/// Pruning's constants, as the partition key records them (a change re-plans).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Constants {
    pub slack: f64,
    pub config_slack: f64,
    pub probes: usize,
}

/// The constants above (a partition key ingredient).
pub fn constants() -> Constants {
    Constants { slack: SLACK, config_slack: CONFIG_SLACK, probes: PROBES }
}

/// A candidate's cost as the search takes it: microseconds, where it came from, and its configuration.
pub type Costed = (f64, CostSource, String);

/// The candidates of `g` with their costs under pruned tuning, for plans of `selections`.
pub fn pruned_candidates(ctx: &Ctx, g: &Graph, selections: &[Selection]) -> Result<CostedCandidates> {
    let cands = candidates(ctx, g)?;
    let costed = pruned_costs(ctx, g, &cands, selections)?;
    Ok(CostedCandidates::new(cands, costed))
}

/// The costs of `cands` with pruned tuning (see the module documentation), in `cands` order, for plans of
/// `selections`.
pub fn pruned_costs(ctx: &Ctx, g: &Graph, cands: &[Candidate], selections: &[Selection]) -> Result<Vec<Costed>> {
    let targets = &ctx.targets.targets;
    let estimate: Vec<f64> = cands
        .iter()
        .map(|c| {
            let t = &targets[c.target];
            ctx.backend(t).map(|b| b.estimate_us(g, &c.nodes, t)).unwrap_or(f64::INFINITY)
        })
        .collect();
    let default_config: Vec<String> =
        cands.iter().map(|c| ctx.backend(&targets[c.target]).map(|b| b.default_config(&targets[c.target])).unwrap_or_default()).collect();
    let index: BTreeMap<(usize, &[NodeId]), usize> = cands.iter().enumerate().map(|(i, c)| ((c.target, c.nodes.as_slice()), i)).collect();
    // Every selection's winners, once each; a fallback alone only while its plan, at these (optimistic)
    // costs, is within validation's skip factor of the first selection's: beyond it, validation does not
    // build that plan, so its candidates need no measurement.
    let search = |costs: &[f64]| -> Result<Vec<usize>> {
        let _busy = crate::device::busy();
        let mut winners = BTreeSet::new();
        let mut first_total = f64::INFINITY;
        for (k, s) in selections.iter().enumerate() {
            let outcome = search_for(ctx, g, cands, costs, s)?;
            if k == 0 {
                first_total = outcome.total_us;
            } else if matches!(s, Selection::Only(_)) && outcome.total_us > super::validate::SKIP_FACTOR * first_total {
                continue;
            }
            winners.extend(outcome.winners.iter().map(|(w, _)| index[&(w.target, w.nodes.as_slice())]));
        }
        Ok(winners.into_iter().collect())
    };
    let measure = |which: &[usize], scope: ConfigScope| -> Result<Vec<(usize, CandidateCost)>> {
        let pairs: Vec<(Target, Vec<NodeId>)> = which.iter().map(|&i| (targets[cands[i].target].clone(), cands[i].nodes.clone())).collect();
        Ok(which.iter().copied().zip(measure_candidates_in(ctx, g, &pairs, scope)?).collect())
    };

    let plan = Plan::new(cands, &estimate);
    let mut defaults: Vec<Option<CandidateCost>> = vec![None; cands.len()];
    let mut measure_defaults = |which: &[usize]| -> Result<Vec<f64>> {
        let costs = measure(which, ConfigScope::DefaultOnly)?;
        let us = costs.iter().map(|(_, c)| c.us).collect();
        for (i, cost) in costs {
            defaults[i] = Some(cost);
        }
        Ok(us)
    };
    let outcome = plan.rounds(&mut measure_defaults, &search)?;
    tracing::info!(
        graph = %g.name,
        candidates = cands.len(),
        measured = outcome.times.iter().filter(|t| t.is_some()).count(),
        rounds = outcome.rounds,
        "pruned tuning"
    );
    let (times, winners) = (outcome.times, outcome.winners);
    let calibrated = plan.calibrated(&times);
    let mut costs: Vec<Option<CandidateCost>> = defaults;
    for (i, cost) in measure(&plan.competitive(&winners, &times), ConfigScope::All)? {
        costs[i] = Some(cost);
    }
    Ok(costs
        .into_iter()
        .enumerate()
        .map(|(i, m)| match m {
            Some(c) => (c.us, c.source, c.config),
            None => (calibrated[i], CostSource::Analytical, default_config[i].clone()),
        })
        .collect())
}

/// What the rounds measured (default configurations), the plans they ended on, and how many rounds ran.
struct Rounds {
    times: Vec<Option<f64>>,
    winners: Vec<usize>,
    rounds: usize,
}

/// The candidates' groups (by covered nodes), targets and estimates: every decision of pruning, apart from
/// measuring and searching.
struct Plan {
    /// Candidate indices per covered node set, in `cands` order.
    groups: Vec<Vec<usize>>,
    /// Each candidate's group.
    group_of: Vec<usize>,
    target_of: Vec<usize>,
    estimate: Vec<f64>,
}

impl Plan {
    fn new(cands: &[Candidate], estimate: &[f64]) -> Plan {
        let mut by_nodes: BTreeMap<&[NodeId], usize> = BTreeMap::new();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let mut group_of = Vec::with_capacity(cands.len());
        for (i, c) in cands.iter().enumerate() {
            let gi = *by_nodes.entry(&c.nodes).or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
            groups[gi].push(i);
            group_of.push(gi);
        }
        Plan { groups, group_of, target_of: cands.iter().map(|c| c.target).collect(), estimate: estimate.to_vec() }
    }

    /// The lowest estimate of a group (infinite where no backend estimates any).
    fn best_estimate(&self, group: usize) -> f64 {
        self.groups[group].iter().map(|&i| self.estimate[i]).fold(f64::INFINITY, f64::min)
    }

    /// The first round: per target, the [`PROBES`] candidates whose estimates are closest to their group's
    /// lowest (ties: the earlier candidate).
    fn probes(&self) -> Vec<usize> {
        let mut closeness: BTreeMap<usize, Vec<(f64, usize)>> = BTreeMap::new();
        for (i, &e) in self.estimate.iter().enumerate() {
            let best = self.best_estimate(self.group_of[i]);
            if e.is_finite() && best > 0.0 {
                closeness.entry(self.target_of[i]).or_default().push((e / best, i));
            }
        }
        let mut probes = BTreeSet::new();
        for mut list in closeness.into_values() {
            list.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            probes.extend(list.iter().take(PROBES).map(|&(_, i)| i));
        }
        probes.into_iter().collect()
    }

    /// Per target, the median of measured / estimated time over its measured candidates (targets with no
    /// such candidate are absent: their estimates stand as they are).
    fn calibration(&self, times: &[Option<f64>]) -> BTreeMap<usize, f64> {
        let mut ratios: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
        for (i, t) in times.iter().enumerate() {
            if let Some(t) = t {
                let e = self.estimate[i];
                if t.is_finite() && e.is_finite() && e > 0.0 && *t > 0.0 {
                    ratios.entry(self.target_of[i]).or_default().push(t / e);
                }
            }
        }
        ratios
            .into_iter()
            .map(|(t, mut r)| {
                r.sort_by(f64::total_cmp);
                (t, r[r.len() / 2])
            })
            .collect()
    }

    /// Every candidate's estimate times its target's calibration.
    fn calibrated(&self, times: &[Option<f64>]) -> Vec<f64> {
        let cal = self.calibration(times);
        self.estimate.iter().enumerate().map(|(i, e)| e * cal.get(&self.target_of[i]).copied().unwrap_or(1.0)).collect()
    }

    /// The costs the rounds search with: measured times, and every other candidate at its optimistic bound.
    fn optimistic(&self, times: &[Option<f64>]) -> Vec<f64> {
        let calibrated = self.calibrated(times);
        times.iter().zip(calibrated).map(|(t, c)| t.unwrap_or(c / SLACK)).collect()
    }

    /// The rounds of the module documentation: `measure` times candidates (in their default configurations),
    /// `search` gives the candidates of the plans for costs. The first round measures the probes and the
    /// plans' candidates at uncalibrated bounds together (one compile batch less).
    fn rounds(&self, measure: &mut dyn FnMut(&[usize]) -> Result<Vec<f64>>, search: &dyn Fn(&[f64]) -> Result<Vec<usize>>) -> Result<Rounds> {
        let mut times: Vec<Option<f64>> = vec![None; self.estimate.len()];
        let mut next: BTreeSet<usize> = self.probes().into_iter().collect();
        next.extend(search(&self.optimistic(&times))?);
        let mut rounds = 0;
        loop {
            let which: Vec<usize> = next.into_iter().collect();
            for (&i, us) in which.iter().zip(measure(&which)?) {
                times[i] = Some(us);
            }
            rounds += 1;
            let winners = search(&self.optimistic(&times))?;
            next = winners.iter().copied().filter(|&i| times[i].is_none()).collect();
            if next.is_empty() {
                return Ok(Rounds { times, winners, rounds });
            }
        }
    }

    /// The candidates to tune in every configuration: the plan's (`winners`), and the measured candidates
    /// within [`CONFIG_SLACK`] of a winner on the same nodes.
    fn competitive(&self, winners: &[usize], times: &[Option<f64>]) -> Vec<usize> {
        let mut out = BTreeSet::new();
        for &w in winners {
            let Some(best) = times[w] else { continue };
            out.extend(self.groups[self.group_of[w]].iter().copied().filter(|&i| times[i].is_some_and(|t| t.is_finite() && t <= CONFIG_SLACK * best)));
        }
        out.into_iter().collect()
    }
}

#[cfg(test)]
#[path = "prune_tests.rs"]
mod tests;
