//! Stage: calibrate. The range of every value of a model in fp32, found by running the reference
//! interpreter on calibration inputs, so that a reduced-precision build knows where values leave the
//! narrow type's range before it rewrites the graph (`crate::precision`), instead of shipping an artifact
//! that returns NaN for inputs like the ones it was compiled with.
//!
//! The calibration inputs are the random inputs the tests draw ([`random_inputs`], seeds
//! `1..=CALIBRATION_RUNS`): tessera checks every compiled model against the reference on such inputs, so
//! an artifact that keeps them in range passes its own check. Only values a node computes are measured;
//! constants are measured from their data by the reader ([`Ranges::max_abs_of`]).
//!
//! Magnitudes of 1e30 and more are not counted: exporters write "minus infinity" masks as f32's lowest
//! value (Hugging Face's `finfo.min`), meant as infinities, which fp16 saturates to +-65504 and softmax
//! still reads as "masked" (`passes::precision`). NaN and infinities are not counted either.
//!
//! Runs only for reduced precision, once per loaded document (memoized like every stage).

use crate::context::LazyGraph;
use crate::interp::{random_inputs, run_graph_observed};
use crate::ir::{Graph, ValueDef, ValueId};
use crate::stage::{DevicePolicy, Stage};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tessera_store::Digest;

/// The stage's code version.
pub const CALIBRATE_VERSION: u32 = 1;

/// How many calibration inputs are drawn (seeds 1..=this). One: the reference costs about as much as the
/// rest of a cold CPU-side build of the model (BERT-base: 2.5 s), and the headroom of `precision::LIMIT`
/// stands for the spread between inputs.
pub const CALIBRATION_RUNS: u64 = 1;

/// Magnitudes from here up are "infinity" sentinels, not values (see the module doc).
pub const SENTINEL: f32 = 1e30;

/// The largest magnitude each value reached over the calibration runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ranges {
    /// How many inputs were run.
    pub runs: u32,
    /// Per value of the loaded graph (by index): the largest finite magnitude below [`SENTINEL`] a node
    /// computed, over every run; None for values no node computes (inputs, constants) and non-float ones.
    pub max_abs: Vec<Option<f32>>,
}

impl Ranges {
    /// The largest magnitude of `v` in `g`: measured for computed values, read from the data for
    /// constants; None for graph inputs (drawn by the caller, in range by construction) and non-float values.
    pub fn max_abs_of(&self, g: &Graph, v: ValueId) -> Option<f32> {
        match &g.value(v).def {
            ValueDef::Const(t) if t.dtype().is_float() => Some(max_abs(&t.to_f32_vec())),
            _ => self.max_abs.get(v.index()).copied().flatten(),
        }
    }
}

/// The largest finite magnitude below [`SENTINEL`] among `xs` (0 for none).
pub fn max_abs(xs: &[f32]) -> f32 {
    xs.iter().filter(|x| x.is_finite() && x.abs() < SENTINEL).fold(0f32, |m, x| m.max(x.abs()))
}

/// Runs the reference on the calibration inputs and records every computed value's range.
pub fn measure(g: &Graph) -> Result<Ranges> {
    let mut max: Vec<Option<f32>> = vec![None; g.values.len()];
    for seed in 1..=CALIBRATION_RUNS {
        let inputs = random_inputs(g, seed);
        run_graph_observed(g, &inputs, |v, t| {
            if t.dtype().is_float() {
                let m = max_abs(&t.to_f32_vec());
                let slot = &mut max[v.index()];
                *slot = Some(slot.map_or(m, |old| old.max(m)));
            }
        })
        .with_context(|| format!("graph '{}': running the reference on calibration input {seed}", g.name))?;
    }
    Ok(Ranges { runs: CALIBRATION_RUNS as u32, max_abs: max })
}

/// Stage: calibrate. Output: [`Ranges`] of the loaded document.
pub struct Calibrate<'a> {
    /// The loaded document.
    pub doc: Digest,
    pub graph: &'a LazyGraph<'a>,
}

impl Stage for Calibrate<'_> {
    const NAME: &'static str = "calibrate";
    const DEVICE: DevicePolicy = DevicePolicy::Busy;
    type Output = Ranges;
    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(CALIBRATE_VERSION, &[crate::code::digests::CALIBRATE])
    }
    fn key(&self) -> Result<Digest> {
        Ok(self.key_builder().input_digest("graph", &self.doc).input("runs", &CALIBRATION_RUNS).finish()?)
    }
    fn compute(&self) -> Result<Ranges> {
        measure(self.graph.get()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, Op, Tensor, TensorType};

    #[test]
    fn ranges_cover_computed_values_and_skip_sentinels() {
        let mut g = Graph::new("m");
        let x = g.add_input("x", TensorType::f32([4]));
        let big = g.add_const("big", Tensor::from_f32([4], &[1e5, 2.0, -3.0, 4.0]));
        let low = g.add_const("low", Tensor::from_f32([1], &[f32::MIN]));
        let y = g.add("y", Op::Binary(BinaryOp::Mul), &[x, big]).unwrap();
        let m = g.add("m", Op::Binary(BinaryOp::Add), &[x, low]).unwrap();
        g.outputs = vec![y, m];
        let r = measure(&g).unwrap();
        assert_eq!(r.runs, CALIBRATION_RUNS as u32);
        assert!(r.max_abs_of(&g, y).unwrap() > 1e3, "{r:?}");
        assert!(r.max_abs_of(&g, m).unwrap() < 1e3, "the -3.4e38 mask is a sentinel, not a value: {r:?}");
        assert_eq!(r.max_abs_of(&g, big), Some(1e5));
        assert_eq!(r.max_abs_of(&g, x), None);
    }
}
