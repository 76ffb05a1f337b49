//! Sharded builds: `tessera compile --shard I/N` compiles a deterministic share of the zoo, and
//! `tessera summary` merges the shards' summaries into one report.
//!
//! - [`spec`]: the `--shard` argument (`I/N`, or `auto/N` with the index from the job engine's environment).
//! - [`cost`]: an estimate of each model's build cost, computed before compiling.
//! - [`assign`]: the assignment of models to shards (longest processing time first), a pure function of the
//!   job list, so every shard computes the same assignment on its own.
//! - [`report`]: a shard's summary file, and merging all of them back into one [`crate::zoo::Summary`].

pub mod assign;
pub mod cost;
pub mod report;
pub mod spec;

pub use spec::{Shard, ShardArg};

use crate::job::ModelJob;
use assign::Weighted;
use report::Assigned;

/// Estimates every job's build cost and assigns the jobs to `count` shards (every shard computes the same).
pub fn plan(jobs: &[ModelJob], count: usize) -> Vec<Assigned> {
    let weighted: Vec<Weighted> =
        jobs.iter().zip(cost::estimate_all(jobs)).map(|(j, f)| Weighted { name: j.name.clone(), cost: f.cost() }).collect();
    report::assignment(&weighted, count)
}

/// The jobs `assignment` (made from `jobs`, same order) gives shard `index`, in input order.
pub fn select(jobs: &[ModelJob], assignment: &[Assigned], index: usize) -> Vec<ModelJob> {
    jobs.iter().zip(assignment).filter(|(_, a)| a.shard == index).map(|(j, _)| j.clone()).collect()
}
