//! The import driver: decodes the model, declares inputs and initializers, converts nodes in order (folding
//! constants eagerly), binds outputs, then simplifies and verifies.

use super::attrs::Attrs;
use super::error::{ImportError, ImportErrorKind, NResult, NodeError, NodeLocation};
use super::importer::{check_size, Importer, NodeCx, MIN_FOLD_LIMIT};
use super::ops;
use super::proto::{type_proto, GraphProto, ModelProto, NodeProto, ValueInfoProto};
use super::tensor::{dtype_from_onnx, tensor_from_proto};
use super::{ImportOptions, MAX_OPSET, MIN_OPSET};
use crate::ir::{Graph, TensorType, ValueDef};
use prost::bytes::Bytes;
use prost::Message;
use std::collections::BTreeMap;
use std::path::Path;

fn err(file: &str, kind: ImportErrorKind) -> ImportError {
    ImportError::new(file, kind)
}

/// The node's label in errors: its name, or `#index` when unnamed.
fn node_label(n: &NodeProto, index: usize) -> String {
    match n.name.as_deref() {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => format!("#{index}"),
    }
}

fn op_label(n: &NodeProto) -> String {
    let op = n.op_type.clone().unwrap_or_default();
    match n.domain.as_deref() {
        None | Some("") | Some("ai.onnx") => op,
        Some(d) => format!("{d}:{op}"),
    }
}

pub fn import(bytes: Bytes, base_dir: Option<&Path>, file: &str, opts: &ImportOptions) -> Result<Graph, ImportError> {
    match import_or_check(bytes, base_dir, file, opts, false)? {
        Imported::Graph(g) => Ok(g),
        Imported::Unsupported(mut found) => Err(found.remove(0)),
    }
}

/// Every unsupported op and attribute of a model at once, each with its node (an empty list: the model
/// imports). Where a node cannot be imported, the nodes that read what it would have written are checked for
/// their op only (their attributes may depend on values that do not exist), so one unsupported node is not
/// reported again through everything downstream. A model that is not valid ONNX is still an error.
pub fn check(bytes: Bytes, base_dir: Option<&Path>, file: &str, opts: &ImportOptions) -> Result<Vec<ImportError>, ImportError> {
    match import_or_check(bytes, base_dir, file, opts, true)? {
        Imported::Graph(_) => Ok(Vec::new()),
        Imported::Unsupported(found) => Ok(found),
    }
}

enum Imported {
    Graph(Graph),
    /// At least one; in import mode only the first.
    Unsupported(Vec<ImportError>),
}

/// `bytes` is the model file; decoded from a `Bytes`, every tensor's raw data is a slice of it, not a copy
/// (BERT-base's import peaked at three copies of its 440 MB of weights: the file, the decoded protobuf, the
/// graph's tensors).
fn import_or_check(bytes: Bytes, base_dir: Option<&Path>, file: &str, opts: &ImportOptions, check: bool) -> Result<Imported, ImportError> {
    let file_len = bytes.len();
    let model = ModelProto::decode(bytes).map_err(|e| err(file, ImportErrorKind::Decode(e)))?;
    let opset = default_opset(&model).map_err(|k| err(file, k))?;
    let Some(graph) = model.graph.as_ref() else {
        return Err(err(file, ImportErrorKind::Invalid("the model has no graph".into())));
    };
    let mut im = Importer {
        g: Graph::new(super::model_name(file)),
        env: BTreeMap::new(),
        unavailable: BTreeMap::new(),
        opset,
        base_dir,
        defined_by: BTreeMap::new(),
        fold_limit: MIN_FOLD_LIMIT,
    };
    declare_values(&mut im, graph, base_dir, opts).map_err(|k| err(file, k))?;
    let data: usize = im.g.values.iter().map(|v| if let ValueDef::Const(t) = &v.def { t.bytes().len() } else { 0 }).sum();
    im.fold_limit = MIN_FOLD_LIMIT.max(file_len.saturating_add(data).saturating_mul(2));
    // Check mode: what the nodes that could not be imported would have written.
    let mut blocked: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    let mut unsupported: Vec<ImportError> = Vec::new();
    for (index, node) in graph.node.iter().enumerate() {
        let located = |e: NodeError| ImportError {
            file: file.to_string(),
            location: Some(NodeLocation { node: node_label(node, index), op: op_label(node), attribute: e.attribute }),
            kind: e.kind,
        };
        if check && node.input.iter().any(|i| blocked.contains(i)) {
            // Downstream of an unsupported node: only the op itself can be judged.
            let known_domain = matches!(node.domain.as_deref(), None | Some("") | Some("ai.onnx"));
            if !known_domain || ops::converter(node.op_type.as_deref().unwrap_or("")).is_none() {
                unsupported.push(located(NodeError { attribute: None, kind: ImportErrorKind::UnsupportedOp { op: op_label(node) } }));
            }
            blocked.extend(node.output.iter().filter(|o| !o.is_empty()).cloned());
            continue;
        }
        match convert_node(&mut im, node, index).map_err(located) {
            Ok(()) => {}
            Err(e) if check && e.is_unsupported() => {
                unsupported.push(e);
                blocked.extend(node.output.iter().filter(|o| !o.is_empty()).cloned());
            }
            Err(e) => return Err(e),
        }
    }
    if !unsupported.is_empty() {
        return Ok(Imported::Unsupported(unsupported));
    }
    bind_outputs(&mut im, graph).map_err(|k| err(file, k))?;
    let mut g = im.g;
    crate::passes::simplify::simplify(&mut g)
        .map_err(|e| err(file, ImportErrorKind::Invalid(format!("internal error: the imported graph does not verify: {e}"))))?;
    Ok(Imported::Graph(g))
}

/// The default-domain opset version; 0 when the model imports none (it may use only other domains, whose
/// ops are then reported as unsupported one by one).
fn default_opset(model: &ModelProto) -> Result<i64, ImportErrorKind> {
    let mut found = None;
    for o in &model.opset_import {
        if matches!(o.domain.as_deref(), None | Some("") | Some("ai.onnx")) {
            found = Some(o.version.unwrap_or(0));
        }
    }
    let Some(v) = found else { return Ok(0) };
    if !(MIN_OPSET..=MAX_OPSET).contains(&v) {
        return Err(ImportErrorKind::UnsupportedOpset { domain: String::new(), version: v });
    }
    Ok(v)
}

/// Initializers become constants; graph inputs that are not initializers become IR inputs with static types.
fn declare_values(im: &mut Importer, graph: &GraphProto, base_dir: Option<&Path>, opts: &ImportOptions) -> Result<(), ImportErrorKind> {
    if let Some(s) = graph.sparse_initializer.first() {
        let name = s.values.as_ref().and_then(|v| v.name.clone()).unwrap_or_default();
        return Err(ImportErrorKind::Unsupported {
            what: "sparse initializer".into(),
            detail: format!("sparse initializer '{name}'"),
        });
    }
    for t in &graph.initializer {
        let name = t.name.clone().unwrap_or_default();
        if name.is_empty() {
            return Err(ImportErrorKind::Invalid("an initializer has no name".into()));
        }
        if im.defined_by.insert(name.clone(), "initializer".into()).is_some() {
            return Err(ImportErrorKind::Invalid(format!("the value name '{name}' is written by two initializers")));
        }
        let tensor = tensor_from_proto(t, base_dir)?;
        let v = im.g.add_const(name.clone(), tensor);
        im.env.insert(name, v);
    }
    let mut used_shapes = 0;
    for vi in &graph.input {
        let name = vi.name.clone().unwrap_or_default();
        match im.defined_by.get(&name).map(String::as_str) {
            Some("initializer") => continue, // an input with a default value: a constant, as the ONNX runtime treats it in inference
            Some(_) => return Err(ImportErrorKind::Invalid(format!("the value name '{name}' is listed twice as a graph input"))),
            None => {}
        }
        im.defined_by.insert(name.clone(), "graph input".into());
        let ty = input_type(vi, &name, opts)?;
        if opts.shapes.contains_key(&name) {
            used_shapes += 1;
        }
        let v = im.g.add_input(name.clone(), ty);
        im.env.insert(name, v);
    }
    if used_shapes != opts.shapes.len() {
        let unknown: Vec<&String> = opts.shapes.keys().filter(|k| !graph.input.iter().any(|i| i.name.as_ref() == Some(k))).collect();
        let inputs: Vec<&str> = im.g.inputs.iter().map(|&v| im.g.value(v).name.as_str()).collect();
        return Err(ImportErrorKind::Missing(format!("--shape names {unknown:?}, which are not graph inputs (inputs: {inputs:?})")));
    }
    Ok(())
}

/// The static type of a graph input: its element type, and its dimensions with symbolic ones taken from `--shape`.
fn input_type(vi: &ValueInfoProto, name: &str, opts: &ImportOptions) -> Result<TensorType, ImportErrorKind> {
    let what = format!("graph input '{name}'");
    let tt = match vi.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(tt)) => tt,
        Some(_) => {
            return Err(ImportErrorKind::Unsupported {
                what: "non-tensor input".into(),
                detail: format!("{what} is not a tensor (sequence, map, optional or sparse)"),
            })
        }
        None => return Err(ImportErrorKind::Invalid(format!("{what} has no type"))),
    };
    let dtype = dtype_from_onnx(tt.elem_type.unwrap_or(0), &what)?;
    let given = opts.shapes.get(name);
    let Some(shape) = &tt.shape else {
        return match given {
            Some(s) => Ok(TensorType::new(dtype, s.clone())),
            None => Err(ImportErrorKind::NotStatic(format!("{what} has no shape in the model; give one with --shape {name}=..."))),
        };
    };
    use super::proto::tensor_shape_proto::dimension::Value as Dim;
    if let Some(g) = given {
        if g.len() != shape.dim.len() {
            return Err(ImportErrorKind::Invalid(format!(
                "--shape {name} has rank {}, but the model declares rank {}",
                g.len(),
                shape.dim.len()
            )));
        }
    }
    let mut dims = Vec::with_capacity(shape.dim.len());
    for (i, d) in shape.dim.iter().enumerate() {
        let fixed = match d.value {
            Some(Dim::DimValue(v)) if v >= 0 => Some(v as usize),
            _ => None,
        };
        match (fixed, given) {
            (Some(f), Some(g)) if g[i] != f => {
                return Err(ImportErrorKind::Invalid(format!(
                    "--shape {name}: dimension {i} is {} but the model fixes it to {f}",
                    g[i]
                )))
            }
            (Some(f), _) => dims.push(f),
            (None, Some(g)) => dims.push(g[i]),
            (None, None) => {
                let sym = match &d.value {
                    Some(Dim::DimParam(p)) => format!("'{p}'"),
                    _ => "unknown".into(),
                };
                return Err(ImportErrorKind::NotStatic(format!(
                    "{what} has a symbolic dimension {sym} at axis {i}; fix it with --shape {name}=..."
                )));
            }
        }
    }
    check_size(&what, &dims, dtype)?;
    Ok(TensorType::new(dtype, dims))
}


fn convert_node(im: &mut Importer, node: &NodeProto, index: usize) -> NResult<()> {
    let op_type = node.op_type.as_deref().unwrap_or("");
    if !matches!(node.domain.as_deref(), None | Some("") | Some("ai.onnx")) {
        return Err(NodeError { attribute: None, kind: ImportErrorKind::UnsupportedOp { op: op_label(node) } });
    }
    if im.opset == 0 {
        return Err(NodeError::invalid("the model uses an ai.onnx op but imports no ai.onnx opset"));
    }
    let Some(convert) = ops::converter(op_type) else {
        return Err(NodeError { attribute: None, kind: ImportErrorKind::UnsupportedOp { op: op_type.to_string() } });
    };
    let base = match node.name.as_deref() {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => node.output.iter().find(|s| !s.is_empty()).cloned().unwrap_or_else(|| format!("#{index}")),
    };
    claim_outputs(im, node, index)?;
    let n = NodeCx { proto: node, attrs: Attrs::new(node), op_type, base, emitted: std::cell::Cell::new(0) };
    let first_new = im.g.values.len();
    let outs = convert(im, &n)?;
    for (i, name) in node.output.iter().enumerate() {
        if name.is_empty() {
            continue;
        }
        match outs.get(i) {
            Some(&v) => {
                // Values created by this node take the ONNX output names; aliases (an Identity-like node
                // returning its input) keep theirs.
                if v.index() >= first_new {
                    im.g.values[v.index()].name = name.clone();
                }
                im.env.insert(name.clone(), v);
            }
            None => {
                if !im.unavailable.contains_key(name) {
                    im.unavailable.insert(name.clone(), format!("output {i} of {op_type}, which this importer does not produce"));
                }
            }
        }
    }
    Ok(())
}

/// Records the node as the writer of its output names; a name already written (by an earlier node, a graph
/// input, an initializer, or twice by this node) is an error naming the name and the earlier writer. ONNX
/// graphs are in SSA form: without this check the later writer silently wins and the model compiles to
/// something other than what it says.
fn claim_outputs(im: &mut Importer, node: &NodeProto, index: usize) -> NResult<()> {
    let this = format!("node '{}' ({})", node_label(node, index), op_label(node));
    for (i, name) in node.output.iter().enumerate() {
        if name.is_empty() {
            continue;
        }
        if let Some(j) = node.output[..i].iter().position(|o| o == name) {
            return Err(NodeError::invalid(format!("outputs {j} and {i} are both named '{name}'; a value name may be written only once")));
        }
        if let Some(first) = im.defined_by.get(name) {
            return Err(NodeError::invalid(format!(
                "output {i} '{name}' is already written by {first}; a value name may be written only once"
            )));
        }
    }
    for name in node.output.iter().filter(|s| !s.is_empty()) {
        im.defined_by.insert(name.clone(), this.clone());
    }
    Ok(())
}

fn bind_outputs(im: &mut Importer, graph: &GraphProto) -> Result<(), ImportErrorKind> {
    if graph.output.is_empty() {
        return Err(ImportErrorKind::Invalid("the graph has no outputs".into()));
    }
    for (pos, o) in graph.output.iter().enumerate() {
        let name = o.name.clone().unwrap_or_default();
        if let Some(first) = graph.output[..pos].iter().position(|p| p.name.as_deref().unwrap_or_default() == name) {
            let writer = im.defined_by.get(&name).map_or(String::new(), |w| format!(" (written by {w})"));
            return Err(ImportErrorKind::Invalid(format!("the graph output '{name}'{writer} is listed twice, as outputs {first} and {pos}")));
        }
        let v = match im.env.get(&name) {
            Some(&v) => v,
            None => {
                return Err(match im.unavailable.get(&name) {
                    Some(why) => ImportErrorKind::Unsupported { what: "unsupported optional output".into(), detail: format!("graph output '{name}' is {why}") },
                    None => ImportErrorKind::Missing(format!("graph output '{name}' is not produced by any node")),
                })
            }
        };
        if matches!(im.g.value(v).def, ValueDef::Node { .. } | ValueDef::Const(_)) && !im.g.outputs.contains(&v) {
            im.g.values[v.index()].name = name;
        }
        im.g.outputs.push(v);
    }
    Ok(())
}
