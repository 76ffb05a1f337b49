//! A model to compile ([`ModelJob`]): where it comes from (a fixture, an ONNX file), its batch sizes, how its
//! graph is loaded and what keys its load stage. Below both the build ([`crate::build`]) and the provenance
//! its artifact records ([`crate::provenance`]).

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::PathBuf;
use tessera_stages::ir::Graph;
use tessera_stages::onnx::source as onnx_source;
use tessera_stages::stage::Driver;
use tessera_stages::stages::load::GraphSource;
use tessera_stages::stages::onnx_externals::ExternalFiles;
use tessera_store::{canonical_digest, Digest};

/// Where a model comes from.
#[derive(Clone, Debug)]
pub enum ModelSource {
    Fixture { model: String, options: tessera_fixtures::ModelOptions },
    Onnx { path: PathBuf, shapes: BTreeMap<String, Vec<usize>> },
}

/// One model to compile.
#[derive(Clone, Debug)]
pub struct ModelJob {
    pub name: String,
    pub source: ModelSource,
    /// Several batch sizes, ascending: one artifact holding a plan per size (`--batch 1,8`, a manifest's
    /// `batch = [1, 8]`), the source at the smallest. Empty: one plan, at the source's own batch.
    pub batches: Vec<usize>,
}

/// Imports or builds a model's graph and runs the graph passes every stage expects.
pub fn load_graph(job: &ModelJob) -> Result<Graph> {
    load_graph_of(job, None)
}

/// [`load_graph`]; with `file`, an ONNX model file is imported from bytes that must still have that blake3 (the
/// digest its recipe was made of), so the document recorded under a recipe is the one of the file it names.
fn load_graph_of(job: &ModelJob, file: Option<Digest>) -> Result<Graph> {
    let mut g = match &job.source {
        ModelSource::Fixture { model, options } => tessera_fixtures::build_with(model, options)?,
        ModelSource::Onnx { path, shapes } => {
            let opts = tessera_stages::onnx::ImportOptions { shapes: shapes.clone() };
            match file {
                None => tessera_stages::onnx::import_file(path, &opts)?,
                Some(want) => {
                    let bytes = std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
                    if Digest::of(&bytes) != want {
                        bail!("model {}: {} changed while it was being compiled", job.name, path.display());
                    }
                    let base = path.parent().map(|p| if p.as_os_str().is_empty() { std::path::Path::new(".") } else { p });
                    tessera_stages::onnx::import_bytes(&bytes, base, &path.display().to_string(), &opts)?
                }
            }
        }
    };
    g.name = job.name.clone();
    tessera_stages::passes::simplify::simplify(&mut g).with_context(|| format!("model {}: simplification", job.name))?;
    tessera_stages::passes::fold::fold_constants(&mut g).with_context(|| format!("model {}: constant folding", job.name))?;
    tessera_stages::ir::verify(&g)?;
    Ok(g)
}

impl ModelJob {
    /// The jobs of its plans: itself for one batch size; else one job per size, each of one batch size (a
    /// fixture built at it, an ONNX file's given shapes leading with it) and named as this job, since every
    /// plan of the artifact is the same model. Each is a model of its own to the stages, so the store shares
    /// what the sizes have in common (the weights, batch-independent kernels).
    pub fn plan_jobs(&self) -> Result<Vec<ModelJob>> {
        if self.batches.is_empty() {
            return Ok(vec![self.clone()]);
        }
        if let ModelSource::Onnx { shapes, .. } = &self.source {
            tessera_fixtures::batch::batch_leads(shapes).map_err(|e| anyhow::anyhow!("model {}: --batch: {e}", self.name))?;
        }
        Ok(self
            .batches
            .iter()
            .map(|&b| {
                let source = match &self.source {
                    ModelSource::Fixture { model, options } => ModelSource::Fixture { model: model.clone(), options: tessera_fixtures::ModelOptions { batch: b, ..*options } },
                    ModelSource::Onnx { path, shapes } => ModelSource::Onnx { path: path.clone(), shapes: tessera_fixtures::batch::shapes_at_batch(shapes, b) },
                };
                ModelJob { name: self.name.clone(), source, batches: Vec::new() }
            })
            .collect())
    }

    /// A fixture's recipe: its name, builder options and the fixtures' code version (`None` for an ONNX file).
    pub fn fixture_recipe(&self) -> Result<Option<Digest>> {
        match &self.source {
            ModelSource::Fixture { model, options } => Ok(Some(canonical_digest(&(
                &self.name,
                (model, options.batch, options.seq, options.image),
                tessera_fixtures::code_version(),
            ))?)),
            ModelSource::Onnx { .. } => Ok(None),
        }
    }

    /// What keying this job's load stage needs, computed once for one build: its recipe and, for an ONNX
    /// file, the file's blake3 (also what its artifact's provenance records, so the file is hashed once).
    ///
    /// An ONNX job's recipe holds the file's blake3, every external data file it names with its blake3, the
    /// shapes, the name and the importer's code version ([`onnx_source::recipe`]): a rebuild of an unchanged
    /// model hashes its files and reads the recorded document, without importing it. Which external files the
    /// model names is memoized by the file's digest ([`ExternalFiles`]). Content, never a file's time, names it.
    /// A file that cannot be read or decoded gets no recipe: the load stage then imports it to key it, and the
    /// import reports why it cannot, as before.
    pub fn prepare(&self, driver: &dyn Driver) -> Result<Prepared<'_>> {
        let ModelSource::Onnx { path, shapes } = &self.source else {
            return Ok(Prepared { job: self, recipe: self.fixture_recipe()?, file: None });
        };
        let keyed = || -> Result<(Digest, Digest)> {
            let file = onnx_source::file_digest(path)?;
            let read = || Ok(std::fs::read(path)?);
            let (_, locations) = tessera_stages::stage::run(driver, &ExternalFiles { file, read: &read })?;
            Ok((onnx_source::recipe(&self.name, path, file, &locations, shapes)?, file))
        };
        Ok(match keyed() {
            Ok((recipe, file)) => Prepared { job: self, recipe: Some(recipe), file: Some(file) },
            Err(e) => {
                tracing::debug!(model = %self.name, "no recipe, keyed by its imported document: {e:#}");
                Prepared { job: self, recipe: None, file: None }
            }
        })
    }
}

/// A job prepared for one build ([`ModelJob::prepare`]): the graph source its load stage runs.
pub struct Prepared<'j> {
    pub job: &'j ModelJob,
    recipe: Option<Digest>,
    /// An ONNX file's blake3, when it was read.
    pub file: Option<Digest>,
}

impl GraphSource for Prepared<'_> {
    fn name(&self) -> &str {
        &self.job.name
    }

    fn recipe(&self, _: &dyn Driver) -> Result<Option<Digest>> {
        Ok(self.recipe)
    }

    /// Builds the graph (on a load miss); an ONNX file must still be the one its recipe hashed.
    fn build(&self) -> Result<Graph> {
        load_graph_of(self.job, self.file)
    }
}

impl GraphSource for ModelJob {
    fn name(&self) -> &str {
        &self.name
    }

    /// Fixture models are keyed by their recipe, so a hit skips generating weights; ONNX files by their
    /// files' content (see [`ModelJob::prepare`]).
    fn recipe(&self, driver: &dyn Driver) -> Result<Option<Digest>> {
        Ok(self.prepare(driver)?.recipe)
    }

    fn build(&self) -> Result<Graph> {
        load_graph(self)
    }
}
