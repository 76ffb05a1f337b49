//! What the pipeline records about a build in every artifact file it writes, and the writing itself: the
//! provenance is stamped on the linker's payload as the file is written, never memoized (see
//! `tessera_kernels::artifact::provenance` for the section and ARCHITECTURE.md for why it stays out of keys).

use crate::job::{ModelJob, ModelSource};
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::path::Path;
use tessera_kernels::artifact::provenance::{Stamper, FLAG_PROVENANCE};
use tessera_kernels::artifact::{Blake3, Provenance, SourceModel};
use tessera_stages::context::Ctx;
use tessera_stages::device::{gpu_assumed, gpu_fingerprint};
use tessera_stages::fingerprint::DeviceFingerprint;
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
    /// The origin of `job`: an ONNX file's name (no folder) and blake3 (`file` when the build already hashed
    /// it, else read here whole, once), or a fixture's spec and recipe digest (what the load stage keys it by).
    pub fn of(job: &ModelJob, file: Option<Digest>) -> Result<ModelOrigin> {
        match &job.source {
            ModelSource::Onnx { path, shapes } => {
                let digest = match file {
                    Some(d) => d,
                    None => tessera_stages::onnx::source::file_digest(path).with_context(|| format!("model {}: hashing {}", job.name, path.display()))?,
                };
                let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let options = shapes
                    .iter()
                    .map(|(input, dims)| (format!("shape.{input}"), dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("x")))
                    .collect();
                Ok(ModelOrigin { source: SourceModel { kind: "onnx".into(), name, digest: Blake3(digest.0) }, options })
            }
            ModelSource::Fixture { model, options } => {
                let recipe = job.fixture_recipe()?.context("a fixture has a recipe")?;
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

/// Where the flags word sits in an artifact's header (the layout of `tessera_kernels::artifact::provenance`,
/// which keeps it private; `the_flags_word_is_where_the_stamper_sets_it` checks it against the stamper).
const FLAGS_AT: usize = 12;

/// Whether the file at `path` holds exactly the payload `d` (`payload_len` bytes) stamped with `section`: the
/// stamped file is the payload with its flags word set to [`FLAG_PROVENANCE`] and the section appended, so it
/// is when its first `payload_len` bytes, flags cleared, hash to `d` (the payload digest, as
/// `Artifact::payload_digest` computes it), its flags word is the stamp's and the rest is the section. One read
/// of the file; the store's copy is not read.
fn holds_stamped(path: &Path, d: &Digest, payload_len: u64, section: &[u8]) -> std::io::Result<bool> {
    let f = std::fs::File::open(path)?;
    let meta = f.metadata()?;
    let len = payload_len + section.len() as u64;
    if !meta.is_file() || meta.len() != len || payload_len < tessera_kernels::artifact::HEADER_LEN as u64 {
        return Ok(false);
    }
    // Mapped, not read: a 220 MB artifact is hashed on every core without a copy (the read and the hash were
    // most of a warm GPU rebuild's last 0.14 s, bench/compile_times.md).
    // SAFETY: the map is read only in this function. Artifacts are replaced by renaming a whole new file over
    // them (`write_artifact`), never changed in place, so the mapped bytes do not change under the hash; a
    // file truncated by hand meanwhile faults, the contract blake3's `update_mmap` makes for model files.
    let map = unsafe { memmap2::Mmap::map(&f)? };
    if map.len() as u64 != len {
        return Ok(false);
    }
    let (payload, tail) = map.split_at(payload_len as usize);
    if payload[FLAGS_AT..FLAGS_AT + 4] != FLAG_PROVENANCE.to_le_bytes() {
        return Ok(false);
    }
    let mut h = blake3::Hasher::new();
    h.update(&payload[..FLAGS_AT]);
    h.update(&0u32.to_le_bytes());
    h.update_rayon(&payload[FLAGS_AT + 4..]);
    Ok(h.finalize().as_bytes() == &d.0 && tail == section)
}

/// Writes the store's artifact `d` to `path` with `provenance` stamped on, atomically (temp file + rename), so
/// a reader never sees half a file; returns the file's size. A file already holding exactly these bytes is
/// left alone (checked by one read of the file: [`holds_stamped`]): rebuilding an unchanged zoo rewrites nothing.
pub fn write_artifact(store: &Store, d: &Digest, provenance: &Provenance, path: &Path) -> Result<u64> {
    let section = tessera_kernels::artifact::provenance::encode_section(provenance).context("encoding the provenance")?;
    // (An artifact only the remote tier holds has no local size yet: it is written.)
    if let Some(payload) = store.objects().size_of(d) {
        if holds_stamped(path, d, payload, &section).unwrap_or(false) {
            return Ok(payload + section.len() as u64);
        }
    }
    // A temp name of this writer's own (process and call): two builds writing one artifact at once (test
    // processes sharing an output folder, two CI jobs) each rename a whole file into place, never one another's.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tsr.{}.{n}.tmp", std::process::id()));
    {
        let f = std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        let mut s = Stamper::new(std::io::BufWriter::new(f), provenance)?;
        store.get_to_writer(d, &mut s).with_context(|| format!("writing {}", tmp.display()))?;
        let f = s.finish()?.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
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

    /// A payload with no body and 64 bytes of data (128 bytes; `salt` varies the data and the source digest),
    /// and a provenance for it.
    fn tiny_artifact(salt: u8) -> (Vec<u8>, Provenance) {
        let mut payload = vec![0u8; 64];
        payload[..8].copy_from_slice(&tessera_kernels::artifact::MAGIC);
        payload[8..12].copy_from_slice(&tessera_kernels::artifact::FORMAT_VERSION.to_le_bytes());
        payload[24..32].copy_from_slice(&64u64.to_le_bytes());
        payload.extend((0..64u8).map(|i| i.wrapping_mul(salt)));
        let p = Provenance {
            tessera_version: "t".into(),
            source_revision: "r".into(),
            source: SourceModel { kind: "onnx".into(), name: "m.onnx".into(), digest: Blake3([salt; 32]) },
            targets: vec!["cpu".into()],
            precision: "fp32".into(),
            costs: "analytical".into(),
            options: BTreeMap::new(),
        };
        (payload, p)
    }

    /// The one word the stamper changes in a payload's first bytes is the flags word at [`FLAGS_AT`]; a file
    /// holding the stamped payload is recognised, and one differing in any part (payload, flags, section) is not.
    #[test]
    fn the_flags_word_is_where_the_stamper_sets_it() {
        let (payload, p) = tiny_artifact(7);
        let stamped = tessera_kernels::artifact::provenance::with_provenance(&payload, &p).unwrap();
        let changed: Vec<usize> = (0..payload.len()).filter(|&i| payload[i] != stamped[i]).collect();
        assert_eq!(changed, [FLAGS_AT], "the stamper changes the flags word's first byte only");
        let section = tessera_kernels::artifact::provenance::encode_section(&p).unwrap();
        assert_eq!(&stamped[payload.len()..], &section[..]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.tsr");
        let d = Digest::of(&payload);
        let holds = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            holds_stamped(&path, &d, payload.len() as u64, &section).unwrap()
        };
        assert!(holds(&stamped));
        for at in [0, FLAGS_AT, 40, 100, stamped.len() - 1] {
            let mut other = stamped.clone();
            other[at] ^= 4;
            assert!(!holds(&other), "a byte changed at {at}");
        }
        assert!(!holds(&payload), "the payload without its stamp");
        assert!(!holds(&stamped[..stamped.len() - 1]));
    }

    /// Writers of one artifact at once (threads here; test processes sharing an output folder in the runtime's
    /// GPU tests, where a shared temp name made one writer's rename fail) each put a whole file in place and
    /// leave no temp file behind.
    #[test]
    fn concurrent_writers_of_one_artifact_all_succeed() {
        let (payload, p) = tiny_artifact(5);
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store"), OpenOptions::writable()).unwrap();
        let d = store.put(&payload).unwrap();
        let out = dir.path().join("out");
        std::fs::create_dir_all(&out).unwrap();
        let path = out.join("m.tsr");
        let sizes: Vec<u64> = std::thread::scope(|s| {
            let writers: Vec<_> = (0..8).map(|_| s.spawn(|| write_artifact(&store, &d, &p, &path).unwrap())).collect();
            writers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        let want = tessera_kernels::artifact::provenance::with_provenance(&payload, &p).unwrap();
        assert!(sizes.iter().all(|&n| n == want.len() as u64), "{sizes:?}");
        assert_eq!(std::fs::read(&path).unwrap(), want);
        let left: Vec<_> = std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, [std::ffi::OsString::from("m.tsr")], "no temp file left");
    }

    #[test]
    fn a_fixture_is_named_by_its_spec_and_digested_by_its_recipe() {
        let job = crate::explain::parse_fixture_spec("fixture:bert-tiny:b2:s16").unwrap();
        let o = ModelOrigin::of(&job, None).unwrap();
        assert_eq!((o.source.kind.as_str(), o.source.name.as_str()), ("fixture", "fixture:bert-tiny:b2:s16"));
        let recipe = job.fixture_recipe().unwrap().unwrap();
        assert_eq!(o.source.digest, Blake3(recipe.0));
        assert!(o.options.is_empty());
        // The spec parses back to the same job: `tessera explain` can be given it.
        assert_eq!(crate::explain::parse_fixture_spec(&o.source.name).unwrap().name, job.name);
    }
}
