//! Artifacts holding several plans, one per batch size (format version
//! [`BATCHED_FORMAT_VERSION`](super::BATCHED_FORMAT_VERSION)): the way TensorRT's optimization profiles let one
//! engine serve many batch sizes, with the weights stored once.
//!
//! Each plan is a whole [`Body`] as the linker wrote it for the model compiled at that batch size (its own
//! steps, modules and memory plan); the plans share one data section in which every constant is stored once,
//! by content digest, whichever plans name it. The runtime picks, for an input of batch `b`, the plan of the
//! smallest batch size `>= b` ([`choose`]), zero-pads the inputs to it and returns the first `b` rows of every
//! output ([`crate::batch`]).
//!
//! What makes that sound, and what [`validate`] therefore requires of every file: at least two plans, batch
//! sizes strictly ascending from 1 up; one model name; the same inputs and outputs in every plan (names,
//! dtypes, ranks, every dimension but the first), each of rank 1 or more with its leading dimension equal to the
//! plan's batch size; and one offset and type per constant digest across all plans (the weights stored once).
//! Padding rows are zeros: a model whose rows interact (a reduction over the batch) would give other results
//! for the real rows, which the compiler's check of every plan against the reference catches for the models
//! it builds.

use super::header;
use super::{align_up, validate, BatchPlan, BatchedBody, Body, BodyError, ConstDesc};
use std::collections::BTreeMap;

/// Why no plan serves a run ([`choose`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChooseError {
    /// The inputs have no rows.
    #[error("a batch of 0 rows: inputs must have at least one row")]
    NoRows,
    /// More rows than the largest plan takes; `sizes` are the batch sizes the artifact serves.
    #[error("batch {batch} is larger than the largest plan ({largest}); the artifact serves batch sizes up to it ({})", list(.sizes))]
    TooLarge { batch: usize, largest: usize, sizes: Vec<usize> },
}

/// The index of the plan serving a run of `batch`: the smallest of `batches` (ascending) at least `batch`.
pub fn choose(batches: &[usize], batch: usize) -> Result<usize, ChooseError> {
    if batch == 0 {
        return Err(ChooseError::NoRows);
    }
    batches
        .iter()
        .position(|&b| b >= batch)
        .ok_or_else(|| ChooseError::TooLarge { batch, largest: batches.last().copied().unwrap_or(0), sizes: batches.to_vec() })
}

/// Batch sizes as `1, 8`.
pub fn list(batches: &[usize]) -> String {
    batches.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", ")
}

/// Joins single-plan payloads (`(batch size, payload)`, as the linker wrote them, without provenance) into one
/// batched payload: every constant stored once in a shared data section (in order of first use, plans in
/// ascending batch order), each plan's constant offsets rewritten to it. Pure: the same payloads give the same
/// bytes. The message of an error names the plan (by batch size) at fault.
pub fn join(payloads: &[(u64, &[u8])]) -> Result<Vec<u8>, BodyError> {
    let mut plans = Vec::with_capacity(payloads.len());
    let mut data: Vec<u8> = Vec::new();
    // Digest -> (offset in the shared section, type): the first plan to name a constant places it.
    let mut placed: BTreeMap<[u8; 32], ConstDesc> = BTreeMap::new();
    for &(batch, bytes) in payloads {
        let at = |msg: String| BodyError::Batched(format!("plan for batch {batch}: {msg}"));
        let d = header::decode(bytes).map_err(|e| at(e.to_string()))?;
        if !d.batches.is_empty() || d.provenance.is_some() {
            return Err(at("expected a single-plan payload as the linker writes it (no plans of its own, no provenance)".into()));
        }
        let mut body = d.plans.into_iter().next().expect("a single-plan file has one body");
        validate::body(&body, d.data.len() as u64).map_err(|e| e.context(format_args!("plan for batch {batch}")))?;
        for c in &mut body.constants {
            let bytes = &d.data[c.offset as usize..c.offset as usize + c.ty.size_bytes()];
            let shared = placed.entry(c.digest).or_insert_with(|| {
                data.resize(align_up(data.len() as u64) as usize, 0);
                let offset = data.len() as u64;
                data.extend_from_slice(bytes);
                ConstDesc { ty: c.ty.clone(), digest: c.digest, offset }
            });
            if shared.ty != c.ty {
                return Err(at(format!("constant {} has type {}, another plan's constant of the same digest {}", hex(&c.digest), c.ty, shared.ty)));
            }
            c.offset = shared.offset;
        }
        plans.push(BatchPlan { batch, body });
    }
    let body = BatchedBody { plans };
    validate(&body, data.len() as u64)?;
    header::encode_batched(&body, &data).map_err(|e| BodyError::Batched(format!("cannot encode the plans: {e}")))
}

fn hex(d: &[u8; 32]) -> String {
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Checks a batched body whose data section is `data_len` bytes long (the rules in the module documentation);
/// the message names the plan, input, output or constant at fault.
pub fn validate(b: &BatchedBody, data_len: u64) -> Result<(), BodyError> {
    if b.plans.len() < 2 {
        return Err(BodyError::Batched(format!("a batched artifact holds at least two plans, this one {}", b.plans.len())));
    }
    let first = &b.plans[0];
    let mut previous = 0u64;
    let mut consts: BTreeMap<[u8; 32], (u64, &super::TensorType)> = BTreeMap::new();
    for p in &b.plans {
        let at = |msg: String| BodyError::Batched(format!("plan for batch {}: {msg}", p.batch));
        if p.batch <= previous {
            return Err(at(format!("batch sizes must be ascending from 1 and distinct (the plan before is for batch {previous})")));
        }
        previous = p.batch;
        validate::body(&p.body, data_len).map_err(|e| e.context(format_args!("plan for batch {}", p.batch)))?;
        if p.body.model != first.body.model {
            return Err(at(format!("model '{}', the first plan's is '{}'", p.body.model, first.body.model)));
        }
        let ins = |body: &Body| body.inputs.iter().map(|d| (d.name.clone(), d.ty.clone())).collect::<Vec<_>>();
        let outs = |body: &Body| body.outputs.iter().map(|d| (d.name.clone(), d.ty.clone())).collect::<Vec<_>>();
        for (what, mine, firsts) in [("input", ins(&p.body), ins(&first.body)), ("output", outs(&p.body), outs(&first.body))] {
            same_but_batch(what, p.batch, &mine, &firsts).map_err(|e| e.context(format_args!("plan for batch {}", p.batch)))?;
        }
        for c in &p.body.constants {
            let (offset, ty) = *consts.entry(c.digest).or_insert((c.offset, &c.ty));
            if offset != c.offset || ty != &c.ty {
                return Err(at(format!(
                    "constant {} is stored twice (offsets {offset} and {}): a batched artifact stores each once",
                    hex(&c.digest),
                    c.offset
                )));
            }
        }
    }
    Ok(())
}

/// Inputs (or outputs) of a plan for batch `batch` against the first plan's: the same names, dtypes and ranks,
/// the leading dimension the plan's batch size, every other dimension equal.
fn same_but_batch(what: &str, batch: u64, mine: &[(String, super::TensorType)], first: &[(String, super::TensorType)]) -> Result<(), BodyError> {
    let names = |l: &[(String, super::TensorType)]| l.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ");
    if mine.len() != first.len() || mine.iter().zip(first).any(|(a, b)| a.0 != b.0) {
        return Err(BodyError::Batched(format!("{what}s ({}) differ from the first plan's ({})", names(mine), names(first))));
    }
    for ((name, ty), (_, ty0)) in mine.iter().zip(first) {
        if ty.shape.first().map(|&d| d as u64) != Some(batch) {
            return Err(BodyError::Batched(format!(
                "{what} '{name}' is {ty}: its leading dimension is not the batch size {batch} (a batched model's inputs and outputs all lead with the batch)"
            )));
        }
        if ty.dtype != ty0.dtype || ty.shape.len() != ty0.shape.len() || ty.shape[1..] != ty0.shape[1..] {
            return Err(BodyError::Batched(format!("{what} '{name}' is {ty}, the first plan's is {ty0}: only the leading (batch) dimension may differ")));
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "batched_tests.rs"]
mod tests;
