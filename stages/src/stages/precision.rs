//! Stage: precision. The model's graph document rewritten for the precision its targets ask for
//! (`-precision=fp16` or `bf16` on GPU targets; see [`crate::passes::precision`]), between load and partition.
//!
//! It runs only for reduced precision: an fp32 build partitions the loaded document itself, so adding the
//! stage changed no fp32 key.
//!
//! Overflow: the calibrate stage ([`crate::stages::calibrate`]) runs the reference on calibration inputs first, and
//! every node that reads or writes a float value beyond [`LIMIT`] (f16's largest finite value with a
//! headroom of 2, for inputs a little larger than the calibration ones) either computes in fp32, between
//! casts (`-overflow=keep-fp32`, the default), in bf16 between casts (`-overflow=bf16`: fp32's range at half
//! the bytes, and tensor cores), or fails the build naming it and the value seen (`-overflow=error`). bf16
//! builds need none of this: bf16 has fp32's range. Without this an fp16 artifact of such a model returns inf or NaN for inputs like
//! the ones it is checked with. Which nodes were kept and why: [`kept_nodes`] (`tessera explain`). Keyed by the loaded document's digest and the precision, so every model's
//! fp16 graph (and its f16 constants, stored by digest) is computed once and shared by every target set
//! that asks for it.

use crate::calibration::{CalibrationInputs, Ranges};
use crate::stages::calibrate::Calibrate;
use crate::context::{Ctx, LazyGraph};
use crate::ir::{serial::GraphDoc, DType, Graph, Tensor};
use crate::stage::{run, run_digest, DevicePolicy, Stage};
use crate::target::{Overflow, Precision};
use anyhow::{Context, Result};
use std::sync::OnceLock;
use tessera_store::Digest;

/// The stage's code version (with [`crate::passes::PASSES_VERSION`] in the key: the rewrite is a pass).
pub const PRECISION_VERSION: u32 = 2;

/// Values beyond this magnitude make their nodes compute in fp32 (or fail, `-overflow=error`): f16's largest
/// finite value, 65504, halved for headroom.
pub const LIMIT: f32 = 65504.0 / 2.0;

/// A node of the loaded graph kept in fp32, and the largest magnitude it read or wrote on the calibration
/// inputs.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct KeptNode {
    pub index: usize,
    pub name: String,
    pub op: String,
    pub max_abs: f32,
}

/// The nodes of `g` (the loaded, fp32 graph) whose float inputs or outputs exceed [`LIMIT`] on the
/// calibration inputs `ranges`, in node order.
pub fn kept_nodes(g: &Graph, ranges: &Ranges) -> Vec<KeptNode> {
    let mut kept = Vec::new();
    for (i, node) in g.nodes.iter().enumerate() {
        let seen = node.inputs.iter().chain(&node.outputs).filter_map(|&v| ranges.max_abs_of(g, v)).fold(0f32, f32::max);
        if seen > LIMIT {
            kept.push(KeptNode { index: i, name: node.name.clone(), op: node.op.name().to_string(), max_abs: seen });
        }
    }
    kept
}

/// The type `-overflow` computes the nodes leaving fp16's range in (f32 also for `error`, which keeps none).
pub fn kept_dtype(overflow: Overflow) -> DType {
    match overflow {
        Overflow::Bf16 => DType::BF16,
        Overflow::KeepFp32 | Overflow::Error => DType::F32,
    }
}

/// Stage: precision. Output: the rewritten graph document (constants stored separately, by digest).
pub struct ReducePrecision<'a> {
    /// The loaded document.
    pub doc: Digest,
    pub graph: &'a LazyGraph<'a>,
    pub precision: Precision,
    pub overflow: Overflow,
    /// The calibrate stage's output for `doc`: its digest (the key's ingredient) and value; fp16 only (bf16
    /// has fp32's range, so nothing is kept and nothing calibrated).
    pub ranges: Option<(Digest, Ranges)>,
    pub store: &'a tessera_store::Store,
    pub(crate) built: OnceLock<Graph>,
}

impl Stage for ReducePrecision<'_> {
    const NAME: &'static str = "precision";
    const DEVICE: DevicePolicy = DevicePolicy::Busy;
    type Output = Vec<u8>;
    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(PRECISION_VERSION, &[crate::code::digests::PRECISION])
    }
    fn key(&self) -> Result<Digest> {
        let mut k = self
            .key_builder()
            .env("passes", &crate::passes::code_version())
            .input_digest("graph", &self.doc)
            .input("precision", &self.precision)
            .input("overflow", &self.overflow);
        if let Some((ranges, _)) = &self.ranges {
            k = k.input_digest("ranges", ranges);
        }
        Ok(k.finish()?)
    }
    fn compute(&self) -> Result<Vec<u8>> {
        let g = self.graph.get()?;
        let h = match self.precision {
            Precision::Fp16 => {
                let Some((_, ranges)) = &self.ranges else { anyhow::bail!("graph '{}': fp16 needs the calibration ranges", g.name) };
                let kept = kept_nodes(g, ranges);
                if self.overflow == Overflow::Error && !kept.is_empty() {
                    let shown: Vec<String> = kept.iter().take(5).map(|k| format!("node '{}' ({}) reaches {:.4e}", k.name, k.op, k.max_abs)).collect();
                    anyhow::bail!(
                        "graph '{}': {} node(s) leave fp16's range (65504, with headroom {LIMIT}) on the calibration inputs: {}{}; -overflow=keep-fp32 computes them in fp32, -overflow=bf16 in bf16, or compile with -precision=bf16 or fp32",
                        g.name,
                        kept.len(),
                        shown.join("; "),
                        if kept.len() > 5 { "; ..." } else { "" }
                    );
                }
                let mut keep = vec![false; g.nodes.len()];
                for k in &kept {
                    keep[k.index] = true;
                }
                let kept_in = kept_dtype(self.overflow);
                crate::passes::precision::to_narrow_keeping(g, DType::F16, &keep, kept_in).with_context(|| format!("graph '{}': rewriting it in fp16", g.name))?
            }
            // bf16 has fp32's range: nothing leaves it that the fp32 graph keeps, so no node is kept.
            Precision::Bf16 => crate::passes::precision::to_narrow(g, DType::BF16).with_context(|| format!("graph '{}': rewriting it in bf16", g.name))?,
            Precision::Fp32 => g.clone(),
        };
        let doc = GraphDoc::from_graph(&h, |t: &Tensor| self.store.put(t.bytes()))?;
        let bytes = postcard::to_stdvec(&doc)?;
        let _ = self.built.set(h);
        Ok(bytes)
    }
    // Stored as the postcard encoding of `GraphDoc` itself, as the load stage stores its document.
    fn encode(out: &Vec<u8>) -> Result<Vec<u8>> {
        Ok(out.clone())
    }
    fn decode(bytes: &[u8]) -> Result<Vec<u8>> {
        Ok(bytes.to_vec())
    }
}

/// What an fp16 build started from: the loaded graph and its calibration ranges (what [`kept_nodes`] reads to
/// say which nodes stayed in fp32, or bf16, and why).
pub struct Calibrated<'a> {
    pub loaded: LazyGraph<'a>,
    pub ranges: Ranges,
}

impl Calibrated<'_> {
    /// The nodes kept in fp32, by their names (the reduced graph keeps them).
    pub fn kept(&self) -> Result<Vec<KeptNode>> {
        Ok(kept_nodes(self.loaded.get()?, &self.ranges))
    }
}

/// The document the partition stage works on for `ctx`'s precision, and its graph if it was built here:
/// the loaded one itself for fp32; for reduced precision also what it was reduced from. `model` names the
/// model (whose calibration inputs `ctx.calibration` holds).
pub fn for_targets<'a>(ctx: &Ctx<'a>, model: &str, doc: Digest, graph: LazyGraph<'a>) -> Result<(Digest, LazyGraph<'a>, Option<Calibrated<'a>>)> {
    let precision = ctx.targets.precision()?;
    if precision == Precision::Fp32 {
        return Ok((doc, graph, None));
    }
    // Only fp16 can overflow where fp32 does not: bf16 builds skip the calibration (a reference run).
    let ranges = if precision == Precision::Fp16 {
        let given = ctx.calibration.map(|dir| dir.for_model(model)).transpose()?;
        Some(calibrate(ctx, doc, &graph, given.as_ref())?)
    } else {
        None
    };
    let overflow = ctx.targets.overflow()?;
    let stage = ReducePrecision { doc, graph: &graph, precision, overflow, ranges, store: ctx.driver.store(), built: OnceLock::new() };
    let reduced = run_digest(ctx.driver, &stage)?;
    let built = stage.built.into_inner();
    // The loaded graph is read again only for reports (which nodes stayed wide): not kept in memory.
    let calibrated = stage.ranges.map(|(_, ranges)| Calibrated { loaded: graph.unloaded(), ranges });
    Ok((reduced, LazyGraph::new(ctx.driver, reduced, built), calibrated))
}

/// The calibrate stage's output for the loaded document `doc` on the user's inputs `given` or the random
/// ones (memoized: computed once per model and inputs).
pub fn calibrate<'a>(ctx: &Ctx<'a>, doc: Digest, graph: &LazyGraph<'a>, given: Option<&CalibrationInputs>) -> Result<(Digest, Ranges)> {
    run(ctx.driver, &Calibrate { doc, graph, given })
}
