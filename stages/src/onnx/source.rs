//! What names an ONNX model's graph without importing it: the model file's blake3, the external data files it
//! refers to (by location, each with its own blake3), the input shapes, the job's name and the importer's code
//! version. The pipeline keys the load stage of an ONNX job by this recipe, so a rebuild of an unchanged model
//! hashes its files and reads the recorded graph document instead of parsing, importing, simplifying and
//! folding the whole model again.
//!
//! Which external files a model names is a function of the model file's bytes alone, so it is memoized by the
//! [`ExternalFiles`] stage keyed by the file's digest: a warm rebuild reads one small list instead of decoding
//! the model. Every tensor reachable in the model (initializers, sparse initializers, attribute tensors of
//! every node of the graph, its subgraphs, training graphs and local functions) counts, used or not: a
//! superset of what the importer reads, so a change to any file it could read changes the recipe.

use super::proto::{AttributeProto, GraphProto, ModelProto, NodeProto, SparseTensorProto, TensorProto};
use crate::code::CodeVersion;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path};
use tessera_store::{canonical_digest, Digest};

/// The declared version of the ONNX import (bumped by hand when what an import produces changes meaning; its
/// source digest follows the code: `code::units`'s `IMPORT`).
pub const IMPORT_VERSION: u32 = 1;

/// The importer's code version: the ONNX importer, the IR it builds and the interpreter its eager folding runs.
pub fn import_version() -> CodeVersion {
    CodeVersion::new(IMPORT_VERSION, &[crate::code::digests::IMPORT])
}

/// Every `location` of external data that a tensor anywhere in the decoded model names, sorted and deduplicated
/// (what [`scan_external_locations`] reads from the bytes).
pub fn external_locations(model: &ModelProto) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if let Some(g) = &model.graph {
        graph(g, &mut out);
    }
    for t in &model.training_info {
        for g in t.initialization.iter().chain(&t.algorithm) {
            graph(g, &mut out);
        }
    }
    for f in &model.functions {
        nodes(&f.node, &mut out);
        for a in &f.attribute_proto {
            attribute(a, &mut out);
        }
    }
    out
}

fn graph(g: &GraphProto, out: &mut BTreeSet<String>) {
    for t in &g.initializer {
        tensor(t, out);
    }
    for s in &g.sparse_initializer {
        sparse(s, out);
    }
    nodes(&g.node, out);
}

fn nodes(ns: &[NodeProto], out: &mut BTreeSet<String>) {
    for n in ns {
        for a in &n.attribute {
            attribute(a, out);
        }
    }
}

fn attribute(a: &AttributeProto, out: &mut BTreeSet<String>) {
    for t in a.t.iter().chain(&a.tensors) {
        tensor(t, out);
    }
    for s in a.sparse_tensor.iter().chain(&a.sparse_tensors) {
        sparse(s, out);
    }
    for g in a.g.iter().chain(&a.graphs) {
        graph(g, out);
    }
}

fn sparse(s: &SparseTensorProto, out: &mut BTreeSet<String>) {
    for t in s.values.iter().chain(&s.indices) {
        tensor(t, out);
    }
}

fn tensor(t: &TensorProto, out: &mut BTreeSet<String>) {
    for kv in &t.external_data {
        if kv.key.as_deref() == Some("location") {
            out.insert(kv.value.clone().unwrap_or_default());
        }
    }
}

/// The messages [`scan_external_locations`] descends into.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Msg {
    Model,
    Graph,
    Node,
    Attribute,
    Tensor,
    Entry,
    Sparse,
    Training,
    Function,
}

/// The message in field `field` of `msg`, for the fields that lead to a tensor (the schema's tags, `proto.rs`).
fn child(msg: Msg, field: u64) -> Option<Msg> {
    use Msg::*;
    match (msg, field) {
        (Model, 7) | (Attribute, 6 | 11) | (Training, 1 | 2) => Some(Graph),
        (Model, 20) => Some(Training),
        (Model, 25) => Some(Function),
        (Graph, 1) | (Function, 7) => Some(Node),
        (Node, 5) | (Function, 11) => Some(Attribute),
        (Graph, 5) | (Attribute, 5 | 10) | (Sparse, 1 | 2) => Some(Tensor),
        (Graph, 15) | (Attribute, 22 | 23) => Some(Sparse),
        (Tensor, 13) => Some(Entry),
        _ => None,
    }
}

fn varint(b: &[u8], at: &mut usize) -> Result<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let Some(&byte) = b.get(*at) else { bail!("truncated varint") };
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    bail!("a varint longer than 10 bytes")
}

/// [`external_locations`] of the model serialized in `bytes`, read from the protobuf wire format without
/// decoding it: every other field, tensor data included, is skipped over, so a model of hundreds of megabytes
/// is scanned without copying its weights. Errors on bytes that are not a well-formed protobuf message.
pub fn scan_external_locations(bytes: &[u8]) -> Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    walk(bytes, Msg::Model, 0, &mut out)?;
    Ok(out)
}

fn walk(b: &[u8], msg: Msg, depth: u32, out: &mut BTreeSet<String>) -> Result<()> {
    // prost's own recursion limit.
    if depth > 100 {
        bail!("messages nested more than 100 deep");
    }
    let (mut key, mut value) = (None, None);
    let mut at = 0;
    let skip = |at: &mut usize, n: usize| -> Result<()> {
        *at = at.checked_add(n).filter(|&e| e <= b.len()).context("truncated field")?;
        Ok(())
    };
    while at < b.len() {
        let tag = varint(b, &mut at)?;
        let field = tag >> 3;
        match tag & 7 {
            0 => {
                varint(b, &mut at)?;
            }
            1 => skip(&mut at, 8)?,
            5 => skip(&mut at, 4)?,
            2 => {
                let len = usize::try_from(varint(b, &mut at)?)?;
                let start = at;
                skip(&mut at, len)?;
                let body = &b[start..at];
                match (msg, field) {
                    (Msg::Entry, 1) => key = Some(std::str::from_utf8(body)?.to_string()),
                    (Msg::Entry, 2) => value = Some(std::str::from_utf8(body)?.to_string()),
                    _ => {
                        if let Some(c) = child(msg, field) {
                            walk(body, c, depth + 1, out)?;
                        }
                    }
                }
            }
            wire => bail!("wire type {wire} in field {field} (groups are not used by ONNX)"),
        }
    }
    if msg == Msg::Entry && key.as_deref() == Some("location") {
        out.insert(value.unwrap_or_default());
    }
    Ok(())
}

/// The recipe of an ONNX job: everything that determines the graph the load stage records for it.
#[derive(Serialize)]
struct Recipe<'a> {
    kind: &'static str,
    name: &'a str,
    file: Digest,
    /// Each external location with its file's blake3 (`None`: the location is not a readable file inside the
    /// model's folder, which the import then reports if it needs it).
    externals: Vec<(String, Option<Digest>)>,
    shapes: &'a BTreeMap<String, Vec<usize>>,
    import: CodeVersion,
}

/// The blake3 of a file, read through a memory map (on several threads for large files).
pub fn file_digest(path: &Path) -> std::io::Result<Digest> {
    let mut h = blake3::Hasher::new();
    h.update_mmap_rayon(path)?;
    Ok(Digest(*h.finalize().as_bytes()))
}

/// The recipe digest of an ONNX job named `name` whose model file (at `path`) has blake3 `file` and names the
/// external `locations`: the locations' files are hashed here, relative to the model's folder as the importer
/// resolves them.
pub fn recipe(name: &str, path: &Path, file: Digest, locations: &[String], shapes: &BTreeMap<String, Vec<usize>>) -> Result<Digest> {
    let base = path.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p });
    let externals = locations
        .iter()
        .map(|loc| {
            let rel = Path::new(loc);
            let inside = !rel.is_absolute() && rel.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
            let digest = match (inside, base) {
                (true, Some(base)) => file_digest(&base.join(rel)).ok(),
                _ => None,
            };
            (loc.clone(), digest)
        })
        .collect();
    Ok(canonical_digest(&Recipe { kind: "onnx", name, file, externals, shapes, import: import_version() })?)
}

#[cfg(test)]
#[path = "source_tests.rs"]
mod tests;
