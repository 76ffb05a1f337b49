//! What a compiled artifact holds, read from the file alone (no store, no compiler): its provenance, inputs and
//! outputs, memory, modules, partitions (one step each: a backend's kernel), constants and digests. `tessera
//! inspect` prints it; `tessera explain ARTIFACT` shows the part about the plan.

use anyhow::Context;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use tessera_kernels::artifact::{Artifact, Provenance};
use tessera_kernels::TensorType;

/// The description of one artifact file (`tessera inspect --json` prints it; digests as hex).
#[derive(Clone, Debug, Serialize)]
pub struct ArtifactReport {
    pub file: String,
    pub file_bytes: u64,
    /// blake3 of the whole file.
    pub blake3: String,
    /// blake3 of the payload as the linker wrote it (without the provenance section): the digest the store,
    /// `tessera compile --json` and `fixtures/frozen` name the artifact by, equal across the tessera revisions
    /// that build the same payload.
    pub payload_digest: String,
    pub model: String,
    /// A batched artifact's batch sizes, one plan each (a run of batch N uses the smallest plan >= N); absent for
    /// an artifact of one plan. The fields below describe the first plan (the smallest batch), except the
    /// constants, which are every unique constant of the file.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub batches: Vec<u64>,
    /// A batched artifact's plans, one per batch size; absent for an artifact of one plan.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub plans: Vec<PlanRow>,
    /// How it was built; `null` for an artifact written before tessera recorded provenance.
    pub provenance: Option<Provenance>,
    pub inputs: Vec<TensorRow>,
    pub outputs: Vec<TensorRow>,
    pub arena_bytes: u64,
    pub scratch_bytes: u64,
    /// The weights' size: every unique constant's bytes.
    pub constant_bytes: u64,
    pub constants: Vec<ConstantRow>,
    pub modules: Vec<ModuleRow>,
    /// One per step, in execution order: which backend's kernel runs it.
    pub partitions: Vec<PartitionRow>,
    pub steps: usize,
    pub steps_per_backend: BTreeMap<String, usize>,
    pub transfers: usize,
}

/// One plan of a batched artifact.
#[derive(Clone, Debug, Serialize)]
pub struct PlanRow {
    pub batch: u64,
    pub inputs: Vec<TensorRow>,
    pub outputs: Vec<TensorRow>,
    pub arena_bytes: u64,
    pub scratch_bytes: u64,
    pub steps: usize,
    pub steps_per_backend: BTreeMap<String, usize>,
    pub modules: usize,
    pub module_bytes: usize,
    /// Constants this plan reads (stored once in the file, however many plans read them).
    pub constants: usize,
}

/// An input or output.
#[derive(Clone, Debug, Serialize)]
pub struct TensorRow {
    pub name: String,
    /// `f32[1x784]`.
    #[serde(rename = "type")]
    pub ty: String,
    pub dtype: String,
    pub shape: Vec<usize>,
}

impl TensorRow {
    fn new(name: &str, ty: &TensorType) -> TensorRow {
        TensorRow { name: name.to_string(), ty: ty.to_string(), dtype: ty.dtype.to_string(), shape: ty.shape.clone() }
    }
}

/// A unique constant (the artifact stores each once, by digest).
#[derive(Clone, Debug, Serialize)]
pub struct ConstantRow {
    #[serde(rename = "type")]
    pub ty: String,
    pub bytes: u64,
    /// blake3 of its bytes, as hex.
    pub digest: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModuleRow {
    pub backend: String,
    /// The canonical target it was compiled for.
    pub target: String,
    pub format: String,
    pub place: String,
    pub functions: usize,
    pub bytes: usize,
}

/// One partition of the plan: the step that runs it, the backend and the kernel (a function of a module).
#[derive(Clone, Debug, Serialize)]
pub struct PartitionRow {
    pub step: usize,
    pub backend: String,
    pub target: String,
    pub module: u32,
    /// The function's symbol.
    pub kernel: String,
}

fn hex(d: &[u8; 32]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads and checks the artifact at `path` (every check the runtime makes before loading it) and describes it.
pub fn describe(path: &Path) -> anyhow::Result<ArtifactReport> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let blake3 = blake3::hash(&bytes).to_hex().to_string();
    let file_bytes = bytes.len() as u64;
    let a = Artifact::read_owned(bytes, &path.display().to_string())?;
    let b = &a.body;
    let mut steps_per_backend: BTreeMap<String, usize> = BTreeMap::new();
    let mut partitions = Vec::with_capacity(b.steps.len());
    for (i, s) in b.steps.iter().enumerate() {
        // Validated on read: every step names an existing module and function.
        let m = &b.modules[s.module as usize];
        *steps_per_backend.entry(m.backend.clone()).or_insert(0) += 1;
        let kernel = m.functions[s.function as usize].symbol.clone();
        partitions.push(PartitionRow { step: i, backend: m.backend.clone(), target: m.target.clone(), module: s.module, kernel });
    }
    // Every unique constant of the file, in order of first use over the plans (a batched artifact stores each
    // once, whichever plans read it).
    let mut seen = std::collections::BTreeSet::new();
    let constants: Vec<ConstantRow> = (0..a.plan_count())
        .flat_map(|i| a.plan(i).constants.iter())
        .filter(|c| seen.insert(c.digest))
        .map(|c| ConstantRow { ty: c.ty.to_string(), bytes: c.ty.size_bytes() as u64, digest: hex(&c.digest) })
        .collect();
    let plans = a
        .batches()
        .iter()
        .enumerate()
        .map(|(i, &batch)| {
            let p = a.plan(i);
            let mut per: BTreeMap<String, usize> = BTreeMap::new();
            for s in &p.steps {
                *per.entry(p.modules[s.module as usize].backend.clone()).or_insert(0) += 1;
            }
            PlanRow {
                batch,
                inputs: p.inputs.iter().map(|i| TensorRow::new(&i.name, &i.ty)).collect(),
                outputs: p.outputs.iter().map(|o| TensorRow::new(&o.name, &o.ty)).collect(),
                arena_bytes: p.arena_bytes,
                scratch_bytes: p.scratch_bytes,
                steps: p.steps.len(),
                steps_per_backend: per,
                modules: p.modules.len(),
                module_bytes: p.modules.iter().map(|m| m.bytes.len()).sum(),
                constants: p.constants.len(),
            }
        })
        .collect();
    Ok(ArtifactReport {
        file: path.display().to_string(),
        file_bytes,
        blake3,
        payload_digest: a.payload_digest().to_hex(),
        model: b.model.clone(),
        batches: a.batches().to_vec(),
        plans,
        provenance: a.provenance.clone(),
        inputs: b.inputs.iter().map(|i| TensorRow::new(&i.name, &i.ty)).collect(),
        outputs: b.outputs.iter().map(|o| TensorRow::new(&o.name, &o.ty)).collect(),
        arena_bytes: b.arena_bytes,
        scratch_bytes: b.scratch_bytes,
        constant_bytes: constants.iter().map(|c| c.bytes).sum(),
        constants,
        modules: b
            .modules
            .iter()
            .map(|m| ModuleRow {
                backend: m.backend.clone(),
                target: m.target.clone(),
                format: m.format.name.to_string(),
                place: format!("{:?}", m.format.place).to_lowercase(),
                functions: m.functions.len(),
                bytes: m.bytes.len(),
            })
            .collect(),
        partitions,
        steps: b.steps.len(),
        steps_per_backend,
        transfers: b.transfers.len(),
    })
}

/// The provenance as text lines (`tessera inspect` and `tessera explain` print them).
pub fn provenance_lines(p: Option<&Provenance>) -> Vec<String> {
    let Some(p) = p else {
        return vec!["provenance: not recorded (an artifact written before tessera recorded provenance)".to_string()];
    };
    let mut lines = vec![
        "provenance:".to_string(),
        format!("  tessera    {} (source revision {})", p.tessera_version, p.source_revision),
        format!("  source     {} {} (blake3 {})", p.source.kind, p.source.name, p.source.digest),
        format!("  targets    {}", p.targets.join("; ")),
        format!("  precision  {}", p.precision),
        format!("  costs      {}", p.costs),
    ];
    lines.extend(p.options.iter().map(|(k, v)| format!("  option     {k} = {v}")));
    lines
}
