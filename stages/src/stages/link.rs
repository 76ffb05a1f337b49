//! Stage 5, link: one model's modules, constants and execution plan into one artifact file
//! (format in [`tessera_kernels::artifact`]).
//!
//! The pipeline hands over a [`LinkInput`]: plain data, so it can be hashed as the stage's input. The linker
//! checks it (every index, every argument's type against the function's signature, every value written once
//! before it is read, every output defined), deduplicates constants by content digest, plans memory
//! ([`tessera_kernels::artifact::plan`]), and encodes. It is a pure function: the same input gives the same bytes.

use tessera_kernels::artifact::{self, align_up, plan, Body, Buf, ConstDesc, InputDesc, OutputDesc, Step, Transfer, ValueSlot, ALIGN};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use crate::backend::Module;
use crate::interp::INT_INPUT_BOUND;
use crate::ir::{Tensor, TensorType};
use crate::stage::{DevicePolicy, Stage};
use tessera_store::Digest;

/// A buffer named by the pipeline's plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ValueRef {
    /// Model input `i` of [`LinkInput::inputs`].
    Input(u32),
    /// Intermediate value `i` of [`LinkInput::values`].
    Value(u32),
    /// Constant `i` of [`LinkInput::constants`].
    Const(u32),
}

/// One call of the plan: function `function` of module `module`, with `args` = the function's inputs then its
/// outputs (the linker adds scratch).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkStep {
    pub module: u32,
    pub function: u32,
    pub args: Vec<ValueRef>,
}

/// Everything stage 5 needs for one model.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkInput {
    pub model: String,
    /// Model inputs in order, with their names as the model gives them.
    pub inputs: Vec<(String, TensorType)>,
    /// For each input, the exclusive upper bound of random integer values fed to it when the user gives none:
    /// what the reference interpreter uses for the model's graph (lower where an input indexes a gather). Empty
    /// means [`INT_INPUT_BOUND`] for every input; otherwise one per input.
    pub input_int_bounds: Vec<i64>,
    /// Model outputs in order, with their names as the model gives them.
    pub outputs: Vec<(String, ValueRef)>,
    /// Types of the intermediate values steps write.
    pub values: Vec<TensorType>,
    /// Constants steps read (duplicates allowed: stored once).
    #[serde(with = "tensor_list")]
    pub constants: Vec<Tensor>,
    pub modules: Vec<Module>,
    /// Steps in execution order.
    pub steps: Vec<LinkStep>,
}

/// The link input is invalid; names the model and the step, function, argument or name at fault.
#[derive(Debug, Clone, thiserror::Error)]
#[error("link {model}: {msg}")]
pub struct LinkError {
    pub model: String,
    pub msg: String,
}

/// Serde for `Vec<Tensor>` (the IR's `Tensor` is not serializable itself): each as its type and raw bytes.
mod tensor_list {
    use super::*;
    use serde::de::Error;
    use serde::{Deserializer, Serializer};

    #[derive(Serialize)]
    struct TensorRef<'a> {
        ty: &'a TensorType,
        #[serde(with = "serde_bytes_compat")]
        data: &'a [u8],
    }

    #[derive(Deserialize)]
    struct TensorOwned {
        ty: TensorType,
        data: Vec<u8>,
    }

    /// Bytes as one serde byte string (postcard: a length and the raw bytes).
    mod serde_bytes_compat {
        pub fn serialize<S: serde::Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(b)
        }
    }

    pub fn serialize<S: Serializer>(v: &[Tensor], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|t| TensorRef { ty: &t.ty, data: t.bytes() }))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Tensor>, D::Error> {
        let raw: Vec<TensorOwned> = Vec::deserialize(d)?;
        raw.into_iter().map(|t| Tensor::from_bytes(t.ty, t.data).map_err(D::Error::custom)).collect()
    }
}

/// Checks `input` and writes its artifact file.
pub fn link(input: &LinkInput) -> Result<Vec<u8>, LinkError> {
    let fail = |msg: String| LinkError { model: input.model.clone(), msg };
    if input.model.is_empty() {
        return Err(fail("the model name is empty".into()));
    }
    let bounds = int_bounds(input).map_err(fail)?;

    // Constants: unique by digest, in order of first use (steps, then outputs), so the order is a function of
    // the plan alone. Constants nothing uses are left out.
    let mut unique: Vec<&Tensor> = Vec::new();
    let mut by_digest: BTreeMap<[u8; 32], u32> = BTreeMap::new();
    let mut const_slot: Vec<Option<u32>> = vec![None; input.constants.len()];
    let mut buf = |r: ValueRef, at: &dyn Fn() -> String| -> Result<Buf, String> {
        let exists = |i: u32, n: usize, what: &str| if (i as usize) < n { Ok(()) } else { Err(format!("{}: {what} {i} does not exist ({n} declared)", at())) };
        Ok(match r {
            ValueRef::Input(i) => exists(i, input.inputs.len(), "input").map(|_| Buf::Input(i))?,
            ValueRef::Value(i) => exists(i, input.values.len(), "value").map(|_| Buf::Value(i))?,
            ValueRef::Const(i) => {
                exists(i, input.constants.len(), "constant")?;
                let slot = &mut const_slot[i as usize];
                let u = *slot.get_or_insert_with(|| {
                    let t = &input.constants[i as usize];
                    *by_digest.entry(t.digest()).or_insert_with(|| {
                        unique.push(t);
                        unique.len() as u32 - 1
                    })
                });
                Buf::Const(u)
            }
        })
    };

    let mut steps = Vec::with_capacity(input.steps.len());
    let mut scratch_bytes = 0u64;
    for (s, step) in input.steps.iter().enumerate() {
        let mut args = Vec::with_capacity(step.args.len() + 1);
        for (k, &r) in step.args.iter().enumerate() {
            args.push(buf(r, &|| format!("step {s} argument {k}")).map_err(fail)?);
        }
        // Unknown modules or functions are reported by validation, with the step named.
        let f = input.modules.get(step.module as usize).and_then(|m| m.functions.get(step.function as usize));
        if let Some(f) = f.filter(|f| f.scratch_bytes > 0) {
            args.push(Buf::Scratch);
            scratch_bytes = scratch_bytes.max(f.scratch_bytes);
        }
        steps.push(Step { module: step.module, function: step.function, args });
    }
    let mut outputs = Vec::with_capacity(input.outputs.len());
    for (name, r) in &input.outputs {
        let source = buf(*r, &|| format!("output '{name}'")).map_err(fail)?;
        let ty = match *r {
            ValueRef::Input(i) => input.inputs[i as usize].1.clone(),
            ValueRef::Value(i) => input.values[i as usize].clone(),
            ValueRef::Const(i) => input.constants[i as usize].ty.clone(),
        };
        outputs.push(OutputDesc { name: name.clone(), ty, source });
    }

    let mut data = Vec::new();
    let mut constants = Vec::with_capacity(unique.len());
    for t in &unique {
        data.resize(align_up(data.len() as u64) as usize, 0);
        constants.push(ConstDesc { ty: t.ty.clone(), digest: t.digest(), offset: data.len() as u64 });
        data.extend_from_slice(t.bytes());
    }

    let mut body = Body {
        model: input.model.clone(),
        inputs: input
            .inputs
            .iter()
            .zip(bounds)
            .map(|((name, ty), int_bound)| InputDesc { name: name.clone(), ty: ty.clone(), int_bound, offset: 0 })
            .collect(),
        outputs,
        values: input.values.iter().map(|ty| ValueSlot { ty: ty.clone(), offset: 0 }).collect(),
        arena_bytes: 0,
        scratch_bytes,
        steps,
        modules: input.modules.clone(),
        constants,
        transfers: Vec::new(),
    };
    body.transfers = transfers(&body).map_err(fail)?;
    let (offsets, arena_bytes) = plan::assign(&plan::requests(&body));
    let (input_offsets, value_offsets) = offsets.split_at(body.inputs.len());
    body.inputs.iter_mut().zip(input_offsets).for_each(|(d, &o)| d.offset = o);
    body.values.iter_mut().zip(value_offsets).for_each(|(d, &o)| d.offset = o);
    body.arena_bytes = arena_bytes;
    debug_assert_eq!(body.arena_bytes % ALIGN, 0);

    artifact::validate_body(&body, data.len() as u64).map_err(|e| fail(e.to_string()))?;
    artifact::encode(&body, &data).map_err(|e| fail(format!("cannot encode the body: {e}")))
}

/// The copies a plan mixing host and GPU modules needs: a value read by a step at the other place than the
/// one that wrote it is copied there just before its first such reader, and stays there for the rest. A plan
/// in one place needs none. Indices are checked by validation afterwards; here a bad one is an error too.
fn transfers(body: &Body) -> Result<Vec<Transfer>, String> {
    let place = |s: usize, m: u32| {
        body.modules.get(m as usize).map(|m| m.format.place()).ok_or_else(|| format!("step {s} calls module {m} of {}", body.modules.len()))
    };
    let mut at: Vec<[bool; 2]> = vec![[false; 2]; body.values.len()];
    let mut out = Vec::new();
    for (s, step) in body.steps.iter().enumerate() {
        let p = place(s, step.module)?;
        let n_in = body.modules[step.module as usize].functions.get(step.function as usize).map_or(0, |f| f.inputs.len());
        for (k, &arg) in step.args.iter().enumerate() {
            let Buf::Value(v) = arg else { continue };
            let Some(here) = at.get_mut(v as usize) else { continue };
            if k >= n_in {
                here[p as usize] = true;
            } else if !here[p as usize] && here != &[false; 2] {
                out.push(Transfer { before: s as u32, value: v, to: p });
                here[p as usize] = true;
            }
        }
    }
    Ok(out)
}

fn int_bounds(input: &LinkInput) -> Result<Vec<i64>, String> {
    let b = &input.input_int_bounds;
    if b.is_empty() {
        return Ok(vec![INT_INPUT_BOUND; input.inputs.len()]);
    }
    if b.len() != input.inputs.len() {
        return Err(format!("{} random integer bounds for {} inputs", b.len(), input.inputs.len()));
    }
    if let Some(i) = b.iter().position(|&x| x < 1) {
        return Err(format!("input '{}' has random integer bound {}, below 1", input.inputs[i].0, b[i]));
    }
    Ok(b.clone())
}

// ---- the stage -----------------------------------------------------------------------------------

/// The link stage's code version.
pub const LINK_VERSION: u32 = 2;

/// The code version of the link stages ([`Link`], [`LinkBatches`]): what an artifact's layout follows.
pub fn code_version() -> crate::code::CodeVersion {
    crate::code::CodeVersion::new(LINK_VERSION, &[crate::code::digests::LINK, crate::code::runtime_digests::ARTIFACT])
}

/// Stage: link one plan's modules and constants into the artifact. Its output is the artifact file's bytes.
pub struct Link<'a> {
    pub plan_digest: &'a Digest,
    pub modules: &'a [Digest],
    /// Key ingredient: the artifact format's version ([`tessera_kernels::artifact::FORMAT_VERSION`]).
    pub format_version: u32,
    /// The means: the link input (built from the plan and the modules named above).
    pub input: &'a (dyn Fn() -> anyhow::Result<LinkInput> + Sync),
}

impl Stage for Link<'_> {
    const NAME: &'static str = "link";
    const DEVICE: DevicePolicy = DevicePolicy::Busy;
    type Output = Vec<u8>;
    fn version(&self) -> crate::code::CodeVersion {
        code_version()
    }
    fn key(&self) -> anyhow::Result<Digest> {
        Ok(self
            .key_builder()
            .input_digest("plan", self.plan_digest)
            .input("modules", self.modules)
            .env("artifact_format", &self.format_version)
            .finish()?)
    }
    fn compute(&self) -> anyhow::Result<Vec<u8>> {
        Ok(link(&(self.input)()?)?)
    }
    // The artifact is stored as the file's bytes.
    fn encode(out: &Vec<u8>) -> anyhow::Result<Vec<u8>> {
        Ok(out.clone())
    }
    fn decode(bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
        Ok(bytes.to_vec())
    }
}


/// Stage: join the single-plan artifacts of one model compiled at several batch sizes into one batched
/// artifact, every constant stored once ([`tessera_kernels::artifact::batched::join`]). Its output is the
/// batched payload's bytes.
pub struct LinkBatches<'a> {
    pub model: &'a str,
    /// (batch size, the payload digest of the model's artifact at that size), batch sizes ascending.
    pub plans: &'a [(u64, Digest)],
    /// Key ingredient: the batched format's version ([`tessera_kernels::artifact::BATCHED_FORMAT_VERSION`]).
    pub format_version: u32,
    /// The means: the payloads the digests above name, in the same order.
    pub payloads: &'a (dyn Fn() -> anyhow::Result<Vec<Vec<u8>>> + Sync),
}

impl Stage for LinkBatches<'_> {
    const NAME: &'static str = "link-batches";
    const DEVICE: DevicePolicy = DevicePolicy::Busy;
    type Output = Vec<u8>;
    fn version(&self) -> crate::code::CodeVersion {
        code_version()
    }
    // The model's name is in every plan's body, so in the digests: the key needs only them.
    fn key(&self) -> anyhow::Result<Digest> {
        Ok(self.key_builder().input("plans", self.plans).env("artifact_format", &self.format_version).finish()?)
    }
    fn compute(&self) -> anyhow::Result<Vec<u8>> {
        let payloads = (self.payloads)()?;
        let plans: Vec<(u64, &[u8])> = self.plans.iter().zip(&payloads).map(|((b, _), p)| (*b, p.as_slice())).collect();
        tessera_kernels::artifact::batched::join(&plans).map_err(|e| anyhow::Error::new(LinkError { model: self.model.to_string(), msg: e.to_string() }))
    }
    fn encode(out: &Vec<u8>) -> anyhow::Result<Vec<u8>> {
        Ok(out.clone())
    }
    fn decode(bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
        Ok(bytes.to_vec())
    }
}
