//! A shard's summary file, and merging the files of every shard into one [`Summary`].
//!
//! A shard file is the usual `tessera compile --json` summary with two more fields: `shard` (its index and
//! count, the models it took, and the whole build's assignment) and `kernel_signatures` (so that a merge
//! counts kernels shared between shards once). Merging checks that the files describe one build (the same
//! count, targets and assignment), that each shard is there exactly once and built what it was assigned,
//! and names whatever is missing.

use super::assign::Weighted;
use super::Shard;
use crate::memo::RunStageStats;
use crate::zoo::Summary;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One model of the build and the shard that builds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assigned {
    pub model: String,
    pub shard: usize,
    /// Estimated build cost (nominal microseconds, [`super::cost`]).
    pub cost: u64,
}

/// Which shard this is, and what the whole build looks like.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    pub index: usize,
    pub count: usize,
    /// This shard's models, in input order.
    pub models: Vec<String>,
    /// The sum of this shard's estimated costs.
    pub estimated_cost: u64,
    /// Every model of the build, in input order, with its shard.
    pub assignment: Vec<Assigned>,
}

/// What a shard writes: its summary, plus [`ShardInfo`] and its distinct kernel signatures.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShardReport {
    pub shard: ShardInfo,
    /// Distinct kernel signatures of this shard's models (hex), sorted.
    pub kernel_signatures: Vec<String>,
    #[serde(flatten)]
    pub summary: Summary,
}

/// The default file name of shard `s`'s summary, in the output folder.
pub fn default_file_name(s: Shard) -> String {
    format!("summary-shard-{}-of-{}.json", s.index, s.count)
}

/// The assignment of `jobs` (name and estimated cost, input order) to `count` shards.
pub fn assignment(jobs: &[Weighted], count: usize) -> Vec<Assigned> {
    let shard_of = super::assign::assign(jobs, count);
    jobs.iter().zip(shard_of).map(|(j, shard)| Assigned { model: j.name.clone(), shard, cost: j.cost }).collect()
}

impl ShardReport {
    /// Shard `s`'s report of its run.
    pub fn new(s: Shard, assignment: Vec<Assigned>, summary: Summary) -> Self {
        let mine: Vec<&Assigned> = assignment.iter().filter(|a| a.shard == s.index).collect();
        let signatures: BTreeSet<String> =
            summary.artifacts.iter().flat_map(|a| a.kernels.iter().map(|(_, d)| d.to_hex())).collect();
        ShardReport {
            shard: ShardInfo {
                index: s.index,
                count: s.count,
                models: mine.iter().map(|a| a.model.clone()).collect(),
                estimated_cost: mine.iter().fold(0u64, |t, a| t.saturating_add(a.cost)),
                assignment,
            },
            kernel_signatures: signatures.into_iter().collect(),
            summary,
        }
    }

    /// Writes the report as JSON, atomically (a temporary file renamed over `path`).
    pub fn write(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("--summary-out: creating folder {}", dir.display()))?;
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        std::fs::write(&tmp, serde_json::to_string_pretty(self)? + "\n").with_context(|| format!("writing the shard summary {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("writing the shard summary {}", path.display()))?;
        Ok(())
    }

    /// Reads a shard summary; errors name the file.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading shard summary {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| {
            format!("{}: not a shard summary (written by `tessera compile --shard I/N` or --summary-out)", path.display())
        })
    }
}

/// The shard summaries named by `paths`: files as given, and in each folder every `summary-shard-*.json`
/// (sorted by name). A folder without any is an error naming it.
pub fn collect_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("listing {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| {
                    let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
                    name.starts_with("summary-shard-") && name.ends_with(".json") && f.is_file()
                })
                .collect();
            if found.is_empty() {
                bail!("{}: no shard summaries (summary-shard-*.json) in this folder", p.display());
            }
            found.sort();
            files.extend(found);
        } else if p.is_file() {
            files.push(p.clone());
        } else {
            bail!("{}: no such file or folder", p.display());
        }
    }
    Ok(files)
}

/// One shard's line in a merged report.
#[derive(Clone, Debug, Serialize)]
pub struct ShardLine {
    pub index: usize,
    pub file: PathBuf,
    pub models: usize,
    pub estimated_cost: u64,
    pub seconds: f64,
}

/// Every shard's summary merged: the summary an unsharded build would print (models in input order;
/// `seconds` is the slowest shard's, as the shards run side by side), and each shard's line.
#[derive(Clone, Debug, Serialize)]
pub struct Merged {
    #[serde(flatten)]
    pub summary: Summary,
    pub shard_count: usize,
    pub shards: Vec<ShardLine>,
}

/// Merges shard reports read from the given files. Checks that they agree on the shard count, the targets
/// and the assignment; that every shard is present once and built exactly its models; names what is missing.
pub fn merge(reports: &[(PathBuf, ShardReport)]) -> Result<Merged> {
    let Some((first_file, first)) = reports.first() else { bail!("no shard summaries to merge") };
    let count = first.shard.count;
    let mut by_index: BTreeMap<usize, (&PathBuf, &ShardReport)> = BTreeMap::new();
    for (file, r) in reports {
        let (f, f0) = (file.display(), first_file.display());
        if r.shard.count != count {
            bail!("{f} is shard {}/{} but {f0} is shard {}/{count}: the shard counts differ", r.shard.index, r.shard.count, first.shard.index);
        }
        if r.summary.targets != first.summary.targets {
            bail!("{f} was built for targets [{}] but {f0} for [{}]", r.summary.targets.join("; "), first.summary.targets.join("; "));
        }
        if r.shard.assignment != first.shard.assignment {
            bail!("{f} and {f0} assign models to shards differently: {}", first_difference(&r.shard.assignment, &first.shard.assignment));
        }
        if r.shard.index >= count {
            bail!("{f}: shard index {} is not below the count {count}", r.shard.index);
        }
        let expected: Vec<&str> = first.shard.assignment.iter().filter(|a| a.shard == r.shard.index).map(|a| a.model.as_str()).collect();
        if r.shard.models.iter().map(String::as_str).ne(expected.iter().copied()) {
            bail!("{f}: shard {}/{count} lists models [{}] but the assignment gives it [{}]", r.shard.index, r.shard.models.join(", "), expected.join(", "));
        }
        let built: BTreeSet<&str> =
            r.summary.artifacts.iter().map(|a| a.model.as_str()).chain(r.summary.failed.iter().map(|m| m.model.as_str())).collect();
        if built != expected.iter().copied().collect() {
            bail!("{f}: shard {}/{count} reports artifacts or failures for [{}] but was assigned [{}]", r.shard.index, built.into_iter().collect::<Vec<_>>().join(", "), expected.join(", "));
        }
        if let Some((other, _)) = by_index.insert(r.shard.index, (file, r)) {
            bail!("shard {}/{count} was given twice: {} and {f}", r.shard.index, other.display());
        }
    }
    let missing: Vec<String> = (0..count)
        .filter(|i| !by_index.contains_key(i))
        .map(|i| {
            let models: Vec<&str> = first.shard.assignment.iter().filter(|a| a.shard == i).map(|a| a.model.as_str()).collect();
            format!("{i}/{count} (models: {})", if models.is_empty() { "none".to_string() } else { models.join(", ") })
        })
        .collect();
    if !missing.is_empty() {
        let given: Vec<String> = reports.iter().map(|(f, _)| f.display().to_string()).collect();
        bail!("missing shard summaries: {}; given: {}", missing.join("; "), given.join(", "));
    }
    Ok(combine(count, &first.shard.assignment, &by_index))
}

fn first_difference(a: &[Assigned], b: &[Assigned]) -> String {
    for (x, y) in a.iter().zip(b) {
        if x != y {
            return format!("model '{}' (shard {}, cost {}) against '{}' (shard {}, cost {})", x.model, x.shard, x.cost, y.model, y.shard, y.cost);
        }
    }
    format!("{} models against {}", a.len(), b.len())
}

/// Adds up checked shards in input order.
fn combine(count: usize, assignment: &[Assigned], shards: &BTreeMap<usize, (&PathBuf, &ShardReport)>) -> Merged {
    let position: BTreeMap<&str, usize> = assignment.iter().enumerate().map(|(i, a)| (a.model.as_str(), i)).collect();
    let reports: Vec<&ShardReport> = shards.values().map(|(_, r)| *r).collect();
    let mut artifacts: Vec<_> = reports.iter().flat_map(|r| r.summary.artifacts.iter().cloned()).collect();
    artifacts.sort_by_key(|a| position.get(a.model.as_str()).copied());
    let mut failed: Vec<_> = reports.iter().flat_map(|r| r.summary.failed.iter().cloned()).collect();
    failed.sort_by_key(|f| position.get(f.model.as_str()).copied());
    let mut stages: BTreeMap<String, RunStageStats> = BTreeMap::new();
    for r in &reports {
        for (name, s) in &r.summary.stages {
            let t = stages.entry(name.clone()).or_default();
            t.executions += s.executions;
            t.hits += s.hits;
            t.exec_micros += s.exec_micros;
        }
    }
    let unique: BTreeSet<&str> = reports.iter().flat_map(|r| r.kernel_signatures.iter().map(String::as_str)).collect();
    let partitions: usize = reports.iter().map(|r| r.summary.partitions).sum();
    let sources: BTreeSet<&str> = reports.iter().map(|r| r.summary.cost_source.as_str()).collect();
    let cost_source = if sources.len() == 1 { sources.into_iter().next().unwrap_or_default().to_string() } else { "mixed".to_string() };
    let summary = Summary {
        targets: reports.first().map(|r| r.summary.targets.clone()).unwrap_or_default(),
        models: reports.iter().map(|r| r.summary.models).sum(),
        partitions,
        unique_kernels: unique.len(),
        dedupe_ratio: if unique.is_empty() { 1.0 } else { partitions as f64 / unique.len() as f64 },
        stages,
        seconds: reports.iter().map(|r| r.summary.seconds).fold(0.0, f64::max),
        cost_source,
        artifacts,
        failed,
        remote: reports.iter().filter_map(|r| r.summary.remote.as_ref()).fold(None, |acc: Option<tessera_store::RemoteStats>, r| {
            let mut t = acc.unwrap_or_else(|| tessera_store::RemoteStats { url: r.url.clone(), read_only: r.read_only, ..Default::default() });
            t.add(r);
            Some(t)
        }),
        // Each shard capped its own store; the merged report does not add their evictions up.
        evicted: None,
    };
    let lines = shards
        .iter()
        .map(|(&index, (file, r))| ShardLine {
            index,
            file: (*file).clone(),
            models: r.shard.models.len(),
            estimated_cost: r.shard.estimated_cost,
            seconds: r.summary.seconds,
        })
        .collect();
    Merged { summary, shard_count: count, shards: lines }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::zoo::{ArtifactRow, FailedModel};
    use tessera_store::Digest;

    const ZOO: [(&str, u64); 5] = [("a", 50), ("b", 40), ("c", 30), ("d", 20), ("e", 10)];

    fn zoo_assignment(count: usize) -> Vec<Assigned> {
        let w: Vec<Weighted> = ZOO.iter().map(|&(n, c)| Weighted { name: n.into(), cost: c }).collect();
        assignment(&w, count)
    }

    /// What shard `index` of `count` reports after building its models (each with one partition and a
    /// kernel named after the model, plus one kernel every model shares); `fail` fails instead.
    fn shard_report(index: usize, count: usize, fail: &[&str]) -> ShardReport {
        let assignment = zoo_assignment(count);
        let mine: Vec<&Assigned> = assignment.iter().filter(|a| a.shard == index).collect();
        let artifacts: Vec<ArtifactRow> = mine
            .iter()
            .filter(|a| !fail.contains(&a.model.as_str()))
            .map(|a| ArtifactRow {
                model: a.model.clone(),
                path: format!("out/{}.tsr", a.model).into(),
                digest: Digest::of(a.model.as_bytes()),
                bytes: 100,
                partitions: 2,
                partitions_by_backend: [("c".to_string(), 2)].into(),
                tuned_configs: Default::default(),
                estimated_us: 1.0,
                plans: vec![],
                kernels: [("c".to_string(), Digest::of(a.model.as_bytes())), ("c".to_string(), Digest::of(b"shared"))].into(),
            })
            .collect();
        let failed = mine
            .iter()
            .filter(|a| fail.contains(&a.model.as_str()))
            .map(|a| FailedModel { model: a.model.clone(), error: format!("model {}: broken", a.model) })
            .collect();
        let summary = Summary {
            targets: vec!["cpu".into()],
            models: artifacts.len(),
            partitions: 2 * artifacts.len(),
            unique_kernels: 0,
            dedupe_ratio: 1.0,
            stages: [("link".to_string(), RunStageStats { executions: artifacts.len() as u64, hits: 1, exec_micros: 10 })].into(),
            seconds: 1.0 + index as f64,
            cost_source: "analytical".into(),
            artifacts,
            failed,
            remote: None,
            evicted: None,
        };
        ShardReport::new(Shard { index, count }, assignment, summary)
    }

    fn files(reports: Vec<ShardReport>) -> Vec<(PathBuf, ShardReport)> {
        reports.into_iter().map(|r| (PathBuf::from(default_file_name(Shard { index: r.shard.index, count: r.shard.count })), r)).collect()
    }

    fn merge_err(reports: Vec<ShardReport>) -> String {
        format!("{:#}", merge(&files(reports)).unwrap_err())
    }

    #[test]
    fn shards_merge_into_the_unsharded_report() {
        // Given out of order, through a JSON round trip, as `tessera summary` reads them.
        let reports: Vec<ShardReport> = [2, 0, 1]
            .iter()
            .map(|&i| serde_json::from_str(&serde_json::to_string(&shard_report(i, 3, &["d"])).unwrap()).unwrap())
            .collect();
        let m = merge(&files(reports)).unwrap();
        let s = &m.summary;
        assert_eq!(m.shard_count, 3);
        assert_eq!(s.artifacts.iter().map(|a| a.model.as_str()).collect::<Vec<_>>(), ["a", "b", "c", "e"], "input order");
        assert_eq!(s.failed.iter().map(|f| f.model.as_str()).collect::<Vec<_>>(), ["d"]);
        assert_eq!((s.models, s.partitions), (4, 8));
        // One kernel per model and one shared by all, counted once across shards.
        assert_eq!(s.unique_kernels, 5);
        assert_eq!(s.dedupe_ratio, 8.0 / 5.0);
        assert_eq!(s.stages["link"], RunStageStats { executions: 4, hits: 3, exec_micros: 30 });
        assert_eq!(s.seconds, 3.0, "the slowest shard");
        assert_eq!(m.shards.iter().map(|l| l.index).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(m.shards.iter().map(|l| l.models).sum::<usize>(), ZOO.len());
    }

    #[test]
    fn a_missing_shard_is_named_with_its_models() {
        let e = merge_err(vec![shard_report(0, 3, &[]), shard_report(2, 3, &[])]);
        let zoo = zoo_assignment(3);
        let lost: Vec<&str> = zoo.iter().filter(|a| a.shard == 1).map(|a| a.model.as_str()).collect();
        assert!(e.contains(&format!("missing shard summaries: 1/3 (models: {})", lost.join(", "))), "{e}");
        assert!(e.contains("summary-shard-0-of-3.json, summary-shard-2-of-3.json"), "{e}");
        // More shards than models: the empty ones still have to be there.
        let e = merge_err((0..5).map(|i| shard_report(i, 6, &[])).collect());
        assert!(e.contains("missing shard summaries: 5/6 (models: none)"), "{e}");
    }

    #[test]
    fn shards_of_different_builds_do_not_merge() {
        let e = merge_err(vec![shard_report(0, 3, &[]), shard_report(1, 2, &[])]);
        assert!(e.contains("summary-shard-1-of-2.json is shard 1/2 but summary-shard-0-of-3.json is shard 0/3"), "{e}");
        let mut other = shard_report(1, 3, &[]);
        other.summary.targets = vec!["cpu -compiler=gemm".into()];
        let e = merge_err(vec![shard_report(0, 3, &[]), other]);
        assert!(e.contains("was built for targets [cpu -compiler=gemm] but"), "{e}");
        let mut other = shard_report(1, 3, &[]);
        other.shard.assignment[4].cost += 1;
        let e = merge_err(vec![shard_report(0, 3, &[]), other]);
        assert!(e.contains("assign models to shards differently: model 'e'"), "{e}");
        let e = merge_err(vec![shard_report(0, 3, &[]), shard_report(0, 3, &[]), shard_report(1, 3, &[])]);
        assert!(e.contains("shard 0/3 was given twice"), "{e}");
    }

    #[test]
    fn a_shard_must_have_built_what_it_was_assigned() {
        let mut r = shard_report(0, 2, &[]);
        r.summary.artifacts.pop();
        let e = merge_err(vec![r, shard_report(1, 2, &[])]);
        assert!(e.contains("summary-shard-0-of-2.json: shard 0/2 reports artifacts or failures for"), "{e}");
        assert!(merge(&[]).is_err());
    }

    #[test]
    fn reports_round_trip_through_files_and_folders() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..2 {
            let r = shard_report(i, 2, &[]);
            r.write(&dir.path().join("sub").join(default_file_name(Shard { index: i, count: 2 }))).unwrap();
        }
        std::fs::write(dir.path().join("sub/other.json"), "{}").unwrap();
        let found = collect_files(&[dir.path().join("sub")]).unwrap();
        let names: Vec<_> = found.iter().map(|f| f.file_name().unwrap().to_str().unwrap().to_string()).collect();
        assert_eq!(names, ["summary-shard-0-of-2.json", "summary-shard-1-of-2.json"]);
        let back = ShardReport::read(&found[1]).unwrap();
        assert_eq!(back.shard, shard_report(1, 2, &[]).shard);
        let e = format!("{:#}", collect_files(&[dir.path().to_path_buf()]).unwrap_err());
        assert!(e.contains("no shard summaries (summary-shard-*.json) in this folder"), "{e}");
        let e = format!("{:#}", ShardReport::read(&dir.path().join("sub/other.json")).unwrap_err());
        assert!(e.contains("other.json: not a shard summary"), "{e}");
        let e = format!("{:#}", collect_files(&[dir.path().join("nope")]).unwrap_err());
        assert!(e.contains("nope: no such file or folder"), "{e}");
    }
}
