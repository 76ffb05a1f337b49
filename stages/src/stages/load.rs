//! Stage 1, load: a model's graph (imported or built, then the graph passes) as a graph document, with
//! its constants stored separately by digest.

use crate::ir::{serial::GraphDoc, Graph, Tensor};
use crate::stage::{run_digest, DevicePolicy, Driver, Stage};
use anyhow::{bail, Result};
use std::sync::OnceLock;
use tessera_store::Digest;

/// The load stage's code version.
pub const LOAD_VERSION: u32 = 2;

/// Where a model's graph comes from (a fixture builder, an ONNX file): implemented by the pipeline, which
/// knows the fixtures.
pub trait GraphSource: Sync {
    /// The model's name.
    fn name(&self) -> &str;
    /// A digest of everything that determines the graph when that is known without building it (a
    /// fixture's recipe and the fixtures' version; an ONNX file's content, the external data files it names,
    /// its shapes and the importer's version), so a hit skips building; `None` when the graph must be built to
    /// be keyed. `driver` memoizes what computing it needs (an ONNX file's list of external data files).
    fn recipe(&self, driver: &dyn Driver) -> Result<Option<Digest>>;
    /// Builds the graph and runs the graph passes every stage expects.
    fn build(&self) -> Result<Graph>;
}

/// Stage: load. Output: the graph document (constants stored separately, by digest).
pub struct Load<'a> {
    pub source: &'a dyn GraphSource,
    pub store: &'a tessera_store::Store,
    /// Key ingredient: the source's recipe ([`GraphSource::recipe`], computed once per load).
    pub recipe: Option<Digest>,
    /// Key ingredient for sources without a recipe: the document's bytes, from a graph built beforehand.
    pub document: Option<Vec<u8>>,
    /// Key ingredient: the graph passes' version ([`crate::passes::PASSES_VERSION`]).
    pub passes_version: crate::code::CodeVersion,
    pub(crate) built: OnceLock<Graph>,
}

impl Load<'_> {
    fn document_of(&self, g: &Graph) -> Result<Vec<u8>> {
        let doc = GraphDoc::from_graph(g, |t: &Tensor| self.store.put(t.bytes()))?;
        Ok(postcard::to_stdvec(&doc)?)
    }
}

impl Stage for Load<'_> {
    const NAME: &'static str = "load";
    const DEVICE: DevicePolicy = DevicePolicy::Busy;
    type Output = Vec<u8>;
    fn version(&self) -> crate::code::CodeVersion {
        crate::code::CodeVersion::new(LOAD_VERSION, &[crate::code::digests::LOAD])
    }
    fn key(&self) -> Result<Digest> {
        let k = self.key_builder().env("passes", &self.passes_version);
        Ok(match (&self.document, self.recipe) {
            (_, Some(recipe)) => k.input_digest("recipe", &recipe),
            (Some(doc), None) => k.input_bytes("graph_document", doc),
            (None, None) => bail!("model {}: a source without a recipe is keyed by its built document", self.source.name()),
        }
        .finish()?)
    }
    fn compute(&self) -> Result<Vec<u8>> {
        if let Some(doc) = &self.document {
            return Ok(doc.clone());
        }
        let g = self.source.build()?;
        let bytes = self.document_of(&g)?;
        let _ = self.built.set(g);
        Ok(bytes)
    }
    // The document is stored as the postcard encoding of `GraphDoc` itself (what `load_value` reads).
    fn encode(out: &Vec<u8>) -> Result<Vec<u8>> {
        Ok(out.clone())
    }
    fn decode(bytes: &[u8]) -> Result<Vec<u8>> {
        Ok(bytes.to_vec())
    }
}

/// Runs the load stage of one model: the graph document's digest, and the graph if it was built.
pub fn load_model(ctx: &crate::context::Ctx, source: &dyn GraphSource) -> Result<(Digest, Option<Graph>)> {
    let store = ctx.driver.store();
    let recipe = source.recipe(ctx.driver)?;
    let mut load = Load { source, store, recipe, document: None, passes_version: crate::passes::code_version(), built: OnceLock::new() };
    if recipe.is_none() {
        let g = crate::stage::guarded(DevicePolicy::Busy, || source.build())?;
        load.document = Some(load.document_of(&g)?);
        let _ = load.built.set(g);
    }
    let doc = run_digest(ctx.driver, &load)?;
    Ok((doc, load.built.into_inner()))
}

