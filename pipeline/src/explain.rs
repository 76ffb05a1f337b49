//! `tessera explain`: which backend runs which nodes of a model, what each partition costs and where that
//! cost came from, and the best alternative each partition beat.
//!
//! Everything here reads the partition stage's stored output ([`ExecPlan`]) and the loaded graph document the
//! plan's node indices refer to, never the partitioner itself: whichever partitioner produced the plan (rules
//! today, the Collage search tomorrow), the report shows what the compiled artifact will execute.

pub mod artifact;
pub mod svg;

use crate::build::Ctx;
use crate::job::{ModelJob, ModelSource};
use tessera_stages::build::PlannedModel;
use tessera_stages::partition::plan::{Alternative, ExecPlan};
use crate::zoo::jobs_from_inputs;
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use tessera_fixtures::{load_manifest, ModelOptions, Precision, Source};
use tessera_stages::backend::lowering::cost::{boundary_bytes, partition_flops};
use tessera_stages::ir::{Graph, NodeId};
use tessera_stages::stages::precision::KeptNode;
use tessera_stages::target::TargetSet;

/// The syntax of a fixture spec, for help texts and errors.
pub const FIXTURE_SPEC_HELP: &str = "fixture:MODEL[:bBATCH][:sSEQ][:iIMAGE] (e.g. fixture:bert-base:b1:s128, fixture:resnet18:i32; BATCH may list several sizes, fixture:mlp3:b1,8)";

/// Parses `fixture:MODEL[:bN][:sN][:iN]` into a job named as a manifest entry with the same options would be
/// (`<model>-b<batch>[-s<seq>][-i<image>]`), so explain, baselines and compile agree on model names.
pub fn parse_fixture_spec(spec: &str) -> Result<ModelJob> {
    let rest = spec.strip_prefix("fixture:").with_context(|| format!("'{spec}' is not a fixture spec: expected {FIXTURE_SPEC_HELP}"))?;
    let mut parts = rest.split(':');
    let model = parts.next().unwrap_or_default();
    if model.is_empty() {
        bail!("'{spec}': the fixture spec names no model: expected {FIXTURE_SPEC_HELP}");
    }
    let mut options = ModelOptions { batch: 1, seq: None, image: None };
    let mut batches = Vec::new();
    let mut seen = [false; 3];
    for p in parts {
        let (slot, which) = match p.chars().next() {
            Some('b') => (0, "batch"),
            Some('s') => (1, "seq"),
            Some('i') => (2, "image"),
            _ => bail!("'{spec}': '{p}' is not an option: expected bN (batch), sN (sequence length) or iN (image size)"),
        };
        if std::mem::replace(&mut seen[slot], true) {
            bail!("'{spec}': {which} is given twice");
        }
        if slot == 0 {
            // Several batch sizes: one artifact with a plan per size (see `tessera compile --batch`).
            let sizes = tessera_fixtures::batch::parse_batches(&p[1..]).map_err(|e| anyhow::anyhow!("'{spec}': {e}"))?;
            options.batch = sizes[0];
            if sizes.len() > 1 {
                batches = sizes;
            }
            continue;
        }
        let n: usize = p[1..].parse().map_err(|_| anyhow::anyhow!("'{spec}': {which} '{}' is not a positive integer", &p[1..]))?;
        match slot {
            1 => options.seq = Some(n),
            _ => options.image = Some(n),
        }
    }
    tessera_fixtures::registry::resolve(model, &options).with_context(|| format!("fixture spec '{spec}'"))?;
    if let Some(&last) = batches.last() {
        tessera_fixtures::registry::resolve(model, &ModelOptions { batch: last, ..options }).with_context(|| format!("fixture spec '{spec}'"))?;
    }
    let name = tessera_fixtures::batch::default_batched_name(model, &options, &batches);
    Ok(ModelJob { name, source: ModelSource::Fixture { model: model.to_string(), options }, batches })
}

/// The job for `tessera explain MODEL`: with `manifest`, MODEL is an entry name of that manifest; otherwise
/// a fixture spec (`fixture:...`) or an ONNX file (with `shapes` fixing its inputs).
pub fn job_for_model(model: &str, manifest: Option<&Path>, shapes: &BTreeMap<String, Vec<usize>>) -> Result<ModelJob> {
    if let Some(path) = manifest {
        let m = load_manifest(path)?;
        let names: Vec<String> = m.entries.iter().map(|e| e.name.clone()).collect();
        let Some(e) = m.entries.into_iter().find(|e| e.name == model) else {
            bail!("{}: no entry is named '{model}'; entries: {}", path.display(), names.join(", "));
        };
        if e.precision != Precision::Fp32 {
            bail!("{}: entry '{}' asks for {} precision; the CPU backends compile fp32 only", path.display(), e.name, e.precision);
        }
        let source = match e.source {
            Source::Fixture { model, options } => ModelSource::Fixture { model, options },
            Source::Onnx { resolved, shapes, .. } => ModelSource::Onnx { path: resolved, shapes },
        };
        return Ok(ModelJob { name: e.name, source, batches: e.batches });
    }
    if model.starts_with("fixture:") {
        return parse_fixture_spec(model);
    }
    if model.ends_with(".onnx") {
        let mut jobs = jobs_from_inputs(&[PathBuf::from(model)], shapes)?;
        return Ok(jobs.remove(0));
    }
    bail!("'{model}': expected an ONNX file (.onnx), a fixture spec {FIXTURE_SPEC_HELP}, or a manifest entry name with --manifest FILE")
}

/// Jobs for commands taking several inputs (`tessera baselines`): ONNX files and manifests as `compile`
/// takes them, plus fixture specs. Names must be unique across the run.
pub fn jobs_from_specs(inputs: &[String], shapes: &BTreeMap<String, Vec<usize>>) -> Result<Vec<ModelJob>> {
    let mut jobs = Vec::new();
    for i in inputs {
        if i.starts_with("fixture:") {
            jobs.push(parse_fixture_spec(i)?);
        } else {
            jobs.extend(jobs_from_inputs(&[PathBuf::from(i)], shapes)?);
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for j in &jobs {
        if !seen.insert(j.name.clone()) {
            bail!("two models are named '{}': give each model once", j.name);
        }
    }
    if jobs.is_empty() {
        bail!("no models given");
    }
    Ok(jobs)
}

/// Runs the load and partition stages of `job` (memoized: a warm store only reads); the plan's node indices
/// refer to `planned.graph.get()`.
pub fn plan_model<'a>(ctx: &Ctx<'a>, job: &ModelJob) -> Result<PlannedModel<'a>> {
    tessera_stages::build::plan_model(ctx, job)
}

/// One node of a partition: its index in the loaded graph (stable for a given graph document), its name and op.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeRef {
    pub index: u32,
    pub name: String,
    pub op: String,
}

/// One partition as `explain` reports it, in execution order.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PartitionReport {
    pub index: usize,
    pub backend: String,
    pub target: String,
    pub nodes: Vec<NodeRef>,
    pub cost_us: f64,
    pub cost_source: String,
    pub alternative: Option<Alternative>,
    /// The partition's work, for its floor (the time it takes at the device's peak rates): floating-point
    /// operations of its matrix products (MatMul, convolutions, attention), and the bytes it reads from and
    /// writes to outside itself (weights included; what stays inside is not counted).
    pub gemm_flops: f64,
    pub boundary_bytes: u64,
    /// In an fp16 build: this partition's nodes that compute in fp32 (or bf16, `-overflow=bf16`) because their
    /// values left fp16's range on the calibration inputs, with the largest magnitude seen. (The field keeps its
    /// first name; `KeptRef::dtype` says which type.)
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept_fp32: Vec<KeptRef>,
}

/// A node kept out of fp16 (see [`PartitionReport::kept_fp32`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KeptRef {
    pub name: String,
    pub max_abs: f32,
    /// The type it computes in: `f32`, or `bf16` with `-overflow=bf16`.
    pub dtype: String,
}

/// Sums over the partitions of one backend (or all of them).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Total {
    pub partitions: usize,
    pub nodes: usize,
    pub cost_us: f64,
}

/// The whole report: what `--json` prints.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Explanation {
    pub model: String,
    pub targets: Vec<String>,
    pub cost_source: String,
    pub partitions: Vec<PartitionReport>,
    pub by_backend: BTreeMap<String, Total>,
    pub total: Total,
    /// The end-to-end check against the single-backend plans, where one ran (measured costs, several targets).
    pub validation: Option<tessera_stages::partition::plan::Validation>,
    /// How `-layout=auto` chose between channels-first and channels-last, where it did (set by the caller:
    /// a plan does not record it).
    pub layout: Option<tessera_stages::stages::layout::LayoutChoice>,
}

/// Builds the report of a plan over the graph its node indices refer to.
/// `kept` lists the nodes a reduced-precision build kept in fp32 (empty otherwise).
pub fn explain_plan(model: &str, plan: &ExecPlan, g: &Graph, targets: &TargetSet, kept: &[KeptNode]) -> Result<Explanation> {
    let kept: BTreeMap<&str, f32> = kept.iter().map(|k| (k.name.as_str(), k.max_abs)).collect();
    let kept_in = tessera_stages::stages::precision::kept_dtype(targets.overflow()?).name();
    let mut partitions = Vec::with_capacity(plan.partitions.len());
    let mut by_backend: BTreeMap<String, Total> = BTreeMap::new();
    let mut total = Total::default();
    for (i, p) in plan.partitions.iter().enumerate() {
        let mut nodes = Vec::with_capacity(p.nodes.len());
        for &n in &p.nodes {
            let node = g.nodes.get(n as usize).with_context(|| {
                format!("model {model}: partition {i} names node {n}, but the graph has {} nodes (plan and graph disagree)", g.nodes.len())
            })?;
            nodes.push(NodeRef { index: n, name: node.name.clone(), op: node.op.name().to_string() });
        }
        let ids: Vec<NodeId> = p.nodes.iter().map(|&n| NodeId(n)).collect();
        let backend = p.target.backend_name().to_string();
        let kept_fp32 = nodes.iter().filter_map(|n| kept.get(n.name.as_str()).map(|&m| KeptRef { name: n.name.clone(), max_abs: m, dtype: kept_in.to_string() })).collect();
        for t in [by_backend.entry(backend.clone()).or_default(), &mut total] {
            t.partitions += 1;
            t.nodes += nodes.len();
            t.cost_us += p.cost_us;
        }
        partitions.push(PartitionReport {
            index: i,
            backend,
            target: p.target.to_string(),
            nodes,
            cost_us: p.cost_us,
            cost_source: p.cost_source.clone(),
            alternative: p.alternative.clone(),
            gemm_flops: partition_flops(g, &ids).0,
            boundary_bytes: boundary_bytes(g, &ids) as u64,
            kept_fp32,
        });
    }
    Ok(Explanation {
        model: model.to_string(),
        targets: targets.targets.iter().map(|t| t.to_string()).collect(),
        cost_source: plan.cost_source.clone(),
        partitions,
        by_backend,
        total,
        validation: plan.validation.clone(),
        layout: None,
    })
}

/// Partitions longer than this show their first and last nodes only.
const SHOW_NODES: usize = 8;

fn node_list(nodes: &[NodeRef]) -> String {
    let show = |n: &NodeRef| format!("#{} {} ({})", n.index, n.name, n.op);
    if nodes.len() <= SHOW_NODES {
        return nodes.iter().map(show).collect::<Vec<_>>().join(", ");
    }
    let head: Vec<String> = nodes[..4].iter().map(show).collect();
    let tail: Vec<String> = nodes[nodes.len() - 2..].iter().map(show).collect();
    // Ops of the elided middle, counted, so a long partition still says what it holds.
    let mut ops: BTreeMap<&str, usize> = BTreeMap::new();
    for n in &nodes[4..nodes.len() - 2] {
        *ops.entry(n.op.as_str()).or_default() += 1;
    }
    let mid: Vec<String> = ops.iter().map(|(op, c)| format!("{c} {op}")).collect();
    format!("{}, ... {} more: {} ..., {}", head.join(", "), nodes.len() - 6, mid.join(", "), tail.join(", "))
}

fn share(part: f64, whole: f64) -> f64 {
    if whole > 0.0 { 100.0 * part / whole } else { 0.0 }
}

/// The text report: one block per partition in execution order, then totals per backend and overall.
pub fn render_text(ex: &Explanation) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "model {}: {} nodes in {} partitions, costs {}", ex.model, ex.total.nodes, ex.total.partitions, ex.cost_source);
    for t in &ex.targets {
        let _ = writeln!(s, "  target {t}");
    }
    let _ = writeln!(s);
    for p in &ex.partitions {
        let _ = write!(s, "[{}] {} ({}), {} node{}, {:.1} us ({})", p.index, p.backend, p.target, p.nodes.len(), if p.nodes.len() == 1 { "" } else { "s" }, p.cost_us, p.cost_source);
        match &p.alternative {
            Some(a) => {
                let _ = writeln!(s, "; best {} candidate holding its first node: {:.1} us ({})", a.backend, a.cost_us, a.cost_source);
            }
            None => {
                let _ = writeln!(s, "; no alternative considered");
            }
        }
        let _ = writeln!(s, "    {}", node_list(&p.nodes));
        let _ = writeln!(s, "    work: {:.2} GFLOP in matrix products, {:.2} MB in and out", p.gemm_flops / 1e9, p.boundary_bytes as f64 / 1e6);
        if !p.kept_fp32.is_empty() {
            let shown: Vec<String> = p.kept_fp32.iter().map(|k| format!("{} (|x| up to {:.3e})", k.name, k.max_abs)).collect();
            let dtype = if p.kept_fp32[0].dtype == "f32" { "fp32" } else { "bf16" };
            let _ = writeln!(s, "    in {dtype}, beyond fp16's range on the calibration inputs: {}", shown.join(", "));
        }
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "{:<10} {:>10} {:>7} {:>12} {:>7}", "backend", "partitions", "nodes", "cost us", "share");
    for (b, t) in &ex.by_backend {
        let _ = writeln!(s, "{:<10} {:>10} {:>7} {:>12.1} {:>6.1}%", b, t.partitions, t.nodes, t.cost_us, share(t.cost_us, ex.total.cost_us));
    }
    let t = &ex.total;
    let _ = writeln!(s, "{:<10} {:>10} {:>7} {:>12.1} {:>6.1}%", "total", t.partitions, t.nodes, t.cost_us, share(t.cost_us, t.cost_us));
    if let Some(v) = &ex.validation {
        s += &render_validation(v);
    }
    if let Some(l) = &ex.layout {
        s += &render_layout(l);
    }
    s
}

/// The layout block: both layouts' plans, their estimates and measured medians, and the choice.
fn render_layout(l: &tessera_stages::stages::layout::LayoutChoice) -> String {
    let mut s = String::new();
    let _ = writeln!(s);
    let _ = writeln!(s, "layout (-layout=auto, by {}): {} used", l.by, l.chosen.name());
    let _ = writeln!(s, "{:<12} {:>10} {:>12} {:>12}", "layout", "partitions", "estimate us", "median us");
    for t in &l.trials {
        let median = t.median_us.map(|m| format!("{m:.1}")).unwrap_or_else(|| "-".into());
        let used = if t.layout == l.chosen { "  used" } else { "" };
        let _ = writeln!(s, "{:<12} {:>10} {:>12.1} {:>12}{used}", t.layout.name(), t.partitions, t.estimated_us, median);
    }
    s
}

/// The validation block: every whole-model plan considered, its estimate and measured median, and the choice.
fn render_validation(v: &tessera_stages::partition::plan::Validation) -> String {
    let mut s = String::new();
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "validated end to end: '{}' used (the searched plan is kept when {:.0}% faster than every measured alternative)",
        v.chosen,
        100.0 * v.margin
    );
    let _ = writeln!(s, "{:<12} {:>10} {:>12} {:>12} {:>6}  ", "plan", "partitions", "estimate us", "median us", "runs");
    for t in &v.trials {
        let median = t.median_us.map(|m| format!("{m:.1}")).unwrap_or_else(|| "-".into());
        let note = match (&t.skipped, t.label == v.chosen) {
            (Some(why), _) => format!("not measured: {why}"),
            (None, true) => "used".to_string(),
            (None, false) => String::new(),
        };
        let _ = writeln!(s, "{:<12} {:>10} {:>12.1} {:>12} {:>6}  {}", t.label, t.partitions, t.estimated_us, median, t.runs, note);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixture_specs_parse_and_validate() {
        let j = parse_fixture_spec("fixture:bert-base:b1:s128").unwrap();
        assert_eq!(j.name, "bert-base-b1-s128");
        match j.source {
            ModelSource::Fixture { model, options } => {
                assert_eq!(model, "bert-base");
                assert_eq!(options, ModelOptions { batch: 1, seq: Some(128), image: None });
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(parse_fixture_spec("fixture:mlp3").unwrap().name, "mlp3-b1");
        assert_eq!(parse_fixture_spec("fixture:resnet18:i32:b2").unwrap().name, "resnet18-b2-i32");
        // Several batch sizes: one batched job, its source at the smallest.
        let j = parse_fixture_spec("fixture:bert-tiny:b8,1:s16").unwrap();
        assert_eq!((j.name.as_str(), j.batches.as_slice()), ("bert-tiny-b1_8-s16", &[1, 8][..]));
        assert!(matches!(j.source, ModelSource::Fixture { options, .. } if options.batch == 1));
        assert_eq!(parse_fixture_spec("fixture:mlp3:b1-4").unwrap().batches, [1, 2, 4]);
        for (bad, says) in [
            ("fixture:", "names no model"),
            ("fixture:nope", "unknown model"),
            ("fixture:mlp3:x4", "'x4' is not an option"),
            ("fixture:mlp3:b", "'' is not a size"),
            ("fixture:mlp3:b1:b2", "given twice"),
            ("fixture:mlp3:s12", "not a sequence model"),
            ("fixture:mlp3:b0", "at least 1, got 0"),
            ("fixture:mlp3:b1,1", "1 is given twice"),
        ] {
            let e = format!("{:#}", parse_fixture_spec(bad).unwrap_err());
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn model_arguments_name_what_is_expected() {
        let none = BTreeMap::new();
        let e = job_for_model("resnet", None, &none).unwrap_err().to_string();
        assert!(e.contains("fixture:") && e.contains(".onnx") && e.contains("--manifest"), "{e}");
        let d = tempfile::tempdir().unwrap();
        let m = d.path().join("zoo.toml");
        std::fs::write(&m, "[[entry]]\nmodel = \"mlp3\"\n\n[[entry]]\nname = \"small\"\nmodel = \"resnet18\"\nimage = 32\n").unwrap();
        let j = job_for_model("small", Some(&m), &none).unwrap();
        assert!(matches!(j.source, ModelSource::Fixture { ref model, .. } if model == "resnet18"));
        let e = job_for_model("big", Some(&m), &none).unwrap_err().to_string();
        assert!(e.contains("zoo.toml") && e.contains("mlp3-b1, small"), "{e}");
        let e = jobs_from_specs(&["fixture:mlp3".into(), "fixture:mlp3:b1".into()], &none).unwrap_err().to_string();
        assert!(e.contains("mlp3-b1"), "{e}");
    }

    #[test]
    fn long_partitions_are_abbreviated_with_op_counts() {
        let nodes: Vec<NodeRef> = (0..20).map(|i| NodeRef { index: i, name: format!("n{i}"), op: if i % 2 == 0 { "Add" } else { "Mul" }.into() }).collect();
        let s = node_list(&nodes);
        assert!(s.starts_with("#0 n0 (Add), #1 n1 (Mul), #2 n2 (Add), #3 n3 (Mul), ... 14 more: 7 Add, 7 Mul ..., #18 n18 (Add), #19 n19 (Mul)"), "{s}");
        assert_eq!(node_list(&nodes[..3]), "#0 n0 (Add), #1 n1 (Mul), #2 n2 (Add)");
    }
}
