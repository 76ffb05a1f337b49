//! The stages after partition for one execution plan: lower each distinct kernel, compile one module per
//! target, link one artifact. Below the partition stage (its validation builds trial plans with it) and below
//! [`crate::build`], which runs it for a model's searched plan.

use crate::backend::Module;
use crate::stages::compile::Compile;
use crate::context::Ctx;
use crate::ir::{Graph, Tensor};
use crate::stages::link::{Link, LinkInput, LinkStep, ValueRef};
use crate::stages::lower::{kernel_graph, Lower};
use crate::partition::plan::{ExecPlan, PlanRef};
use crate::stage::{load, run_digest};
use crate::target::Target;
use anyhow::{Context, Result};
use rayon::prelude::*;
use std::collections::BTreeMap;
use tessera_kernels::artifact::FORMAT_VERSION;
use tessera_store::Digest;

/// What [`build_artifact`] produced: the artifact and the objects it was made from.
pub struct BuiltArtifact {
    pub artifact: Digest,
    /// Lowered kernels, one per distinct (target, kernel).
    pub lowered: Vec<Digest>,
    /// One module per target that won partitions.
    pub modules: Vec<Digest>,
}

/// A plan lowered and compiled, not yet linked ([`compile_plan`]).
pub struct CompiledPlan {
    /// The plan as it is linked (without its validation report) and its digest.
    pub plan: ExecPlan,
    pub plan_digest: Digest,
    /// Lowered kernels, one per distinct (target, kernel).
    pub lowered: Vec<Digest>,
    /// One module per target that won partitions, in target-set order.
    pub modules: Vec<Digest>,
}

/// The stages after partition for one plan (recorded in the store as `plan_digest`): lower each distinct
/// kernel, compile one module per target, link. `graph` gives the model graph the plan's node indices refer
/// to; it is only called when a lower misses. `resident`: that graph where it is in memory already, whose
/// constants the link takes instead of reading them back from the store.
pub fn build_artifact<'g>(
    ctx: &Ctx,
    plan_digest: &Digest,
    plan: &ExecPlan,
    graph: &(dyn Fn() -> Result<&'g Graph> + Sync),
    resident: Option<&Graph>,
) -> Result<BuiltArtifact> {
    let compiled = compile_plan(ctx, plan_digest, plan, graph)?;
    let artifact = link_plan_from(ctx, &compiled, resident)?;
    Ok(BuiltArtifact { artifact, lowered: compiled.lowered, modules: compiled.modules })
}

/// Lower and compile for one plan, as [`build_artifact`] does, without the link: what validation needs to know
/// a plan's timing identity, whose timings may be recorded already (then the plan is never linked).
pub fn compile_plan<'g>(ctx: &Ctx, plan_digest: &Digest, plan: &ExecPlan, graph: &(dyn Fn() -> Result<&'g Graph> + Sync)) -> Result<CompiledPlan> {
    // Nothing below reads a plan's validation report, so a validated plan is built as the plan without it:
    // the trial validation stored and linked already, so its link is a hit (it was a second link of the same
    // bytes, 0.1-0.5 s of a cold compile; bench/compile_times.md, 2026-11-28).
    let (plan_digest, plan) = match plan.validation {
        Some(_) => {
            let unreported = ExecPlan { validation: None, ..plan.clone() };
            (ctx.driver.store().put(&postcard::to_stdvec(&unreported)?)?, unreported)
        }
        None => (*plan_digest, plan.clone()),
    };
    // Stage: lower, once per distinct (target, kernel, configuration).
    /// A distinct lowering: target, kernel, configuration (`None`: the backend's default).
    type Lowering = (Target, Digest, Option<String>);
    let mut distinct: BTreeMap<Lowering, usize> = BTreeMap::new();
    for (i, p) in plan.partitions.iter().enumerate() {
        distinct.entry((p.target.clone(), p.kernel, p.config.clone())).or_insert(i);
    }
    let lowered: Vec<(Lowering, Digest)> = distinct
        .par_iter()
        .map(|((target, kernel, config), &first)| -> Result<(Lowering, Digest)> {
            let p = &plan.partitions[first];
            let backend = ctx.backend(target)?;
            let kernel_graph = || kernel_graph(graph()?, &p.nodes, kernel, backend.inline_const_max());
            let config_name = config.clone().unwrap_or_else(|| backend.default_config(target));
            let stage = Lower { kernel: *kernel, target, backend, graph: &kernel_graph, symbol: &p.symbol, config: &config_name };
            Ok(((target.clone(), *kernel, config.clone()), run_digest(ctx.driver, &stage)?))
        })
        .collect::<Result<_>>()
        .context("lower")?;
    let lowered: BTreeMap<Lowering, Digest> = lowered.into_iter().collect();

    // Stage: compile, one module per target that won partitions, in target-set order.
    // Digests only: a hit does not read or decode the module (its code can be megabytes); the link stage's
    // input reads the modules when the link runs.
    let mut modules: Vec<Digest> = Vec::new();
    for t in used_targets(ctx, &plan) {
        let backend = ctx.backend(t)?;
        let kernels: Vec<Digest> = lowered.iter().filter(|((lt, _, _), _)| lt == t).map(|(_, d)| *d).collect();
        let stage = Compile { target: t, backend, lowered: &kernels, toolchain: backend.environment(t), driver: ctx.driver };
        modules.push(run_digest(ctx.driver, &stage).with_context(|| format!("compile for {t}"))?);
    }
    Ok(CompiledPlan { plan, plan_digest, lowered: lowered.into_values().collect(), modules })
}

/// Stage: link a compiled plan into its artifact.
pub fn link_plan(ctx: &Ctx, compiled: &CompiledPlan) -> Result<Digest> {
    link_plan_from(ctx, compiled, None)
}

/// [`link_plan`], the constants taken from `resident` (the plan's graph, in memory) where given: a
/// weights-only rebuild read its 440 MB of weights back from the store (and verified them) only to link them.
pub fn link_plan_from(ctx: &Ctx, compiled: &CompiledPlan, resident: Option<&Graph>) -> Result<Digest> {
    let used = used_targets(ctx, &compiled.plan);
    let input = || link_input(ctx, &compiled.plan, &used, &compiled.modules, resident);
    run_digest(ctx.driver, &Link { plan_digest: &compiled.plan_digest, modules: &compiled.modules, format_version: FORMAT_VERSION, input: &input }).context("link")
}

/// The targets that won partitions of `plan`, in target-set order: one module each.
fn used_targets<'c>(ctx: &'c Ctx, plan: &ExecPlan) -> Vec<&'c Target> {
    ctx.targets.targets.iter().filter(|t| plan.partitions.iter().any(|p| &p.target == *t)).collect()
}

fn link_input(ctx: &Ctx, plan: &ExecPlan, used_targets: &[&Target], module_digests: &[Digest], resident: Option<&Graph>) -> Result<LinkInput> {
    let store = ctx.driver.store();
    let modules: Vec<Module> = module_digests.iter().map(|d| load::<Compile>(ctx.driver, d)).collect::<Result<_>>()?;
    // The plan is bound to the resident graph's document: its constant values are that graph's.
    let in_memory = |i: usize, ty: &crate::ir::TensorType| -> Option<Tensor> {
        let value = resident?.values.get(*plan.constant_values.get(i)? as usize)?;
        match &value.def {
            crate::ir::ValueDef::Const(t) if t.ty == *ty => Some(t.clone()),
            _ => None,
        }
    };
    let constants: Vec<Tensor> = plan
        .constants
        .iter()
        .enumerate()
        .map(|(i, (d, ty))| match in_memory(i, ty) {
            Some(t) => Ok(t),
            None => Ok(Tensor::from_bytes(ty.clone(), store.get(d)?)?),
        })
        .collect::<Result<_>>()?;
    let to_ref = |r: &PlanRef| match *r {
        PlanRef::Input(i) => ValueRef::Input(i),
        PlanRef::Value(i) => ValueRef::Value(i),
        PlanRef::Const(i) => ValueRef::Const(i),
    };
    let mut steps = Vec::with_capacity(plan.partitions.len());
    for p in &plan.partitions {
        let mi = used_targets.iter().position(|t| **t == p.target).expect("module per used target");
        let module = &modules[mi];
        let fi = module
            .functions
            .iter()
            .position(|f| f.symbol == p.symbol)
            .with_context(|| format!("module for {} has no function {}", p.target, p.symbol))?;
        steps.push(LinkStep { module: mi as u32, function: fi as u32, args: p.args.iter().map(to_ref).collect() });
    }
    Ok(LinkInput {
        model: plan.model.clone(),
        inputs: plan.inputs.clone(),
        input_int_bounds: plan.input_int_bounds.clone(),
        outputs: plan.outputs.iter().map(|(n, r)| (n.clone(), to_ref(r))).collect(),
        values: plan.values.clone(),
        constants,
        modules,
        steps,
    })
}
