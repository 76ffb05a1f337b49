//! What both kinds of `tessera run` share (the reference run in run.rs, an artifact's in run_artifact.rs):
//! `--input NAME=FILE` binding, the file-stem rule for tensor names, and the report of a run.

use anyhow::bail;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use tessera_stages::npy;

/// Matches `--input NAME=FILE` arguments to a list of input names (a graph's, or an artifact's, which has no
/// graph). The name is the longest input name that the argument starts with followed by `=`, so names and paths
/// may both contain `=`.
pub(crate) fn bind_input_names(names: &[&str], args: &[String]) -> anyhow::Result<BTreeMap<String, PathBuf>> {
    let mut given = BTreeMap::new();
    for a in args {
        let name = names
            .iter()
            .filter(|n| a.len() > n.len() && a.starts_with(*n) && a.as_bytes()[n.len()] == b'=')
            .max_by_key(|n| n.len());
        let Some(&name) = name else {
            let shown = a.split_once('=').map_or(a.as_str(), |(n, _)| n);
            if !a.contains('=') {
                bail!("--input '{a}': expected NAME=FILE.npy");
            }
            bail!("--input '{a}': the model has no input '{shown}' (its inputs: {})", names.join(", "));
        };
        let file = PathBuf::from(&a[name.len() + 1..]);
        if given.insert(name.to_string(), file).is_some() {
            bail!("--input given twice for input '{name}'");
        }
    }
    Ok(given)
}

/// What a run did: each input and output with its file, and the wall time of the run alone.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub seconds: f64,
    /// In model order.
    pub inputs: Vec<RunTensor>,
    /// In model order.
    pub outputs: Vec<RunTensor>,
    /// Every file written, in order: outputs first, then drawn inputs.
    #[serde(skip)]
    pub files: Vec<PathBuf>,
}

/// An input or output of a run: its name, type and file; an input drawn from the seed has the seed.
#[derive(Clone, Debug, Serialize)]
pub struct RunTensor {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: String,
    pub file: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

impl RunReport {
    /// One human-readable line per input and output: given inputs, outputs, then drawn inputs.
    pub fn lines(&self) -> Vec<String> {
        let given = self.inputs.iter().filter(|i| i.seed.is_none()).map(|i| format!("input  {} {} from {}", i.name, i.ty, i.file.display()));
        let outputs = self.outputs.iter().map(|o| format!("output {} {} -> {}", o.name, o.ty, o.file.display()));
        let drawn = self.inputs.iter().filter_map(|i| i.seed.map(|seed| format!("input  {} {} drawn from seed {seed} -> {}", i.name, i.ty, i.file.display())));
        given.chain(outputs).chain(drawn).collect()
    }
}

/// A tensor name as a file stem (see the module documentation for the rule).
pub fn sanitize_file_stem(name: &str) -> String {
    npy::file_stem(name)
}

/// Assigns unique file stems, in order, adding `_2`, `_3`, ... to repeats (compared case-insensitively).
#[derive(Default)]
pub(crate) struct Stems {
    taken: BTreeSet<String>,
}

impl Stems {
    pub(crate) fn claim(&mut self, name: &str) -> String {
        let base = sanitize_file_stem(name);
        let mut stem = base.clone();
        let mut k = 2;
        while !self.taken.insert(stem.to_ascii_lowercase()) {
            stem = format!("{base}_{k}");
            k += 1;
        }
        stem
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitizes_and_dedupes_names() {
        assert_eq!(sanitize_file_stem("a/b:c d"), "a_b_c_d");
        assert_eq!(sanitize_file_stem(".."), "_..");
        assert_eq!(sanitize_file_stem(""), "_");
        assert_eq!(sanitize_file_stem("logits.1"), "logits.1");
        assert_eq!(sanitize_file_stem(&"x".repeat(300)).len(), 120);
        let mut s = Stems::default();
        assert_eq!(s.claim("a/b"), "a_b");
        assert_eq!(s.claim("a:b"), "a_b_2");
        assert_eq!(s.claim("A_B"), "A_B_3");
    }
}
