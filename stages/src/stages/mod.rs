//! Every stage of a build, one module each, and the DAG they form, declared once: [`DAG`].
//!
//! A stage is a pure function of its key ([`crate::stage::Stage`]); the pipeline's driver looks each key up in
//! the store and computes only on a miss. The stages read one another's outputs by digest, so an unchanged
//! output cuts off everything after it. What is not in this folder is library code that stages call (the
//! graph IR, the importer, the interpreter, the passes, partitioning's search, the backends); [`crate::build`]
//! runs one model's DAG, and no stage imports it.
//!
//! [`DAG`] is the one list of stages. A test reads the source for every `impl Stage` and fails if one is
//! missing from it or sits in another file; the import guard derives the stage files from it; ARCHITECTURE.md's
//! stage table is checked against it; a build through a recording driver checks that the stages run in an
//! order the edges allow.

pub mod artifact;
pub mod calibrate;
pub mod compile;
pub mod layout;
pub mod link;
pub mod load;
pub mod lower;
pub mod onnx_externals;
pub mod partition;
pub mod precision;
pub mod prune;
pub mod select;
pub mod targets;
pub mod tune;
pub mod validate;

use crate::stage::Stage;

/// One stage of the DAG.
#[derive(Debug)]
pub struct StageDecl {
    /// The stage's name ([`Stage::NAME`]): in the memo table, the counters and every report.
    pub name: &'static str,
    /// The file, in this folder, that implements it.
    pub file: &'static str,
    /// The stages whose outputs it reads (their digests are in its key): each one that runs in a build runs
    /// before it.
    pub reads: &'static [&'static str],
    /// The stages it calls from inside its computation (they run while it runs).
    pub calls: &'static [&'static str],
    /// When a build runs it.
    pub when: &'static str,
}

/// The stage DAG, in the order a build runs it.
pub const DAG: &[StageDecl] = &[
    StageDecl {
        name: <targets::Targets<'static> as Stage>::NAME,
        file: "targets.rs",
        reads: &[],
        calls: &[],
        when: "every build: the canonical target set",
    },
    StageDecl {
        name: <onnx_externals::ExternalFiles<'static> as Stage>::NAME,
        file: "onnx_externals.rs",
        reads: &[],
        calls: &[],
        when: "ONNX files: the external data files the model names, for the load key",
    },
    StageDecl {
        name: <load::Load<'static> as Stage>::NAME,
        file: "load.rs",
        reads: &["onnx-externals"],
        calls: &[],
        when: "every model: the graph document",
    },
    StageDecl {
        name: <calibrate::Calibrate<'static> as Stage>::NAME,
        file: "calibrate.rs",
        reads: &["load"],
        calls: &[],
        when: "-precision=fp16: every value's largest magnitude on calibration inputs",
    },
    StageDecl {
        name: <precision::ReducePrecision<'static> as Stage>::NAME,
        file: "precision.rs",
        reads: &["load", "calibrate"],
        calls: &[],
        when: "-precision=fp16 or bf16: the reduced graph document",
    },
    StageDecl {
        name: <layout::ChannelsLast<'static> as Stage>::NAME,
        file: "layout.rs",
        reads: &["load", "precision"],
        calls: &[],
        when: "-layout=nhwc or auto on models with 2-D convolutions: the channels-last document",
    },
    StageDecl {
        name: <partition::Partition<'static> as Stage>::NAME,
        file: "partition.rs",
        reads: &["targets", "load", "precision", "layout"],
        calls: &["tune", "time-plans"],
        when: "every model: the execution plan",
    },
    StageDecl {
        name: <tune::Tune<'static> as Stage>::NAME,
        file: "tune.rs",
        reads: &[],
        calls: &["lower", "compile"],
        when: "measured costs: one candidate's measurements, called by partition",
    },
    StageDecl {
        name: <validate::TimePlans<'static> as Stage>::NAME,
        file: "validate.rs",
        reads: &[],
        calls: &["lower", "compile", "link"],
        when: "measured costs: the trial plans timed end to end, called by partition's validation",
    },
    StageDecl {
        name: <lower::Lower<'static> as Stage>::NAME,
        file: "lower.rs",
        reads: &["partition"],
        calls: &[],
        when: "every distinct kernel of the plan",
    },
    StageDecl {
        name: <compile::Compile<'static> as Stage>::NAME,
        file: "compile.rs",
        reads: &["lower"],
        calls: &[],
        when: "one module per backend of the plan",
    },
    StageDecl {
        name: <link::Link<'static> as Stage>::NAME,
        file: "link.rs",
        reads: &["partition", "compile"],
        calls: &[],
        when: "every model: one artifact",
    },
    StageDecl {
        name: <link::LinkBatches<'static> as Stage>::NAME,
        file: "link.rs",
        reads: &["link"],
        calls: &[],
        when: "--batch with several sizes: one artifact of every batch size's plan",
    },
];

/// The declaration of the stage named `name`.
pub fn decl(name: &str) -> Option<&'static StageDecl> {
    DAG.iter().find(|s| s.name == name)
}

/// The files of this folder that run stages but hold none: what the partition stage runs (`select.rs`: costed
/// candidates and the plan of a selection; `prune.rs`: what pruned tuning measures), and `artifact.rs`: the
/// lower, compile and link calls for one plan that both the build and validation run.
pub const HELPERS: &[&str] = &["select.rs", "prune.rs", "artifact.rs"];

/// Every file of this folder: those that hold stages (each once, in DAG order), then [`HELPERS`].
pub fn files() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for f in DAG.iter().map(|s| s.file).chain(HELPERS.iter().copied()) {
        if !out.contains(&f) {
            out.push(f);
        }
    }
    out
}

#[cfg(test)]
mod dag_tests;
#[cfg(test)]
#[path = "keys_tests.rs"]
mod keys_tests;
