//! Running a batched artifact (one plan per batch size, see [`crate::artifact::batched`]): which plan serves
//! a run (by the format's rule, [`choose`]), and the padding in and slicing out that let a plan of batch `B`
//! serve a run of batch `b <= B`.
//!
//! A run's batch is the leading dimension of its inputs (all of them, equal). The plan is the one of the
//! smallest batch size `>= b`, as TensorRT picks an optimization profile; a batch above the largest plan is an
//! error naming the sizes the artifact serves. Where the plan is larger, every input is copied into a zeroed
//! buffer of the plan's shape (rows `b..B` zero) and every output's first `b` rows are returned: inputs and
//! outputs are row-major with the batch leading, so the first `b` rows are the first bytes.
//!
//! Memory: each plan is loaded as an artifact of its own ([`Artifact::plan_artifact`]) with its own modules,
//! memory plan and sessions (it was planned and checked as its own model), all of them sharing one copy of the
//! weights, as the file holds them once ([`Program::load_plans`]: one host copy, and for GPU plans one device
//! upload). This module sits outside the executor's code unit (`RUNTIME`, part of the code version of every
//! measurement): nothing here is used by a measurement.

use crate::artifact::batched::choose;
use crate::artifact::Artifact;
use crate::dtype::DType;
use crate::runtime::{Executable, Program, Registry, RuntimeError};
use crate::tensor::{Tensor, TensorType};
use std::borrow::Cow;

/// Where a run goes: the plan (its index and batch size) and the run's own batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dispatch {
    pub plan: usize,
    pub plan_batch: usize,
    pub batch: usize,
}

impl Dispatch {
    /// Whether the plan is larger than the run (inputs padded, outputs sliced).
    pub fn pads(&self) -> bool {
        self.batch != self.plan_batch
    }
}

/// Picks the plan for inputs of `given` (dtype and shape per input, in model order) against the plans' input
/// types (`plans[p][i]`: plan `p`'s input `i`, batch sizes `batches`): every input must have its dtype and rank,
/// every dimension but the first as the plans have it, and the same leading dimension as the others. The message
/// names the input at fault.
pub fn dispatch(batches: &[usize], names: &[&str], plan0: &[TensorType], given: &[(DType, &[usize])]) -> Result<Dispatch, String> {
    if given.len() != plan0.len() {
        return Err(format!("takes {} inputs ({}), got {}", plan0.len(), names.join(", "), given.len()));
    }
    let mut batch = None;
    for ((name, want), (dtype, shape)) in names.iter().zip(plan0).zip(given) {
        let shown = || TensorType::new(*dtype, shape.to_vec());
        if *dtype != want.dtype || shape.len() != want.shape.len() || shape.is_empty() || shape[1..] != want.shape[1..] {
            let mut any = want.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>();
            if let Some(first) = any.first_mut() {
                *first = "N".into();
            }
            return Err(format!(
                "input '{name}' must be {}[{}] with N up to {}, got {}",
                want.dtype,
                any.join("x"),
                batches.last().copied().unwrap_or(0),
                shown()
            ));
        }
        match batch {
            None => batch = Some((shape[0], *name)),
            Some((b, first)) if b != shape[0] => {
                return Err(format!("inputs disagree on the batch size: '{first}' has {b} rows, '{name}' {}", shape[0]));
            }
            Some(_) => {}
        }
    }
    let batch = batch.map_or(0, |(b, _)| b);
    let plan = choose(batches, batch).map_err(|e| e.to_string())?;
    Ok(Dispatch { plan, plan_batch: batches[plan], batch })
}

/// An input's bytes for the plan: as given when the plan's batch is the run's, else copied into `plan_bytes`
/// zeroed bytes (the given rows first, zero rows after).
pub fn pad<'a>(d: &Dispatch, given: &'a [u8], plan_bytes: usize) -> Cow<'a, [u8]> {
    if !d.pads() || given.len() >= plan_bytes {
        return Cow::Borrowed(given);
    }
    let mut v = vec![0u8; plan_bytes];
    v[..given.len()].copy_from_slice(given);
    Cow::Owned(v)
}

/// The bytes of the first `d.batch` rows of a plan's output of `plan_bytes` bytes.
pub fn rows_bytes(d: &Dispatch, plan_bytes: usize) -> usize {
    plan_bytes / d.plan_batch * d.batch
}

/// A plan's output cut to the run's batch (its first `d.batch` rows).
pub fn slice(d: &Dispatch, t: Tensor) -> Tensor {
    if !d.pads() {
        return t;
    }
    let mut ty = t.ty.clone();
    ty.shape[0] = d.batch;
    let n = rows_bytes(d, t.bytes().len());
    Tensor::from_bytes(ty, t.bytes()[..n].to_vec()).expect("a prefix of whole rows has its type's size")
}

/// Inputs as tensors of the plan's shapes (see [`pad`]).
pub fn pad_tensors(d: &Dispatch, inputs: &[Tensor], plan_inputs: &[TensorType]) -> Vec<Tensor> {
    inputs
        .iter()
        .zip(plan_inputs)
        .map(|(t, ty)| match pad(d, t.bytes(), ty.size_bytes()) {
            Cow::Borrowed(_) => t.clone(),
            Cow::Owned(v) => Tensor::from_bytes(ty.clone(), v).expect("padded to the plan's size"),
        })
        .collect()
}

/// An artifact loaded to run from one thread (`tessera run`), any plan of it: a batched artifact's runs go to
/// the smallest plan that fits (inputs padded, outputs sliced), an artifact of one plan's to it as they are.
pub struct BatchedExecutable {
    model: String,
    /// Empty for an artifact of one plan.
    batches: Vec<usize>,
    plans: Vec<Executable>,
}

impl BatchedExecutable {
    /// Loads every plan of `a` (through the built-in [`Registry`]).
    pub fn load(a: &Artifact) -> Result<BatchedExecutable, RuntimeError> {
        Self::load_with(a, Registry::builtin())
    }

    /// [`load`](Self::load), loading modules through `registry`. The plans share one copy of the constants.
    pub fn load_with(a: &Artifact, registry: &Registry) -> Result<BatchedExecutable, RuntimeError> {
        let plans = Program::load_plans(a, registry)?.into_iter().map(Executable::from_program).collect::<Result<_, _>>()?;
        Ok(BatchedExecutable { model: a.body.model.clone(), batches: a.batches().iter().map(|&b| b as usize).collect(), plans })
    }

    /// The batch sizes of the plans, ascending (empty for an artifact of one plan).
    pub fn batches(&self) -> &[usize] {
        &self.batches
    }

    /// Plan `i`, loaded (`0..` one more than the batch sizes' count, or 1). Panics on an index out of range.
    pub fn plan(&self, i: usize) -> &Executable {
        &self.plans[i]
    }

    /// Runs `inputs` (in the model's input order): on the one plan, or on the smallest plan that fits their
    /// batch, returning outputs of their batch.
    pub fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, RuntimeError> {
        if self.batches.is_empty() {
            return self.plans[0].run(inputs);
        }
        let first = &self.plans[0];
        let names: Vec<&str> = first.inputs().map(|(n, _)| n).collect();
        let types: Vec<TensorType> = first.inputs().map(|(_, t)| t.clone()).collect();
        let given: Vec<(DType, &[usize])> = inputs.iter().map(|t| (t.dtype(), t.shape())).collect();
        let d = dispatch(&self.batches, &names, &types, &given).map_err(|e| RuntimeError(format!("model '{}': {e}", self.model)))?;
        let plan = &mut self.plans[d.plan];
        let plan_types: Vec<TensorType> = plan.inputs().map(|(_, t)| t.clone()).collect();
        let out = plan.run(&pad_tensors(&d, inputs, &plan_types))?;
        Ok(out.into_iter().map(|t| slice(&d, t)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn dispatch_checks_every_input() {
        let plan0 = [TensorType::f32([1, 4]), TensorType::new(DType::I64, [1, 2, 3])];
        let names = ["x", "ids"];
        let ok = dispatch(&[1, 8], &names, &plan0, &[(DType::F32, &[5, 4]), (DType::I64, &[5, 2, 3])]).unwrap();
        assert_eq!(ok, Dispatch { plan: 1, plan_batch: 8, batch: 5 });
        assert!(ok.pads());
        let e = dispatch(&[1, 8], &names, &plan0, &[(DType::F32, &[5, 4]), (DType::I64, &[4, 2, 3])]).unwrap_err();
        assert!(e.contains("'x' has 5 rows, 'ids' 4"), "{e}");
        let e = dispatch(&[1, 8], &names, &plan0, &[(DType::F32, &[5, 3]), (DType::I64, &[5, 2, 3])]).unwrap_err();
        assert!(e.contains("input 'x' must be f32[Nx4] with N up to 8, got f32[5x3]"), "{e}");
        let e = dispatch(&[1, 8], &names, &plan0, &[(DType::F32, &[9, 4]), (DType::I64, &[9, 2, 3])]).unwrap_err();
        assert!(e.contains("batch 9"), "{e}");
        assert!(dispatch(&[1, 8], &names, &plan0, &[(DType::F32, &[5, 4])]).unwrap_err().contains("takes 2 inputs"));
    }

    proptest! {
        /// The plan chosen is the smallest that fits, padding keeps the given rows first and zeros after, and
        /// slicing the padded buffer gives back exactly the given rows.
        #[test]
        fn choice_padding_and_slicing(mut sizes in proptest::collection::btree_set(1usize..64, 1..6), batch in 1usize..80, row in 1usize..5, seed in any::<u8>()) {
            sizes.insert(1);
            let batches: Vec<usize> = sizes.into_iter().collect();
            let largest = *batches.last().unwrap();
            match choose(&batches, batch) {
                Err(_) => prop_assert!(batch > largest),
                Ok(p) => {
                    prop_assert!(batches[p] >= batch);
                    prop_assert!(p == 0 || batches[p - 1] < batch, "a smaller plan fits");
                    let d = Dispatch { plan: p, plan_batch: batches[p], batch };
                    let given: Vec<f32> = (0..batch * row).map(|i| (i as f32) + f32::from(seed) + 1.0).collect();
                    let t = Tensor::from_f32(vec![batch, row], &given);
                    let padded = pad_tensors(&d, std::slice::from_ref(&t), &[TensorType::f32([batches[p], row])]);
                    prop_assert_eq!(&padded[0].ty.shape, &vec![batches[p], row]);
                    let v = padded[0].to_f32_vec();
                    prop_assert_eq!(&v[..batch * row], &given[..]);
                    prop_assert!(v[batch * row..].iter().all(|&x| x == 0.0));
                    prop_assert_eq!(slice(&d, padded[0].clone()), t);
                }
            }
        }
    }
}
