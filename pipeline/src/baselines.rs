//! Baselines in the same run: each model compiled with the searched mix of backends, with each backend alone
//! (plus its device's fallback, which runs what that backend cannot), and with the fallback alone; every
//! artifact benchmarked by the bench code, and the ratio best single-backend / mix reported per model
//! (Collage's headline figure, where above 1 means the mix is faster).
//!
//! All configurations compile into the same store through the memoized pipeline, so kernels one
//! configuration shares with another are lowered and compiled once. Artifacts go to a private temporary
//! folder and are measured one model at a time, that model's artifacts in two passes (never two benchmarks
//! at once on one machine).

use crate::build::{compile_models, Ctx};
use crate::job::ModelJob;
use crate::bench::{bench_abba, BenchResult};
use crate::memo::Memo;
use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use tessera_stages::backend::Backend;
use tessera_stages::target::{Target, TargetSet};
use tessera_store::Digest;

/// What a configuration stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConfigKind {
    /// Every target: the partitioner chooses.
    Mix,
    /// One backend plus its device's fallback.
    Single,
    /// A device's fallback alone.
    Fallback,
}

/// One set of targets to compile every model with.
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    /// `mix`, the backend's name (`gemm`), or the fallback's name (`c`).
    pub label: String,
    pub kind: ConfigKind,
    #[serde(serialize_with = "target_strings")]
    pub targets: TargetSet,
    /// For a single-backend configuration: that backend takes every node it can, the fallback the rest.
    pub prefer: Option<String>,
}

fn target_strings<S: serde::Serializer>(t: &TargetSet, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(t.targets.iter().map(|t| t.to_string()))
}

/// The configurations of a full target set: the mix, each non-fallback backend with its device's fallback
/// (as the full set configures that fallback), then each device's fallback alone.
pub fn configurations(full: &TargetSet) -> Result<Vec<Config>> {
    let mut out = vec![Config { label: "mix".into(), kind: ConfigKind::Mix, targets: full.clone(), prefer: None }];
    let fallback = |t: &Target| -> Result<Target> {
        full.fallback(t.device()).cloned().with_context(|| format!("target set has no fallback for device {}", t.device()))
    };
    for t in full.targets.iter().filter(|t| !t.is_least_specialized()) {
        let set = TargetSet::from_targets(vec![t.clone(), fallback(t)?]).map_err(|e| anyhow::anyhow!("{e}"))?;
        out.push(Config {
            label: t.backend_name().to_string(),
            kind: ConfigKind::Single,
            targets: set,
            prefer: Some(t.backend_name().to_string()),
        });
    }
    for t in full.targets.iter().filter(|t| t.is_least_specialized()) {
        let set = TargetSet::from_targets(vec![t.clone()]).map_err(|e| anyhow::anyhow!("{e}"))?;
        out.push(Config { label: t.backend_name().to_string(), kind: ConfigKind::Fallback, targets: set, prefer: None });
    }
    Ok(out)
}

/// One model under one configuration.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigResult {
    pub label: String,
    pub kind: ConfigKind,
    pub artifact: Digest,
    pub partitions: usize,
    pub partitions_by_backend: BTreeMap<String, usize>,
    /// The plan's own estimate, next to the measurement.
    pub estimated_us: f64,
    pub cost_source: String,
    pub median_ms: f64,
    pub p10_ms: f64,
    pub p90_ms: f64,
}

/// One model's row: every configuration, the best single-backend one, and the headline ratio.
#[derive(Clone, Debug, Serialize)]
pub struct ModelBaselines {
    pub model: String,
    pub configs: Vec<ConfigResult>,
    pub mix_ms: f64,
    /// The fastest configuration other than the mix (by median).
    pub best_single: String,
    pub best_single_ms: f64,
    /// best_single_ms / mix_ms: above 1 when the mix is faster.
    pub ratio: f64,
}

/// How each artifact is measured.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct BenchSettings {
    pub iters: usize,
    pub warmup: usize,
    pub seed: u64,
}

/// A temporary folder removed on drop (artifacts are only needed while they are measured).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        let base = std::env::temp_dir();
        for attempt in 0u32..100 {
            let p = base.join(format!("tessera-baselines-{}-{attempt}", std::process::id()));
            match std::fs::create_dir(&p) {
                Ok(()) => return Ok(TempDir(p)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).with_context(|| format!("creating {}", p.display())),
            }
        }
        anyhow::bail!("could not create a temporary folder under {}", base.display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles every model under every configuration, benchmarks each distinct artifact once, and reports per
/// model. `progress` receives a line per step (compiles and measurements). `gpus`: the GPUs that measure
/// (None: every GPU of GPU 0's kind).
#[allow(clippy::too_many_arguments)]
pub fn run_baselines(
    memo: &Memo,
    backends: &[Box<dyn Backend>],
    full: &TargetSet,
    jobs: &[ModelJob],
    bench: BenchSettings,
    costs: tessera_stages::context::CostMode,
    tuning: tessera_stages::context::Tuning,
    gpus: Option<Vec<usize>>,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Vec<ModelBaselines>> {
    let configs = configurations(full)?;
    let tmp = TempDir::new()?;
    // (model index, config index) -> compile result.
    let mut compiled: Vec<Vec<crate::build::ModelResult>> = Vec::with_capacity(configs.len());
    for c in &configs {
        let ctx = Ctx::new(memo, &c.targets, backends).with_costs(costs).with_tuning(tuning).with_gpus(gpus.clone()).with_prefer(c.prefer.clone());
        let results = compile_models(&ctx, jobs, &|_| {})
            .into_iter()
            .map(|r| r.with_context(|| format!("baseline '{}'", c.label)))
            .collect::<Result<Vec<_>>>()?;
        progress(&format!("compiled {} models for {} ({})", jobs.len(), c.label, c.targets.targets.iter().map(|t| t.backend_name()).collect::<Vec<_>>().join("+")));
        compiled.push(results);
    }
    // Per model, each distinct artifact measured once, in two passes (in order, then in reverse: drift on the
    // machine hits every configuration alike); models in order.
    let mut out = Vec::with_capacity(jobs.len());
    for (mi, job) in jobs.iter().enumerate() {
        let mut distinct: Vec<Digest> = Vec::new();
        for per_config in &compiled {
            if !distinct.contains(&per_config[mi].artifact) {
                distinct.push(per_config[mi].artifact);
            }
        }
        let paths = distinct.iter().map(|d| write_artifact(memo, d, tmp.0.as_path())).collect::<Result<Vec<_>>>()?;
        let results = bench_abba(&paths, bench.iters, bench.warmup, bench.seed)
            .with_context(|| format!("model {}: benchmarking its builds", job.name))?;
        let measured: BTreeMap<Digest, BenchResult> = distinct.into_iter().zip(results).collect();
        let mut rows = Vec::with_capacity(configs.len());
        for (ci, c) in configs.iter().enumerate() {
            let r = &compiled[ci][mi];
            let b = &measured[&r.artifact];
            progress(&format!("{} {}: median {:.4} ms", job.name, c.label, b.median_ms));
            rows.push(ConfigResult {
                label: c.label.clone(),
                kind: c.kind,
                artifact: r.artifact,
                partitions: r.partitions,
                partitions_by_backend: r.partitions_by_backend.clone(),
                estimated_us: r.estimated_us,
                cost_source: r.cost_source.clone(),
                median_ms: b.median_ms,
                p10_ms: b.p10_ms,
                p90_ms: b.p90_ms,
            });
        }
        out.push(summarize(&job.name, rows));
    }
    Ok(out)
}

/// The row of one model: the mix is the first configuration, the best single one the fastest of the rest
/// (the first in configuration order on a tie).
pub fn summarize(model: &str, configs: Vec<ConfigResult>) -> ModelBaselines {
    let mix_ms = configs[0].median_ms;
    let best = configs[1..]
        .iter()
        .fold(None::<&ConfigResult>, |best, c| match best {
            Some(b) if b.median_ms <= c.median_ms => Some(b),
            _ => Some(c),
        })
        .unwrap_or(&configs[0]);
    let (best_single, best_single_ms) = (best.label.clone(), best.median_ms);
    ModelBaselines { model: model.to_string(), mix_ms, best_single, best_single_ms, ratio: best_single_ms / mix_ms, configs }
}

fn write_artifact(memo: &Memo, d: &Digest, dir: &Path) -> Result<PathBuf> {
    let path = dir.join(format!("{}.tsr", d.to_hex()));
    let mut f = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    memo.store().get_to_writer(d, &mut f)?;
    Ok(path)
}

/// Where the numbers were taken: enough to paste above a results table.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub host: String,
    pub cpu: String,
    pub cores: usize,
    pub os: String,
    /// UTC, when the report was made (reports only: nothing hashed depends on it).
    pub date: String,
}

impl Machine {
    pub fn detect() -> Machine {
        let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).ok();
        let lscpu = std::process::Command::new("lscpu")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Model name:").map(|m| m.trim().to_string())));
        let cpuinfo = || {
            read("/proc/cpuinfo").and_then(|s| s.lines().find_map(|l| l.strip_prefix("model name").and_then(|m| m.split(':').nth(1)).map(|m| m.trim().to_string())))
        };
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        Machine {
            host: read("/proc/sys/kernel/hostname").unwrap_or_else(|| "unknown".into()),
            cpu: lscpu.or_else(cpuinfo).unwrap_or_else(|| "unknown".into()),
            cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            os: format!("{} {}", std::env::consts::OS, read("/proc/sys/kernel/osrelease").unwrap_or_default()).trim().to_string(),
            date: utc_date(secs),
        }
    }
}

/// `YYYY-MM-DD HH:MM UTC` of a Unix time (days to civil date: Howard Hinnant's algorithm).
pub fn utc_date(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", rem / 3600, rem % 3600 / 60)
}

/// The whole report: what `--json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub machine: Machine,
    pub targets: Vec<String>,
    pub configs: Vec<Config>,
    pub bench: BenchSettings,
    pub models: Vec<ModelBaselines>,
}

/// The report as Markdown (a header and one table row per model), ready for bench/collage.md.
pub fn render_markdown(r: &Report) -> String {
    let mut s = String::new();
    let m = &r.machine;
    let _ = writeln!(s, "machine: {} ({} cores), {}, {}; {}", m.cpu, m.cores, m.host, m.os, m.date);
    let _ = writeln!(s, "targets: {}", r.targets.join("; "));
    let _ = writeln!(s, "bench: median of {} runs after {} warm-up runs, random inputs (seed {})", r.bench.iters, r.bench.warmup, r.bench.seed);
    for c in &r.configs {
        let kind = serde_json::to_value(c.kind).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default();
        let targets = c.targets.targets.iter().map(|t| t.to_string()).collect::<Vec<_>>().join("; ");
        // With one backend per device besides the fallback, that backend's configuration is the mix itself.
        let same = if c.kind != ConfigKind::Mix && r.configs.first().is_some_and(|m| m.targets == c.targets) { " (the mix's targets, the backend taking every node it can: Collage's single-backend baseline)" } else { "" };
        let _ = writeln!(s, "- `{}` ({kind}): {targets}{same}", c.label);
    }
    let _ = writeln!(s);
    let mut head = "| model |".to_string();
    let mut rule = "|---|".to_string();
    for c in &r.configs {
        let _ = write!(head, " {} ms |", c.label);
        rule.push_str("---:|");
    }
    head.push_str(" best single | best single / mix |");
    rule.push_str("---|---:|");
    let _ = writeln!(s, "{head}\n{rule}");
    for row in &r.models {
        let mut line = format!("| {} |", row.model);
        for c in &row.configs {
            let _ = write!(line, " {:.4} |", c.median_ms);
        }
        let _ = writeln!(line, " {} | {:.3}x |", row.best_single, row.ratio);
        s.push_str(&line);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ts: &[&str]) -> TargetSet {
        TargetSet::parse(&ts.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn configurations_pair_each_backend_with_the_fallback_as_configured() {
        let full = set(&["cpu -compiler=gemm", "cpu -opt-level=3"]);
        let c = configurations(&full).unwrap();
        let labels: Vec<(&str, ConfigKind)> = c.iter().map(|c| (c.label.as_str(), c.kind)).collect();
        assert_eq!(labels, [("mix", ConfigKind::Mix), ("gemm", ConfigKind::Single), ("c", ConfigKind::Fallback)]);
        assert_eq!(c[0].targets, full);
        // The fallback keeps the full set's attributes (opt-level 3), not the registry default.
        assert!(c[1].targets.targets.iter().any(|t| t.backend_name() == "c" && t.int_attr("opt-level") == 3), "{:?}", c[1].targets);
        assert_eq!(c[2].targets.targets.len(), 1);
        assert_eq!(c[2].targets.targets[0].int_attr("opt-level"), 3);
    }

    fn row(label: &str, ms: f64) -> ConfigResult {
        ConfigResult {
            label: label.into(),
            kind: if label == "mix" { ConfigKind::Mix } else { ConfigKind::Single },
            artifact: Digest::of(label.as_bytes()),
            partitions: 1,
            partitions_by_backend: BTreeMap::new(),
            estimated_us: 0.0,
            cost_source: "analytical".into(),
            median_ms: ms,
            p10_ms: ms,
            p90_ms: ms,
        }
    }

    #[test]
    fn best_single_is_the_fastest_non_mix_first_on_ties() {
        let m = summarize("m", vec![row("mix", 2.0), row("gemm", 3.0), row("cublas", 2.5), row("c", 2.5)]);
        assert_eq!((m.best_single.as_str(), m.best_single_ms), ("cublas", 2.5));
        assert!((m.ratio - 1.25).abs() < 1e-12);
        // Only the mix: it is its own baseline.
        let m = summarize("m", vec![row("mix", 2.0)]);
        assert_eq!((m.best_single.as_str(), m.ratio), ("mix", 1.0));
    }

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(utc_date(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_date(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(utc_date(1_795_314_846), "2026-11-22 02:34 UTC");
    }

    #[test]
    fn markdown_has_one_row_per_model() {
        let r = Report {
            machine: Machine { host: "h".into(), cpu: "cpu".into(), cores: 2, os: "linux".into(), date: utc_date(0) },
            targets: vec!["cpu".into()],
            configs: configurations(&set(&["cpu -compiler=gemm"])).unwrap(),
            bench: BenchSettings { iters: 5, warmup: 1, seed: 0 },
            models: vec![summarize("a", vec![row("mix", 1.0), row("gemm", 1.0), row("c", 2.0)])],
        };
        let md = render_markdown(&r);
        assert!(md.contains("| model | mix ms | gemm ms | c ms | best single | best single / mix |"), "{md}");
        assert!(md.contains("| a | 1.0000 | 1.0000 | 2.0000 | gemm | 1.000x |"), "{md}");
        assert!(md.starts_with("machine: cpu (2 cores)"), "{md}");
        assert!(md.contains("- `gemm` (single): ") && md.contains("(the mix's targets, the backend taking every node it can"), "{md}");
        assert!(!md.contains("- `c` (fallback): cpu -compiler=c -fast-math=false -march=generic -opt-level=2 (the same"), "{md}");
    }
}
