//! `tessera summary DIR_OR_FILE... [--json]`: merges the summaries of a sharded build (`tessera compile
//! --shard I/N`) into the report an unsharded build prints, after checking that every shard is there and
//! that they describe one build.

use super::compile::print_summary;
use crate::shard::report::{collect_files, merge, ShardReport};
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct SummaryArgs {
    /// Shard summary files, or folders holding them (every summary-shard-*.json in each).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Print the merged summary as JSON (the fields of `tessera compile --json`, plus each shard's line).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: SummaryArgs) -> Result<()> {
    let files = collect_files(&args.paths)?;
    let reports = files.iter().map(|f| Ok((f.clone(), ShardReport::read(f)?))).collect::<Result<Vec<_>>>()?;
    let merged = merge(&reports)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&merged)?);
    } else {
        println!("merged {} shards (seconds: the slowest shard's)", merged.shard_count);
        print_summary(&merged.summary);
        println!("{:<6} {:>7} {:>14} {:>9}  summary", "shard", "models", "estimated_us", "seconds");
        for s in &merged.shards {
            println!("{:<6} {:>7} {:>14} {:>8.2}s  {}", format!("{}/{}", s.index, merged.shard_count), s.models, s.estimated_cost, s.seconds, s.file.display());
        }
    }
    let s = &merged.summary;
    if !s.failed.is_empty() {
        for f in &s.failed {
            eprintln!("error: {}: {}", f.model, f.error);
        }
        bail!("{} of {} models failed to compile", s.failed.len(), s.failed.len() + s.models);
    }
    Ok(())
}
