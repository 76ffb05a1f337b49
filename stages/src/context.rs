//! What every stage of a build reads: the build context (the driver, the targets, the backends, the cost
//! mode, the runtime's loaders), a model graph loaded lazily, and where costs come from. It sits below every
//! stage, so stages import it and never the module that runs the DAG ([`crate::build`]): data flows one way.

use crate::backend::Backend;
use crate::ir::{serial::GraphDoc, Graph};
use crate::stage::{load_value, Driver};
use crate::target::{Target, TargetSet};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;
use tessera_kernels::runtime::Registry;
use tessera_store::Digest;

/// What is shared by every model of a run.
pub struct Ctx<'a> {
    pub driver: &'a dyn Driver,
    pub targets: &'a TargetSet,
    pub backends: &'a [Box<dyn Backend>],
    /// Where partition costs come from (default: measured).
    pub costs: CostMode,
    /// A backend that takes every node it can run, the fallback the rest: the single-backend baseline
    /// Collage compares against. `None` (the default) is the searched mix.
    pub prefer: Option<String>,
    /// How the runtime loads each module format, for the kernels and plans the compiler measures: the
    /// built-in formats, plus those of backends added from outside.
    pub runtime: &'a Registry,
    /// The user's calibration inputs for reduced-precision builds (`--calibration DIR`); None: random ones.
    pub calibration: Option<&'a crate::calibration::CalibrationDir>,
    /// How much of the candidate space measured costs measure (default: pruned).
    pub tuning: Tuning,
    /// The GPUs the tune stage measures on (`--gpus`); None: every GPU of this machine with GPU 0's
    /// fingerprint ([`crate::device::measuring_gpus`]). Where measuring runs, not what is built: in no key.
    pub gpus: Option<Vec<usize>>,
}

impl<'a> Ctx<'a> {
    pub fn new(driver: &'a dyn Driver, targets: &'a TargetSet, backends: &'a [Box<dyn Backend>]) -> Self {
        Ctx { driver, targets, backends, costs: CostMode::default(), prefer: None, runtime: Registry::builtin(), calibration: None, tuning: Tuning::default(), gpus: None }
    }

    pub fn with_gpus(mut self, gpus: Option<Vec<usize>>) -> Self {
        self.gpus = gpus;
        self
    }

    pub fn with_tuning(mut self, tuning: Tuning) -> Self {
        self.tuning = tuning;
        self
    }

    pub fn with_calibration(mut self, calibration: Option<&'a crate::calibration::CalibrationDir>) -> Self {
        self.calibration = calibration;
        self
    }

    pub fn with_runtime(mut self, runtime: &'a Registry) -> Self {
        self.runtime = runtime;
        self
    }

    pub fn with_prefer(mut self, backend: Option<String>) -> Self {
        self.prefer = backend;
        self
    }

    pub fn with_costs(mut self, costs: CostMode) -> Self {
        self.costs = costs;
        self
    }

    pub fn backend(&self, t: &Target) -> Result<&'a dyn Backend> {
        self.backends
            .iter()
            .find(|b| b.name() == t.backend_name())
            .map(|b| b.as_ref())
            .with_context(|| format!("target '{t}': backend '{}' is not part of this build", t.backend_name()))
    }
}

/// The model graph, built or loaded at most once per model and only when needed.
pub struct LazyGraph<'a> {
    driver: &'a dyn Driver,
    doc: Digest,
    fresh: OnceLock<Graph>,
}

impl<'a> LazyGraph<'a> {
    pub fn new(driver: &'a dyn Driver, doc: Digest, built: Option<Graph>) -> Self {
        let fresh = OnceLock::new();
        if let Some(g) = built {
            let _ = fresh.set(g);
        }
        LazyGraph { driver, doc, fresh }
    }

    /// The same document with nothing resident: what [`LazyGraph::get`] needs it reads again. Keeping a graph
    /// no stage reads any more held GPT-2's 500 MB of fp32 weights next to their fp16 copy while it was planned.
    pub fn unloaded(self) -> LazyGraph<'a> {
        LazyGraph::new(self.driver, self.doc, None)
    }

    /// The graph if this process built or loaded it already (nothing is read).
    pub fn resident(&self) -> Option<&Graph> {
        self.fresh.get()
    }

    pub fn get(&self) -> Result<&Graph> {
        if let Some(g) = self.fresh.get() {
            return Ok(g);
        }
        let doc: GraphDoc = load_value(self.driver, &self.doc)?;
        let store = self.driver.store();
        let g = doc.to_graph(|d| store.get(d).map_err(|e| e.to_string()))?;
        Ok(self.fresh.get_or_init(|| g))
    }
}

/// How much of the candidate space a build with measured costs measures: part of the partition key (the plan
/// can differ), not of tune keys (a measurement is the same whichever policy asked for it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Tuning {
    /// Candidates ranked by their backends' estimates; only those that can win are measured, and only the
    /// competitive ones in every configuration (`partition::prune`).
    #[default]
    Pruned,
    /// Every candidate in every configuration.
    Full,
}

impl Tuning {
    /// Every policy's name, as `--tuning` takes them.
    pub const NAMES: [&'static str; 2] = ["pruned", "full"];

    pub fn name(self) -> &'static str {
        match self {
            Tuning::Pruned => "pruned",
            Tuning::Full => "full",
        }
    }
}

/// A build option's value that is none of its names (`--costs`, `--tuning`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("'{given}' is not a {what} (one of: {})", names.join(", "))]
pub struct UnknownName {
    pub given: String,
    pub what: &'static str,
    pub names: &'static [&'static str],
}

impl std::str::FromStr for Tuning {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "pruned" => Ok(Tuning::Pruned),
            "full" => Ok(Tuning::Full),
            other => Err(UnknownName { given: other.to_string(), what: "tuning policy", names: &Tuning::NAMES }),
        }
    }
}

/// Where partition costs come from: part of the partition key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CostMode {
    /// Measure every candidate on this machine (the tune stage; recorded in the store, so measured once).
    #[default]
    Measured,
    /// The backends' analytical estimates: no measurement, the same plan on every machine.
    Analytical,
    /// Measured costs from the store's records only (`--frozen`): the tune records and plan timings of an
    /// earlier measured build here, or imported from the machine that measured them. Nothing is measured; a
    /// missing record fails the build with the list of every one missing. Given the records, the plan is the
    /// one the measured build made, so the partition key is the measured key.
    Recorded,
}

impl std::str::FromStr for CostMode {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "measured" => Ok(CostMode::Measured),
            "analytical" => Ok(CostMode::Analytical),
            "recorded" => Ok(CostMode::Recorded),
            other => Err(UnknownName { given: other.to_string(), what: "cost mode", names: &CostMode::NAMES }),
        }
    }
}

impl CostMode {
    /// Every mode's name, as `--costs` takes them.
    pub const NAMES: [&'static str; 3] = ["measured", "analytical", "recorded"];

    pub fn name(self) -> &'static str {
        match self {
            CostMode::Measured => "measured",
            CostMode::Analytical => "analytical",
            CostMode::Recorded => "recorded",
        }
    }

    /// Whether costs are measurements (taken now or recorded): the tune stage's records decide the plan.
    pub fn measures(self) -> bool {
        matches!(self, CostMode::Measured | CostMode::Recorded)
    }

    /// Whether measuring is forbidden: only recorded measurements may be used.
    pub fn frozen(self) -> bool {
        self == CostMode::Recorded
    }

    /// The mode as keys hold it: a build from records makes the measured build's plan, under its key.
    pub fn keyed(self) -> CostMode {
        match self {
            CostMode::Recorded => CostMode::Measured,
            m => m,
        }
    }
}

/// Where a cost came from: a candidate's (measured, estimated, or unsupported by its backend) and, combined
/// over a plan's winners, a plan's (every report says which; `Mixed` when both kinds were used).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum CostSource {
    /// Measured by the tune stage (now, or recorded).
    Measured,
    /// The backend's analytical estimate.
    Analytical,
    /// The backend refused the candidate: its cost is infinite.
    Unsupported,
    /// A plan some of whose costs were measured and others estimated.
    Mixed,
}

impl CostSource {
    /// The name reports use ("measured", "analytical", "unsupported", "mixed").
    pub fn name(self) -> &'static str {
        match self {
            CostSource::Measured => "measured",
            CostSource::Analytical => "analytical",
            CostSource::Unsupported => "unsupported",
            CostSource::Mixed => "mixed",
        }
    }

    /// The source of a plan whose chosen candidates' costs came from `sources`: the one source they share, or
    /// `Mixed`.
    pub fn of_plan(sources: impl IntoIterator<Item = CostSource>) -> CostSource {
        let mut it = sources.into_iter();
        let Some(first) = it.next() else { return CostSource::Analytical };
        if it.all(|s| s == first) {
            first
        } else {
            CostSource::Mixed
        }
    }
}
