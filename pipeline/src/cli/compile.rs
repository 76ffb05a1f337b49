//! `tessera compile INPUT... [--target T]... [--store DIR] [--out DIR] [--json]`

use crate::memo::Memo;
use crate::explain::jobs_from_specs;
use crate::zoo::{all_backends, compile_all, Summary};
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
    /// `fixture:MODEL[:bN][:sN][:iN]`.
    #[arg(required = true)]
    pub inputs: Vec<String>,
    #[command(flatten)]
    pub build: BuildOptions,
    /// Where artifacts go, as <model>.tsr.
    #[arg(long, default_value = "out")]
    pub out: PathBuf,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

const STAGES: [&str; 5] = ["load", "partition", "lower", "compile", "link"];

pub fn run(args: CompileArgs) -> Result<()> {
    let shapes = args.build.shapes()?;
    let jobs = jobs_from_specs(&args.inputs, &shapes)?;
    let backends = all_backends();
    let targets = args.build.targets(&backends)?;
    let store = args.build.open_store()?;

    let tty = std::io::stderr().is_terminal() && !args.json;
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
    let memo = Memo::new(&store).with_observer(|stage, hit| {
        let mut c = counts.lock().expect("counts");
        let e = c.entry(stage).or_default();
        if hit { e.1 += 1 } else { e.0 += 1 }
        if let Some(b) = bars.get(stage) {
            b.set_message(format!("{} run, {} cached", e.0, e.1));
            b.tick();
        }
    });
    let total = jobs.len();
    let done = Mutex::new(0usize);
    let summary = compile_all(&memo, &targets, &backends, &jobs, &args.out, args.build.costs, &|r| {
        let mut d = done.lock().expect("done");
        *d += 1;
        if !tty && !args.json {
            eprintln!("[{}/{}] {}: {} partitions, artifact {}", *d, total, r.name, r.partitions, r.artifact.short());
        }
    })?;
    for b in bars.values() {
        b.finish();
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print_summary(&summary);
    }
    if !summary.failed.is_empty() {
        for f in &summary.failed {
            eprintln!("error: {}", f.error);
        }
        anyhow::bail!("{} of {} models failed to compile", summary.failed.len(), summary.failed.len() + summary.models);
    }
    Ok(())
}

fn print_summary(s: &Summary) {
    println!("targets: {}", s.targets.join("; "));
    println!(
        "compiled {} models in {:.2}s: {} partitions, {} unique kernels (dedupe {:.2}x), costs: {}",
        s.models, s.seconds, s.partitions, s.unique_kernels, s.dedupe_ratio, s.cost_source
    );
    println!("{:<10} {:>10} {:>10} {:>10}", "stage", "executed", "cached", "time");
    for (stage, st) in &s.stages {
        println!("{:<10} {:>10} {:>10} {:>9.2}s", stage, st.executions, st.hits, st.exec_micros as f64 / 1e6);
    }
    println!("{:<28} {:>6} {:<22} {:>12}  artifact", "model", "parts", "backends", "bytes");
    for a in &s.artifacts {
        let backends: Vec<String> = a.partitions_by_backend.iter().map(|(b, n)| format!("{b}:{n}")).collect();
        println!("{:<28} {:>6} {:<22} {:>12}  {} {}", a.model, a.partitions, backends.join(" "), a.bytes, a.digest.short(), a.path.display());
    }
}
