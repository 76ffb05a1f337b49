//! The estimated build cost of a model, for balancing shards: cheap next to compiling it (one graph load,
//! one pass over the nodes), and deterministic (integer arithmetic over the graph's nodes and shapes, the
//! same on every machine), so every shard computes the same figures.
//!
//! The figure is in nominal microseconds of build work:
//! `PER_MODEL_US + nodes * PER_NODE_US + run_us * RUNS + constant bytes / BYTES_PER_US`, where `run_us`
//! is the `c` backend's analytical run time of the whole model (its flop rates; `backend/c/cost.rs`).
//! With measured costs (the default) a cold build's time is mostly the tune stage timing candidates, which
//! grows with the model's run time and its number of nodes (the candidates); with analytical costs it is
//! mostly the weights (GPT-2's embeddings). The constants were fitted by hand to cold single-model builds
//! of the bundled zoo (`fixtures/zoo.toml`, release build, 2-core VM shared with other builds, so noisy;
//! 2026-11-24): measured-cost builds took 1.3 s (mlp3-b1) to 34.7 s (gpt2-2layer-b1-s128), the estimate is
//! within 25% on average, and its largest misses are the convolutional models (resnet18-b1: 10.6 s
//! estimated, 19.0 s taken; mobilenetv2-b1: 5.6 s against 10.5 s), whose kernels measure slower than the
//! `c` backend's flop rates say. Only the ratios between models matter for balancing.

use crate::job::{load_graph, ModelJob};
use rayon::prelude::*;
use tessera_stages::backend::c::cost::{GEMM_GFLOPS, SCALAR_GFLOPS};
use tessera_stages::backend::lowering::cost::flops;
use tessera_stages::ir::{Graph, NodeId};

/// Fixed work per model: the targets, validation trials, link, writing the artifact.
pub const PER_MODEL_US: u64 = 1_000_000;
/// Per node: candidates to partition and tune, kernels to lower and compile.
pub const PER_NODE_US: u64 = 30_000;
/// How many times a build runs the model's work while measuring (tuning and validation), in effect.
pub const RUNS: u64 = 40;
/// Bytes of weights generated, hashed, stored and linked per microsecond.
pub const BYTES_PER_US: u64 = 60;

/// What the estimate is made of, for reports and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    pub nodes: u64,
    /// Nominal run time of the whole model on the `c` backend, in microseconds.
    pub run_us: u64,
    pub constant_bytes: u64,
}

impl Features {
    pub fn of(g: &Graph) -> Self {
        let (mut gemm, mut other) = (0u128, 0u128);
        for (i, n) in g.nodes.iter().enumerate() {
            // `flops` reads a node's first input and output; a node without them costs nothing here.
            if n.inputs.is_empty() || n.outputs.is_empty() {
                continue;
            }
            let (a, b) = flops(g, NodeId(i as u32));
            gemm += a.max(0.0) as u128;
            other += b.max(0.0) as u128;
        }
        // flops / (GFLOP/s * 1e3) = microseconds.
        let run_us = gemm / (GEMM_GFLOPS as u128 * 1000) + other / (SCALAR_GFLOPS as u128 * 1000);
        Features {
            nodes: g.nodes.len() as u64,
            run_us: u64::try_from(run_us).unwrap_or(u64::MAX),
            constant_bytes: g.constant_bytes() as u64,
        }
    }

    /// The estimate, in nominal microseconds of build work.
    pub fn cost(&self) -> u64 {
        PER_MODEL_US
            .saturating_add(self.nodes.saturating_mul(PER_NODE_US))
            .saturating_add(self.run_us.saturating_mul(RUNS))
            .saturating_add(self.constant_bytes / BYTES_PER_US)
    }
}

/// Loads each job's graph (in parallel) and estimates its cost, in `jobs` order. A model that does not
/// load gets the fixed per-model cost only: it is assigned like any other, and the shard that takes it
/// reports the load error, as an unsharded build would (one bad model does not cost the rest).
pub fn estimate_all(jobs: &[ModelJob]) -> Vec<Features> {
    // A batched job is estimated by its largest plan, the one that costs most to compile and measure.
    let largest = |j: &ModelJob| j.plan_jobs().ok().and_then(|mut p| p.pop()).unwrap_or_else(|| j.clone());
    jobs.par_iter().map(|j| load_graph(&largest(j)).map(|g| Features::of(&g)).unwrap_or_default()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::ModelSource;

    fn fixture(name: &str, model: &str, batch: usize) -> ModelJob {
        let options = tessera_fixtures::ModelOptions { batch, seq: Some(16), image: None };
        let options = if model.starts_with("bert") { options } else { tessera_fixtures::ModelOptions { seq: None, ..options } };
        ModelJob { name: name.into(), source: ModelSource::Fixture { model: model.into(), options }, batches: vec![] }
    }

    #[test]
    fn estimates_are_deterministic_and_grow_with_the_model() {
        let jobs = [fixture("a", "mlp3", 1), fixture("b", "mlp3", 64), fixture("c", "bert-tiny", 1)];
        let f = estimate_all(&jobs);
        assert_eq!(f, estimate_all(&jobs), "two estimates of the same jobs differ");
        assert_eq!(f[0].nodes, f[1].nodes);
        assert!(f[1].run_us > f[0].run_us && f[1].cost() > f[0].cost(), "{f:?}");
        assert!(f[2].nodes > f[0].nodes && f[2].cost() > f[0].cost(), "{f:?}");
        assert!(f.iter().all(|f| f.constant_bytes > 0 && f.cost() > PER_MODEL_US));
    }

    #[test]
    fn a_model_that_does_not_load_costs_the_fixed_part_only() {
        let broken = ModelJob {
            name: "broken".into(),
            source: ModelSource::Onnx { path: "/nonexistent/broken.onnx".into(), shapes: Default::default() },
            batches: vec![],
        };
        let f = estimate_all(&[broken]);
        assert_eq!(f, [Features::default()]);
        assert_eq!(f[0].cost(), PER_MODEL_US);
    }
}
