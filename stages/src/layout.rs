//! Stage: layout. The model's graph document with its convolution chains channels-last, for `-layout=nhwc`
//! (see [`crate::passes::layout`]), between precision and partition.
//!
//! It runs only for `-layout=nhwc`: an nchw build partitions the document the precision stage made, so adding
//! the stage changed no nchw key. Keyed by that document's digest, so every model's channels-last graph (and
//! its permuted weights, stored by digest) is computed once and shared by every target set asking for it.

use crate::context::{Ctx, LazyGraph};
use crate::ir::{serial::GraphDoc, Graph, Tensor};
use crate::stage::{run_digest, DevicePolicy, Stage};
use crate::target::Layout;
use anyhow::{Context, Result};
use std::sync::OnceLock;
use tessera_store::Digest;

/// The stage's code version (with [`crate::passes::PASSES_VERSION`] in the key: the rewrite is a pass).
pub const LAYOUT_VERSION: u32 = 1;

/// Stage: layout. Output: the rewritten graph document (constants stored separately, by digest).
pub struct ChannelsLast<'a> {
    /// The document it rewrites.
    pub doc: Digest,
    pub graph: &'a LazyGraph<'a>,
    pub store: &'a tessera_store::Store,
    pub(crate) built: OnceLock<Graph>,
}

impl Stage for ChannelsLast<'_> {
    const NAME: &'static str = "layout";
    const DEVICE: DevicePolicy = DevicePolicy::Busy;
    type Output = Vec<u8>;
    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(LAYOUT_VERSION, &[crate::code::digests::LAYOUT])
    }
    fn key(&self) -> Result<Digest> {
        Ok(self.key_builder().env("passes", &crate::passes::code_version()).input_digest("graph", &self.doc).input("layout", &Layout::Nhwc).finish()?)
    }
    fn compute(&self) -> Result<Vec<u8>> {
        let g = self.graph.get()?;
        let h = crate::passes::layout::to_channels_last(g).with_context(|| format!("graph '{}': rewriting it channels-last", g.name))?;
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

/// The document the partition stage works on for `ctx`'s layout, and its graph if it was built here: `doc`
/// itself for nchw.
pub fn for_targets<'a>(ctx: &Ctx<'a>, doc: Digest, graph: LazyGraph<'a>) -> Result<(Digest, LazyGraph<'a>)> {
    if ctx.targets.layout()? == Layout::Nchw {
        return Ok((doc, graph));
    }
    let stage = ChannelsLast { doc, graph: &graph, store: ctx.driver.store(), built: OnceLock::new() };
    let rewritten = run_digest(ctx.driver, &stage)?;
    let built = stage.built.into_inner();
    Ok((rewritten, LazyGraph::new(ctx.driver, rewritten, built)))
}
