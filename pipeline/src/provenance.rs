//! What the pipeline records about a build in every artifact file it writes, and the writing itself: the
//! provenance is stamped on the linker's payload as the file is written, never memoized (see
//! `tessera_kernels::artifact::provenance` for the section and ARCHITECTURE.md for why it stays out of keys).

use crate::build::{ModelJob, ModelSource};
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::path::Path;
use tessera_kernels::artifact::provenance::Stamper;
use tessera_kernels::artifact::{Blake3, Provenance, SourceModel};
use tessera_stages::context::Ctx;
use tessera_stages::device::{gpu_assumed, gpu_fingerprint, DeviceFingerprint};
use tessera_store::{Digest, Store};

/// The source revision this tessera was built from (see build.rs): a commit, with `-dirty` when the compiled
/// sources differed from it, the packager's `TESSERA_SOURCE_REVISION`, or `unknown`.
pub const SOURCE_REVISION: &str = env!("TESSERA_SOURCE_REVISION");

/// This tessera's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where one model came from, and the options of its own that reached a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelOrigin {
    pub source: SourceModel,
    /// `shape.NAME` = `1x128` for each fixed ONNX input shape.
    pub options: BTreeMap<String, String>,
}

impl ModelOrigin {
    /// The origin of `job`: an ONNX file's name (no folder) and blake3, or a fixture's spec and recipe digest
    /// (what the load stage keys it by). Reads an ONNX file whole, once.
    pub fn of(job: &ModelJob) -> Result<ModelOrigin> {
        match &job.source {
            ModelSource::Onnx { path, shapes } => {
                let mut h = blake3::Hasher::new();
                h.update_mmap_rayon(path).with_context(|| format!("model {}: hashing {}", job.name, path.display()))?;
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let options = shapes
                    .iter()
                    .map(|(input, dims)| (format!("shape.{input}"), dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x")))
                    .collect();
                Ok(ModelOrigin { source: SourceModel { kind: "onnx".into(), name, digest: Blake3(*h.finalize().as_bytes()) }, options })
            }
            ModelSource::Fixture { model, options } => {
                let recipe = tessera_stages::load::GraphSource::recipe(job)?.context("a fixture has a recipe")?;
                let mut spec = format!("fixture:{model}:b{}", options.batch);
                if let Some(s) = options.seq {
                    spec.push_str(&format!(":s{s}"));
                }
                if let Some(i) = options.image {
                    spec.push_str(&format!(":i{i}"));
                }
                Ok(ModelOrigin { source: SourceModel { kind: "fixture".into(), name: spec, digest: Blake3(recipe.0) }, options: BTreeMap::new() })
            }
        }
    }
}

/// What every model of a build shares: this tessera, the canonical targets, the precision, the cost mode, and
/// the options of the build as a whole that reached a key.
#[derive(Clone, Debug)]
pub struct BuildRecord {
    targets: Vec<String>,
    precision: String,
    costs: String,
    options: BTreeMap<String, String>,
}

impl BuildRecord {
    /// The record of a build under `ctx`. A frozen build for another GPU (`--measured-on`) records that GPU's
    /// fingerprint, which its tune and partition keys hold instead of this machine's; a baseline build the
    /// backend it preferred.
    pub fn of(ctx: &Ctx) -> Result<BuildRecord> {
        let mut options = BTreeMap::new();
        // A single-backend baseline build (the backend preferred is in its partition keys).
        if let Some(backend) = &ctx.prefer {
            options.insert("prefer".to_string(), backend.clone());
        }
        if gpu_assumed() {
            if let Some(DeviceFingerprint::Gpu(fp)) = gpu_fingerprint() {
                options.insert("measured_on".to_string(), serde_json::to_string(&fp)?);
            }
        }
        Ok(BuildRecord {
            targets: ctx.targets.targets.iter().map(|t| t.canonical()).collect(),
            precision: ctx.targets.precision()?.name().to_string(),
            costs: ctx.costs.name().to_string(),
            options,
        })
    }

    /// The provenance of one model of the build.
    pub fn provenance(&self, origin: &ModelOrigin) -> Provenance {
        let mut options = self.options.clone();
        options.extend(origin.options.clone());
        Provenance {
            tessera_version: VERSION.to_string(),
            source_revision: SOURCE_REVISION.to_string(),
            source: origin.source.clone(),
            targets: self.targets.clone(),
            precision: self.precision.clone(),
            costs: self.costs.clone(),
            options,
        }
    }
}

/// Writes the store's artifact `d` to `path` with `provenance` stamped on, atomically (temp file + rename), so
/// a reader never sees half a file; returns the file's size. A file already holding exactly these bytes is
/// left alone: rebuilding an unchanged zoo rewrites nothing.
pub fn write_artifact(store: &Store, d: &Digest, provenance: &Provenance, path: &Path) -> Result<u64> {
    let section = Stamper::new(std::io::sink(), provenance)?.section_len();
    // (An artifact only the remote tier holds has no local size yet: it is written.)
    if let (Ok(meta), Some(payload)) = (std::fs::metadata(path), store.objects().size_of(d)) {
        if meta.is_file() && meta.len() == payload + section {
            let mut s = Stamper::new(blake3::Hasher::new(), provenance)?;
            store.get_to_writer(d, &mut s)?;
            let want = s.finish()?.finalize();
            let mut h = blake3::Hasher::new();
            if h.update_mmap_rayon(path).is_ok() && h.finalize() == want {
                return Ok(meta.len());
            }
        }
    }
    let tmp = path.with_extension("tsr.tmp");
    {
        let f = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut s = Stamper::new(std::io::BufWriter::new(f), provenance)?;
        store.get_to_writer(d, &mut s).with_context(|| format!("writing {}", tmp.display()))?;
        let f = s.finish()?.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(std::fs::metadata(path)?.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memo::Memo;
    use crate::zoo::{all_backends, resolve_targets};
    use tessera_stages::context::CostMode;
    use tessera_store::OpenOptions;

    #[test]
    fn the_record_holds_what_reached_a_key_and_the_model_its_own_options() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), OpenOptions::writable()).unwrap();
        let memo = Memo::new(&store);
        let backends = all_backends();
        let targets = resolve_targets(&["cpu -compiler=gemm".into()], &backends).unwrap();
        let ctx = Ctx::new(&memo, &targets, &backends).with_costs(CostMode::Analytical).with_prefer(Some("gemm".into()));
        let source = SourceModel { kind: "onnx".into(), name: "m.onnx".into(), digest: Blake3([3; 32]) };
        let origin = ModelOrigin { source: source.clone(), options: [("shape.x".to_string(), "1x3".to_string())].into() };
        let p = BuildRecord::of(&ctx).unwrap().provenance(&origin);
        assert_eq!((p.tessera_version.as_str(), p.source_revision.as_str(), &p.source), (VERSION, SOURCE_REVISION, &source));
        // The set's canonical targets (the fallback `c` added), in set order.
        assert_eq!(p.targets, targets.targets.iter().map(|t| t.canonical()).collect::<Vec<_>>());
        assert_eq!(p.targets.len(), 2);
        assert_eq!((p.precision.as_str(), p.costs.as_str()), ("fp32", "analytical"));
        let options: Vec<(&str, &str)> = p.options.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(options, [("prefer", "gemm"), ("shape.x", "1x3")]);
    }

    #[test]
    fn a_fixture_is_named_by_its_spec_and_digested_by_its_recipe() {
        let job = crate::explain::parse_fixture_spec("fixture:bert-tiny:b2:s16").unwrap();
        let o = ModelOrigin::of(&job).unwrap();
        assert_eq!((o.source.kind.as_str(), o.source.name.as_str()), ("fixture", "fixture:bert-tiny:b2:s16"));
        let recipe = tessera_stages::load::GraphSource::recipe(&job).unwrap().unwrap();
        assert_eq!(o.source.digest, Blake3(recipe.0));
        assert!(o.options.is_empty());
        // The spec parses back to the same job: `tessera explain` can be given it.
        assert_eq!(crate::explain::parse_fixture_spec(&o.source.name).unwrap().name, job.name);
    }
}
