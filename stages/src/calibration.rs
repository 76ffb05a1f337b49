//! Calibration: the range of every value of a model in fp32, found by running the reference
//! interpreter on calibration inputs, so that a reduced-precision build knows where values leave the
//! narrow type's range before it rewrites the graph (`crate::stages::precision`), instead of shipping an artifact
//! that returns NaN for inputs like the ones it was compiled with.
//!
//! The calibration inputs are the user's where they gave some (`--calibration DIR`: [`CalibrationDir`],
//! [`CalibrationInputs`]), else the random inputs the tests draw ([`random_inputs`], seeds
//! `1..=CALIBRATION_RUNS`): tessera checks every compiled model against the reference on such inputs, so
//! an artifact that keeps them in range passes its own check. A user's inputs replace the random ones rather
//! than join them: random values can mean nothing to a model (token ids, masks, audio) and push values out of
//! range where real inputs never go, keeping nodes in fp32 for nothing; the artifact then holds for inputs
//! like the user's. Only values a node computes are measured; constants are measured from their data by the
//! reader ([`Ranges::max_abs_of`]).
//!
//! Magnitudes of 1e30 and more are not counted: exporters write "minus infinity" masks as f32's lowest
//! value (Hugging Face's `finfo.min`), meant as infinities, which fp16 saturates to +-65504 and softmax
//! still reads as "masked" (`passes::precision`). NaN and infinities are not counted either.
//!
//! The calibrate stage ([`crate::stages::calibrate`]) runs it only for reduced precision, once per loaded
//! document.

use crate::interp::{floats, random_inputs, run_graph_observed};
use crate::ir::{Graph, Tensor, ValueDef, ValueId};
use anyhow::{bail, Context, Result};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tessera_store::Digest;

/// How many calibration inputs are drawn (seeds 1..=this). One: the reference costs about as much as the
/// rest of a cold CPU-side build of the model (BERT-base: 2.5 s), and the headroom of `precision::LIMIT`
/// stands for the spread between inputs.
pub const CALIBRATION_RUNS: u64 = 1;

/// Magnitudes from here up are "infinity" sentinels, not values (see the module doc).
pub const SENTINEL: f32 = 1e30;

/// The largest magnitude each value reached over the calibration runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ranges {
    /// How many inputs were run.
    pub runs: u32,
    /// Per value of the loaded graph (by index): the largest finite magnitude below [`SENTINEL`] a node
    /// computed, over every run; None for values no node computes (inputs, constants) and non-float ones.
    pub max_abs: Vec<Option<f32>>,
}

impl Ranges {
    /// The largest magnitude of `v` in `g`: measured for computed values, read from the data for
    /// constants; None for graph inputs (drawn by the caller, in range by construction) and non-float values.
    pub fn max_abs_of(&self, g: &Graph, v: ValueId) -> Option<f32> {
        match &g.value(v).def {
            ValueDef::Const(t) if t.dtype().is_float() => Some(max_abs(&floats(t))),
            _ => self.max_abs.get(v.index()).copied().flatten(),
        }
    }
}

/// The largest finite magnitude below [`SENTINEL`] among `xs` (0 for none). Large slices are read in
/// parallel chunks: a maximum of non-negative non-NaN floats is the same whatever the grouping.
pub fn max_abs(xs: &[f32]) -> f32 {
    fn serial(xs: &[f32]) -> f32 {
        xs.iter().filter(|x| x.is_finite() && x.abs() < SENTINEL).fold(0f32, |m, x| m.max(x.abs()))
    }
    const CHUNK: usize = 1 << 15;
    if xs.len() < 2 * CHUNK {
        serial(xs)
    } else {
        xs.par_chunks(CHUNK).map(serial).reduce(|| 0f32, f32::max)
    }
}

/// Runs the reference on the calibration inputs (`given`'s samples, else the random ones) and records every
/// computed value's range.
pub fn measure(g: &Graph, given: Option<&CalibrationInputs>) -> Result<Ranges> {
    let samples: Vec<(String, Vec<Tensor>)> = match given {
        Some(c) => c.samples_for(g)?,
        None => (1..=CALIBRATION_RUNS).map(|seed| (format!("random input {seed}"), random_inputs(g, seed))).collect(),
    };
    let mut max: Vec<Option<f32>> = vec![None; g.values.len()];
    for (what, inputs) in &samples {
        run_graph_observed(g, inputs, |v, t| {
            if t.dtype().is_float() {
                let m = max_abs(&floats(t));
                let slot = &mut max[v.index()];
                *slot = Some(slot.map_or(m, |old| old.max(m)));
            }
        })
        .with_context(|| format!("graph '{}': running the reference on calibration {what}", g.name))?;
    }
    Ok(Ranges { runs: samples.len() as u32, max_abs: max })
}

/// The directory a user's calibration inputs come from (`--calibration DIR`), for every model of a build:
/// a model's inputs are in `DIR/<model name>/` where that directory exists, else in `DIR` itself.
#[derive(Clone, Debug)]
pub struct CalibrationDir {
    root: PathBuf,
}

impl CalibrationDir {
    /// `root` must be a directory.
    pub fn new(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        if !root.is_dir() {
            bail!("calibration directory {}: not a directory", root.display());
        }
        Ok(CalibrationDir { root })
    }

    /// The calibration inputs of the model named `model`.
    pub fn for_model(&self, model: &str) -> Result<CalibrationInputs> {
        let own = self.root.join(crate::npy::file_stem(model));
        CalibrationInputs::read(if own.is_dir() { &own } else { &self.root })
    }
}

/// A user's calibration inputs for one model: one or more samples, each a directory holding one NumPy file
/// per model input, named as `tessera run --out` names them (`<input name>.npy`, characters other than ASCII
/// letters, digits, `-`, `_` and `.` replaced by `_`). A directory with `.npy` files is one sample; one
/// without is a set of samples, one per subdirectory (in name order). Read once, in full: the key is their
/// content.
#[derive(Clone, Debug)]
pub struct CalibrationInputs {
    samples: Vec<Sample>,
}

#[derive(Clone, Debug)]
struct Sample {
    dir: PathBuf,
    /// File name -> contents.
    files: BTreeMap<String, Vec<u8>>,
}

/// The `.npy` files directly in `dir`, by name (sorted), with their contents.
fn npy_files(dir: &Path) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("calibration directory {}: cannot read", dir.display()))? {
        let path = entry.with_context(|| format!("calibration directory {}: cannot read", dir.display()))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_string) else { continue };
        if path.is_file() && name.ends_with(".npy") {
            let bytes = std::fs::read(&path).with_context(|| format!("calibration input {}: cannot read", path.display()))?;
            files.insert(name, bytes);
        }
    }
    Ok(files)
}

impl CalibrationInputs {
    /// Reads the samples under `dir` (see the type's documentation).
    pub fn read(dir: &Path) -> Result<Self> {
        let files = npy_files(dir)?;
        if !files.is_empty() {
            return Ok(CalibrationInputs { samples: vec![Sample { dir: dir.to_path_buf(), files }] });
        }
        let mut subdirs: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("calibration directory {}: cannot read", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
            .collect();
        subdirs.sort();
        let mut samples = Vec::new();
        for sub in subdirs {
            let files = npy_files(&sub)?;
            if !files.is_empty() {
                samples.push(Sample { dir: sub, files });
            }
        }
        if samples.is_empty() {
            bail!(
                "calibration directory {}: no .npy files (one sample: a file <input name>.npy for each model input; several: one subdirectory each)",
                dir.display()
            );
        }
        Ok(CalibrationInputs { samples })
    }

    /// How many samples there are.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether there are none (never, for inputs [`CalibrationInputs::read`] made).
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// What the calibration's key names: each sample's files, by name, with the blake3 of their contents,
    /// in sample order (where the files lie is not part of it).
    pub fn digest(&self) -> Digest {
        let named: Vec<Vec<(&str, Digest)>> =
            self.samples.iter().map(|s| s.files.iter().map(|(n, b)| (n.as_str(), Digest::of(b))).collect()).collect();
        Digest::of(&postcard::to_stdvec(&named).expect("names and digests encode"))
    }

    /// Each sample as `g`'s inputs, in graph order, named for errors: every input needs its file, of its
    /// dtype (or one `npy::read_as` converts) and shape, and every file must name an input.
    pub fn samples_for(&self, g: &Graph) -> Result<Vec<(String, Vec<Tensor>)>> {
        let mut out = Vec::with_capacity(self.samples.len());
        for sample in &self.samples {
            let mut inputs = Vec::with_capacity(g.inputs.len());
            let mut used = std::collections::BTreeSet::new();
            for &v in &g.inputs {
                let val = g.value(v);
                let file = format!("{}.npy", crate::npy::file_stem(&val.name));
                let path = sample.dir.join(&file);
                let Some(bytes) = sample.files.get(&file) else {
                    bail!("calibration sample {}: no file {file} for input '{}' ({})", sample.dir.display(), val.name, val.ty);
                };
                let t = crate::npy::read_bytes_as(bytes, &path, val.ty.dtype).with_context(|| format!("calibration input '{}'", val.name))?;
                if t.shape() != val.ty.shape.as_slice() {
                    bail!("calibration input {}: shape {:?}, but input '{}' is {}", path.display(), t.shape(), val.name, val.ty);
                }
                used.insert(file);
                inputs.push(t);
            }
            if let Some(extra) = sample.files.keys().find(|f| !used.contains(*f)) {
                bail!("calibration sample {}: {extra} names no input of model '{}'", sample.dir.display(), g.name);
            }
            out.push((format!("sample {}", sample.dir.display()), inputs));
        }
        Ok(out)
    }
}

#[cfg(test)]
#[path = "calibration_tests.rs"]
mod tests;
