//! Stage: precision. The model's graph document rewritten for the precision its targets ask for
//! (`-precision=fp16` on GPU targets; see [`crate::passes::precision`]), between load and partition.
//!
//! It runs only for reduced precision: an fp32 build partitions the loaded document itself, so adding the
//! stage changed no fp32 key. Keyed by the loaded document's digest and the precision, so every model's
//! fp16 graph (and its f16 constants, stored by digest) is computed once and shared by every target set
//! that asks for it.

use crate::context::{Ctx, LazyGraph};
use crate::ir::{serial::GraphDoc, Graph, Tensor};
use crate::stage::{run_digest, DevicePolicy, Stage};
use crate::target::Precision;
use anyhow::{Context, Result};
use std::sync::OnceLock;
use tessera_store::Digest;

/// The stage's code version (with [`crate::passes::PASSES_VERSION`] in the key: the rewrite is a pass).
pub const PRECISION_VERSION: u32 = 1;

/// Stage: precision. Output: the rewritten graph document (constants stored separately, by digest).
pub struct ReducePrecision<'a> {
    /// The loaded document.
    pub doc: Digest,
    pub graph: &'a LazyGraph<'a>,
    pub precision: Precision,
    pub store: &'a tessera_store::Store,
    built: OnceLock<Graph>,
}

impl Stage for ReducePrecision<'_> {
    const NAME: &'static str = "precision";
    const DEVICE: DevicePolicy = DevicePolicy::Busy;
    type Output = Vec<u8>;
    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(PRECISION_VERSION, &[crate::code::digests::PRECISION])
    }
    fn key(&self) -> Result<Digest> {
        Ok(self.key_builder().env("passes", &crate::passes::code_version()).input_digest("graph", &self.doc).input("precision", &self.precision).finish()?)
    }
    fn compute(&self) -> Result<Vec<u8>> {
        let g = self.graph.get()?;
        let h = match self.precision {
            Precision::Fp16 => crate::passes::precision::to_half(g).with_context(|| format!("graph '{}': rewriting it in fp16", g.name))?,
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

/// The document the partition stage works on for `ctx`'s precision, and its graph if it was built here:
/// the loaded one itself for fp32.
pub fn for_targets<'a>(ctx: &Ctx<'a>, doc: Digest, graph: LazyGraph<'a>) -> Result<(Digest, LazyGraph<'a>)> {
    let precision = ctx.targets.precision()?;
    if precision == Precision::Fp32 {
        return Ok((doc, graph));
    }
    let stage = ReducePrecision { doc, graph: &graph, precision, store: ctx.driver.store(), built: OnceLock::new() };
    let reduced = run_digest(ctx.driver, &stage)?;
    let built = stage.built.into_inner();
    Ok((reduced, LazyGraph::new(ctx.driver, reduced, built)))
}
