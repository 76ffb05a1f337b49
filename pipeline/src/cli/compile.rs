//! `tessera compile INPUT... [--target T]... [--store DIR] [--out DIR] [--json] [--shard I/N] [--summary-out FILE]`

use crate::shard::{self, report::ShardReport, Shard, ShardArg};
use crate::zoo::Summary;
use anyhow::Result;
use super::build_options::BuildOptions;
use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Mutex;

#[derive(Args, Debug)]
pub struct CompileArgs {
    /// ONNX models (named after the file stem), zoo manifests (.toml), or fixture specs
    /// `fixture:MODEL[:bN][:sN][:iN]` (N of `:bN` may list batch sizes, as --batch does).
    #[arg(required = true)]
    pub inputs: Vec<String>,
    #[command(flatten)]
    pub build: BuildOptions,
    /// Batch sizes for the ONNX files and fixture specs given here: `1,8,32` plans those sizes into one
    /// artifact that serves any batch up to the largest (the smallest plan that fits, inputs zero-padded);
    /// a range `1-32` plans its ends and the powers of two between them; one size sets the batch. For ONNX
    /// files each size replaces the leading dimension of every input given by --shape. Manifest entries
    /// take `batch = [1, 8]`.
    #[arg(long = "batch", value_name = "SIZES")]
    pub batch: Option<String>,
    /// Where artifacts go, as <model>.tsr.
    #[arg(long, default_value = "out")]
    pub out: PathBuf,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Compile nothing: list every unsupported op and attribute of the ONNX inputs at once, each with its
    /// node, and fail if there is any (a model that imports prints nothing).
    #[arg(long)]
    pub check: bool,
    /// Build only shard I of N (I from 0): a deterministic share of the models, balanced by estimated
    /// build cost, the same in every shard. `auto/N` takes I from JOB_COMPLETION_INDEX (a Kubernetes
    /// Indexed Job), else SLURM_ARRAY_TASK_ID (minus SLURM_ARRAY_TASK_MIN when set). `tessera summary`
    /// merges the shards' summaries.
    #[arg(long, value_name = "I/N", value_parser = parse_shard)]
    pub shard: Option<ShardArg>,
    /// Write this run's JSON summary, with its shard and models, to FILE (default with --shard:
    /// OUT/summary-shard-I-of-N.json; without --shard the run is shard 0/1).
    #[arg(long, value_name = "FILE")]
    pub summary_out: Option<PathBuf>,
}

fn parse_shard(s: &str) -> Result<ShardArg, String> {
    s.parse::<ShardArg>().map_err(|e| format!("{e:#}"))
}

const STAGES: [&str; 5] = ["load", "partition", "lower", "compile", "link"];

pub fn run(args: CompileArgs) -> Result<()> {
    let mut request = args.build.request(&args.inputs, &args.out)?;
    if let Some(b) = &args.batch {
        request.batches = tessera_fixtures::batch::parse_batches(b).map_err(|e| anyhow::anyhow!("--batch {b}: {e}"))?;
    }
    if args.check {
        return check(&request.jobs()?, args.json);
    }
    let shard = args.shard.map(|s| s.resolve(&|k| std::env::var(k).ok())).transpose()?;
    let all_jobs = request.jobs()?;
    // With --shard or --summary-out: every model's cost is estimated and the models assigned to shards
    // (an unsharded run is shard 0/1), and this run builds its own share.
    let sharding = (shard.is_some() || args.summary_out.is_some()).then(|| {
        let s = shard.unwrap_or(Shard { index: 0, count: 1 });
        (s, shard::plan(&all_jobs, s.count))
    });
    let jobs = match &sharding {
        Some((s, assignment)) => shard::select(&all_jobs, assignment, s.index),
        None => all_jobs.clone(),
    };
    if let Some(s) = shard.filter(|_| !super::quiet()) {
        let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
        eprintln!("shard {s}: {} of {} models{}{}", jobs.len(), all_jobs.len(), if names.is_empty() { "" } else { ": " }, names.join(", "));
    }
    let tty = std::io::stderr().is_terminal() && !args.json && !super::quiet();
    let multi = MultiProgress::with_draw_target(if tty { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() });
    let style = ProgressStyle::with_template("{prefix:>10} {spinner} {msg}").expect("valid template");
    let bars: BTreeMap<&str, ProgressBar> = STAGES
        .iter()
        .map(|&s| {
            let b = multi.add(ProgressBar::new_spinner().with_style(style.clone()).with_prefix(s));
            b.set_message("waiting");
            (s, b)
        })
        .collect();
    let counts: Mutex<BTreeMap<&'static str, (u64, u64)>> = Mutex::default();
    let on_stage = |stage: &'static str, hit: bool| {
        let mut c = counts.lock().expect("counts");
        let e = c.entry(stage).or_default();
        if hit { e.1 += 1 } else { e.0 += 1 }
        if let Some(b) = bars.get(stage) {
            b.set_message(format!("{} run, {} cached", e.0, e.1));
            b.tick();
        }
    };
    let total = jobs.len();
    let done = Mutex::new(0usize);
    let summary = request.compile_jobs(&jobs, &on_stage, &|r| {
        let mut d = done.lock().expect("done");
        *d += 1;
        if !tty && !args.json && !super::quiet() {
            eprintln!("[{}/{}] {}: {} partitions, artifact {}", *d, total, r.name, r.partitions, r.artifact.short());
        }
    })?;
    for b in bars.values() {
        b.finish();
    }
    let report = sharding.map(|(s, assignment)| ShardReport::new(s, assignment, summary.clone()));
    if let Some(r) = &report {
        let path = match &args.summary_out {
            Some(p) => p.clone(),
            None => args.out.join(shard::report::default_file_name(Shard { index: r.shard.index, count: r.shard.count })),
        };
        r.write(&path)?;
        if !args.json {
            eprintln!("shard {}/{}: summary written to {}", r.shard.index, r.shard.count, path.display());
        }
    }
    if args.json {
        match &report {
            Some(r) => println!("{}", serde_json::to_string_pretty(r)?),
            None => println!("{}", serde_json::to_string_pretty(&summary)?),
        }
    } else {
        print_summary(&summary);
    }
    if let Some(r) = summary.remote.as_ref().filter(|_| !super::quiet()) {
        for w in r.warnings() {
            eprintln!("warning: {w}");
        }
    }
    if !summary.failed.is_empty() {
        for f in &summary.failed {
            eprintln!("error: {}", f.error);
        }
        anyhow::bail!("{} of {} models failed to compile", summary.failed.len(), summary.failed.len() + summary.models);
    }
    Ok(())
}

/// `compile --check`: every unsupported op and attribute of every ONNX input, one line (or JSON object) each.
fn check(jobs: &[crate::job::ModelJob], json: bool) -> Result<()> {
    let mut rows = Vec::new();
    for job in jobs {
        let crate::job::ModelSource::Onnx { path, shapes } = &job.source else { continue };
        let opts = tessera_stages::onnx::ImportOptions { shapes: shapes.clone() };
        for e in tessera_stages::onnx::check_file(path, &opts)? {
            let loc = e.location.clone();
            rows.push(serde_json::json!({
                "model": job.name,
                "file": e.file,
                "node": loc.as_ref().map(|l| l.node.clone()),
                "op": loc.as_ref().map(|l| l.op.clone()),
                "attribute": loc.as_ref().and_then(|l| l.attribute.clone()),
                "unsupported": e.unsupported_key(),
                "message": e.to_string(),
            }));
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        for r in &rows {
            println!("{}", r["message"].as_str().unwrap_or_default());
        }
    }
    let models: std::collections::BTreeSet<&str> = rows.iter().filter_map(|r| r["model"].as_str()).collect();
    if !rows.is_empty() {
        anyhow::bail!("{} unsupported op(s) or attribute(s) in {} model(s)", rows.len(), models.len());
    }
    if !json && !super::quiet() {
        eprintln!("every op and attribute of {} ONNX model(s) is supported", jobs.iter().filter(|j| matches!(j.source, crate::job::ModelSource::Onnx { .. })).count());
    }
    Ok(())
}

/// The text report of a compile run (also of merged shards: `tessera summary`).
pub fn print_summary(s: &Summary) {
    println!("targets: {}", s.targets.join("; "));
    println!(
        "compiled {} models in {:.2}s: {} partitions, {} unique kernels (dedupe {:.2}x), costs: {}",
        s.models, s.seconds, s.partitions, s.unique_kernels, s.dedupe_ratio, s.cost_source
    );
    // 12 wide: the longest stage name (`link-batches`) stays in its column.
    println!("{:<12} {:>10} {:>10} {:>10}", "stage", "executed", "cached", "time");
    for (stage, st) in &s.stages {
        println!("{:<12} {:>10} {:>10} {:>9.2}s", stage, st.executions, st.hits, st.exec_micros as f64 / 1e6);
    }
    if let Some(r) = &s.remote {
        println!(
            "remote {}{}: {} objects fetched ({} bytes), {} uploaded, {} rejected; memo {} hits, {} misses, {} uploaded, {} rejected{}{}",
            r.url,
            if r.read_only { " (read-only)" } else { "" },
            r.objects_fetched,
            r.bytes_fetched,
            r.objects_uploaded,
            r.objects_rejected,
            r.memo_hits,
            r.memo_misses,
            r.memo_uploaded,
            r.memo_rejected,
            if r.memo_signature_rejected > 0 { format!(" ({} without a valid signature from a trusted key)", r.memo_signature_rejected) } else { String::new() },
            if r.disabled.is_some() { "; disabled after an error" } else { "" }
        );
        if r.lease_taken + r.lease_waits > 0 {
            println!(
                "remote leases: {} taken, {} waits ({} served by the holder, {} taken over after expiry, {} gave up)",
                r.lease_taken, r.lease_waits, r.lease_served, r.lease_takeovers, r.lease_timeouts
            );
        }
    }
    if let Some(r) = &s.evicted {
        println!("store size cap: {}", r.lines().join("; "));
    }
    println!("{:<28} {:>6} {:<22} {:>12}  artifact", "model", "parts", "backends", "bytes");
    for a in &s.artifacts {
        let backends: Vec<String> = a.partitions_by_backend.iter().map(|(b, n)| format!("{b}:{n}")).collect();
        println!("{:<28} {:>6} {:<22} {:>12}  {} {}", a.model, a.partitions, backends.join(" "), a.bytes, a.digest.short(), a.path.display());
    }
}
