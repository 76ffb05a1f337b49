//! The execution plan: the partition stage's output, everything later stages need without the graph.
//!
//! Each partition carries its target (the single source of truth for where it runs), its kernel signature
//! (the structural digest of its subgraph with weights lifted out, so identical partitions in different models
//! or layers share one lowered kernel), and how the kernel's arguments bind to graph inputs, intermediate
//! values and constants. Lower keys, compile keys and the link input are all derived from the plan, so a
//! rebuild whose plan is recorded never needs to rebuild or reload the model graph.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use super::Partitioning;
use crate::ir::{subgraph_signature, ConstMode, Graph, NodeId, SubgraphSignature, TensorType, ValueDef, ValueId};
use crate::target::Target;
use tessera_store::Digest;

/// Bump when the plan's content or meaning changes. (6: partitions carry their tuned configuration; 7: one
/// constant slot per graph value, with the value's index, so that a plan binds to other weights.)
pub const PLAN_VERSION: u32 = 7;

/// Where a kernel argument or a graph output lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PlanRef {
    Input(u32),
    Value(u32),
    Const(u32),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanPartition {
    pub target: Target,
    /// Node indices of the model graph, for reports (`tessera explain`).
    pub nodes: Vec<u32>,
    /// Structural signature of the partition with large constants lifted to inputs.
    pub kernel: Digest,
    /// Function name of the kernel in its module: derived from `kernel` (and `config`), so one per distinct
    /// kernel.
    pub symbol: String,
    /// The backend configuration the tune stage measured fastest ([`config_symbol`] names its function);
    /// `None`: the backend's default.
    pub config: Option<String>,
    /// Kernel inputs (canonical order) then kernel outputs (canonical order).
    pub args: Vec<PlanRef>,
    pub n_inputs: u32,
    pub cost_us: f64,
    /// Where `cost_us` came from: "measured" or "analytical".
    pub cost_source: String,
    /// The cheapest candidate of another backend holding this partition's first node (it may cover other
    /// nodes than this partition), if the search considered one: what the search weighed this partition against.
    pub alternative: Option<Alternative>,
}

/// The runner-up for a partition's nodes: which backend, its cost, and where that cost came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Alternative {
    pub backend: String,
    pub target: String,
    pub cost_us: f64,
    pub cost_source: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecPlan {
    pub version: u32,
    pub model: String,
    pub cost_source: String,
    pub inputs: Vec<(String, TensorType)>,
    /// Per input, the exclusive bound of random integer values that keeps gathers in range (for `bench`).
    pub input_int_bounds: Vec<i64>,
    pub outputs: Vec<(String, PlanRef)>,
    /// Types of the values exchanged between partitions.
    pub values: Vec<TensorType>,
    /// Lifted constants: the store object holding the bytes, and the type; one per graph value (the link
    /// stores equal bytes once).
    pub constants: Vec<(Digest, TensorType)>,
    /// The graph value of each constant (an index into the graph document's values): what [`ExecPlan::bind`]
    /// reads other weights from.
    pub constant_values: Vec<u32>,
    pub partitions: Vec<PlanPartition>,
    /// How the plan was chosen among whole-model alternatives measured end to end (see
    /// [`super::validate`]); `None` where no such check ran (analytical costs, a single backend, a baseline).
    pub validation: Option<Validation>,
}

impl ExecPlan {
    /// This plan for `doc`, a document of the same structure ([`crate::ir::serial::GraphDoc::structure_digest`])
    /// with other weights or another name: each constant is the object `doc` has for its value, the model is
    /// `doc`'s. Fails if `doc`'s value is not a constant of the same type (then the structures differ).
    pub fn bind(&self, doc: &crate::ir::serial::GraphDoc) -> Result<ExecPlan> {
        use crate::ir::serial::ValueDefDoc;
        if self.constants.len() != self.constant_values.len() {
            bail!("plan of '{}': {} constants but {} constant values", self.model, self.constants.len(), self.constant_values.len());
        }
        let mut constants = Vec::with_capacity(self.constants.len());
        for ((_, ty), &v) in self.constants.iter().zip(&self.constant_values) {
            match doc.values.get(v as usize) {
                Some(value) if value.ty == *ty => match value.def {
                    ValueDefDoc::Const(d) => constants.push((d, ty.clone())),
                    _ => bail!("model '{}': value {v} ('{}') is not a constant: the plan is for another graph", doc.name, value.name),
                },
                _ => bail!("model '{}': value {v} is not a constant of type {ty:?}: the plan is for another graph", doc.name),
            }
        }
        Ok(ExecPlan { model: doc.name.clone(), constants, ..self.clone() })
    }

    /// The plan's own estimate of a run: the sum of its partitions' costs (crossings not included).
    pub fn estimated_us(&self) -> f64 {
        self.partitions.iter().map(|p| p.cost_us).sum()
    }

    /// Whether two plans place the same nodes in the same partitions on the same targets (costs and
    /// reports aside): such plans compile to the same artifact.
    pub fn same_placement(&self, other: &ExecPlan) -> bool {
        self.partitions.len() == other.partitions.len()
            && self.partitions.iter().zip(&other.partitions).all(|(a, b)| a.target == b.target && a.nodes == b.nodes)
    }
}

/// The end-to-end check of a searched plan against the single-backend plans of the same run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Validation {
    /// The label of the plan used (`searched`, or a backend's name).
    pub chosen: String,
    /// The searched plan is kept only when its median beats every measured alternative by this fraction.
    pub margin: f64,
    pub trials: Vec<Trial>,
}

/// One whole-model plan considered by the validation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    /// `searched`, or the backend preferred (its device's fallback running the rest), or the fallback alone.
    pub label: String,
    pub partitions: usize,
    /// The plan itself, in the store (`tessera explain --trial LABEL` shows it).
    pub plan: Digest,
    /// Sum of the plan's partition costs.
    pub estimated_us: f64,
    /// The artifact timed, where this build linked it: absent when not measured, and when the timings of a
    /// plan of its timing identity were recorded already (`validate::timing_identity`: the same plan with
    /// other weights), so that it was not linked.
    pub artifact: Option<Digest>,
    /// Median run time of the whole artifact, measured in two passes with the other trials.
    pub median_us: Option<f64>,
    /// The median of each pass alone.
    pub pass_medians_us: Option<[f64; 2]>,
    pub runs: u32,
    /// Why it was not measured (the same placement as another trial, or an estimate far above the best).
    pub skipped: Option<String>,
}

/// The kernel symbol for a signature.
pub fn kernel_symbol(kernel: &Digest) -> String {
    format!("k_{}", &kernel.to_hex()[..20])
}

/// The function name of `kernel` in a configuration other than its backend's default: the kernel's symbol
/// and the configuration's name, characters outside `[A-Za-z0-9]` as `_` (configurations of one backend
/// differ in their names' letters and digits).
pub fn config_symbol(kernel: &Digest, config: &str) -> String {
    let tail: String = config.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    format!("{}__{tail}", kernel_symbol(kernel))
}

/// The signature of a partition's kernel for a backend that keeps constants of at most `inline_max` elements
/// inside its kernels ([`crate::backend::Backend::inline_const_max`]).
pub fn kernel_signature(g: &Graph, nodes: &[NodeId], inline_max: usize) -> SubgraphSignature {
    subgraph_signature(g, nodes, ConstMode::LiftLarge(inline_max))
}

/// Builds the plan of a partitioned graph. `const_object` gives the store digest of a constant's bytes,
/// `inline_max` a target's [`crate::backend::Backend::inline_const_max`].
pub fn build_plan(g: &Graph, parts: &Partitioning, const_object: &dyn Fn(&crate::ir::Tensor) -> Digest, inline_max: &dyn Fn(&crate::target::Target) -> usize) -> Result<ExecPlan> {
    let mut refs: BTreeMap<ValueId, PlanRef> = BTreeMap::new();
    for (i, &v) in g.inputs.iter().enumerate() {
        refs.insert(v, PlanRef::Input(i as u32));
    }
    let mut values: Vec<TensorType> = Vec::new();
    // One slot per constant value, not per distinct bytes: two values equal in these weights may differ in
    // another model's (`ExecPlan::bind`); the link stores equal bytes once.
    let mut constants: Vec<(Digest, TensorType)> = Vec::new();
    let mut constant_values: Vec<u32> = Vec::new();
    let mut const_index: BTreeMap<ValueId, u32> = BTreeMap::new();
    let mut const_ref = |v: ValueId, constants: &mut Vec<(Digest, TensorType)>, constant_values: &mut Vec<u32>| -> Option<PlanRef> {
        let t = g.constant(v)?;
        let idx = *const_index.entry(v).or_insert_with(|| {
            constants.push((const_object(t), t.ty.clone()));
            constant_values.push(v.0);
            constants.len() as u32 - 1
        });
        Some(PlanRef::Const(idx))
    };
    let mut partitions = Vec::with_capacity(parts.partitions.len());
    for p in &parts.partitions {
        let sig = kernel_signature(g, &p.nodes, inline_max(&p.target));
        let mut args = Vec::with_capacity(sig.inputs.len() + sig.outputs.len());
        for &v in &sig.inputs {
            let r = match refs.get(&v) {
                Some(&r) => r,
                None => match const_ref(v, &mut constants, &mut constant_values) {
                    Some(r) => r,
                    None => bail!("partition input '{}' is used before any partition produces it", g.value(v).name),
                },
            };
            args.push(r);
        }
        for &v in &sig.outputs {
            let r = PlanRef::Value(values.len() as u32);
            values.push(g.ty(v).clone());
            refs.insert(v, r);
            args.push(r);
        }
        partitions.push(PlanPartition {
            target: p.target.clone(),
            nodes: p.nodes.iter().map(|n| n.0).collect(),
            kernel: sig.digest,
            symbol: kernel_symbol(&sig.digest),
            config: None,
            args,
            n_inputs: sig.inputs.len() as u32,
            cost_us: p.cost_us,
            cost_source: parts.cost_source.name().to_string(),
            alternative: None,
        });
    }
    let mut outputs = Vec::with_capacity(g.outputs.len());
    for &o in &g.outputs {
        let r = match (refs.get(&o), &g.value(o).def) {
            (Some(&r), _) => r,
            (None, ValueDef::Const(_)) => const_ref(o, &mut constants, &mut constant_values).expect("constant"),
            _ => bail!("graph output '{}' is produced by no partition", g.value(o).name),
        };
        outputs.push((g.value(o).name.clone(), r));
    }
    Ok(ExecPlan {
        version: PLAN_VERSION,
        model: g.name.clone(),
        cost_source: parts.cost_source.name().to_string(),
        inputs: g.inputs.iter().map(|&v| (g.value(v).name.clone(), g.ty(v).clone())).collect(),
        input_int_bounds: crate::interp::int_input_bounds(g),
        outputs,
        values,
        constants,
        constant_values,
        partitions,
        validation: None,
    })
}
