//! `tessera explain ARTIFACT`: what an artifact records about its plan, read with `tessera inspect`'s reader:
//! how it was built, and which backend's kernel runs each partition. An artifact does not record which graph
//! nodes a partition covers, nor the costs and alternatives the search weighed: those are in the store that
//! built it, and the report gives the `tessera explain` command that shows them there.

use crate::inspect::{ArtifactReport, PartitionRow};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use tessera_kernels::artifact::Provenance;

/// The report (`--json` prints it).
#[derive(Clone, Debug, Serialize)]
pub struct ArtifactExplanation {
    pub file: String,
    pub model: String,
    pub provenance: Option<Provenance>,
    /// A batched artifact's batch sizes (absent for one plan); the partitions are then its first plan's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub batches: Vec<u64>,
    /// In execution order.
    pub partitions: Vec<PartitionRow>,
    pub partitions_by_backend: BTreeMap<String, usize>,
    /// What the artifact does not record.
    pub not_recorded: &'static str,
    /// The command showing the plan's nodes, costs and alternatives from the store that built the artifact,
    /// made from its provenance (`None` without one). Run it where the source model is (for an ONNX file, in
    /// its folder); a frozen build needs the GPU fingerprint its `measured_on` option records, in a file.
    pub explain_source: Option<String>,
}

const NOT_RECORDED: &str = "an artifact records each partition's backend and kernel, not the graph nodes it covers nor the costs and alternatives the search weighed";

/// Quotes `s` for a POSIX shell when it needs it.
fn quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.,:/=+@%".contains(c)) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `tessera explain SOURCE --target T... --costs C [--shape N=D]... [--measured-on FINGERPRINT.json]`.
fn explain_command(p: &Provenance) -> String {
    let mut c = format!("tessera explain {}", quote(&p.source.name));
    for t in &p.targets {
        c += &format!(" --target {}", quote(t));
    }
    c += &format!(" --costs {}", quote(&p.costs));
    for (k, v) in &p.options {
        if let Some(input) = k.strip_prefix("shape.") {
            c += &format!(" --shape {}", quote(&format!("{input}={v}")));
        }
    }
    if p.options.contains_key("measured_on") {
        c += " --measured-on FINGERPRINT.json";
    }
    c
}

/// Explains the artifact `report` describes.
pub fn explain(report: &ArtifactReport) -> ArtifactExplanation {
    ArtifactExplanation {
        file: report.file.clone(),
        model: report.model.clone(),
        provenance: report.provenance.clone(),
        batches: report.batches.clone(),
        partitions: report.partitions.clone(),
        partitions_by_backend: report.steps_per_backend.clone(),
        not_recorded: NOT_RECORDED,
        explain_source: report.provenance.as_ref().map(explain_command),
    }
}

/// The text report.
pub fn render_text(e: &ArtifactExplanation) -> String {
    let mut s = String::new();
    let per: Vec<String> = e.partitions_by_backend.iter().map(|(b, n)| format!("{b} {n}")).collect();
    let _ = writeln!(s, "artifact {}: model {}, {} partitions ({})", e.file, e.model, e.partitions.len(), per.join(", "));
    for line in crate::inspect::provenance_lines(e.provenance.as_ref()) {
        let _ = writeln!(s, "{line}");
    }
    if let Some(first) = e.batches.first() {
        let sizes: Vec<String> = e.batches.iter().map(|b| b.to_string()).collect();
        let _ = writeln!(s, "plans for batch sizes {}: the partitions below are the first plan's (batch {first}); `tessera inspect` lists every plan", sizes.join(", "));
    }
    let _ = writeln!(s, "partitions, in execution order:");
    for p in &e.partitions {
        let _ = writeln!(s, "  {:<4} {:<8} {:<28} {}", p.step, p.backend, p.kernel, p.target);
    }
    let _ = writeln!(s, "Not recorded: {}.", e.not_recorded);
    if let Some(c) = &e.explain_source {
        let _ = writeln!(s, "With the store that built it, this shows them: {c}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_kernels::artifact::{Blake3, SourceModel};

    #[test]
    fn the_command_rebuilds_the_explain_of_the_source_from_the_provenance() {
        let p = Provenance {
            tessera_version: "0.1.0".into(),
            source_revision: "unknown".into(),
            source: SourceModel { kind: "onnx".into(), name: "my model.onnx".into(), digest: Blake3([0; 32]) },
            targets: vec!["cpu -compiler=c -opt-level=2".into(), "cpu -compiler=gemm".into()],
            precision: "fp32".into(),
            costs: "recorded".into(),
            options: [("shape.ids".to_string(), "1x128".to_string()), ("measured_on".to_string(), "{}".to_string())].into(),
        };
        assert_eq!(
            explain_command(&p),
            "tessera explain 'my model.onnx' --target 'cpu -compiler=c -opt-level=2' --target 'cpu -compiler=gemm' --costs recorded \
             --shape ids=1x128 --measured-on FINGERPRINT.json"
        );
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
