//! `tessera inspect ARTIFACT`: what a compiled artifact holds, without running it: how it was built (its
//! provenance: tessera version and source revision, source model and digest, targets, precision, costs,
//! options), the model's inputs and outputs, its memory (arena, scratch, the weights' size), each module
//! (backend, canonical target, format, functions, size), the partitions (each step's backend and kernel), the
//! host/GPU transfers, the constants' digests, and the file's blake3 and payload digest. `--json` prints the
//! same as one JSON object ([`crate::inspect::ArtifactReport`]), digests as hex. A batched artifact also lists its
//! plans (batch size, steps, modules, memory); the rest describes its first plan, and the constants are the file's.

use crate::inspect::{describe, provenance_lines};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The artifact (.tsr) to describe.
    pub artifact: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let d = describe(&args.artifact)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
        return Ok(());
    }
    println!("{} ({}, blake3 {}, payload {}): model {}", d.file, size(d.file_bytes), &d.blake3[..16], &d.payload_digest[..16], d.model);
    for line in provenance_lines(d.provenance.as_ref()) {
        println!("{line}");
    }
    if !d.plans.is_empty() {
        let sizes: Vec<String> = d.batches.iter().map(|b| b.to_string()).collect();
        println!("plans ({}): batch sizes {}; a run of batch N up to {} uses the smallest plan >= N (inputs zero-padded)", d.plans.len(), sizes.join(", "), sizes.last().map_or("", |s| s));
        for p in &d.plans {
            let per: Vec<String> = p.steps_per_backend.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let ins: Vec<String> = p.inputs.iter().map(|i| format!("{} {}", i.name, i.ty)).collect();
            println!(
                "  batch {:<5} {} steps ({}), {} modules {}, arena {}, scratch {}, {} constants; {}",
                p.batch,
                p.steps,
                per.join(", "),
                p.modules,
                size(p.module_bytes as u64),
                size(p.arena_bytes),
                size(p.scratch_bytes),
                p.constants,
                ins.join(", ")
            );
        }
        println!("the first plan (batch {}):", d.batches[0]);
    }
    for (title, rows) in [("inputs", &d.inputs), ("outputs", &d.outputs)] {
        println!("{title}:");
        for v in rows {
            println!("  {:<24} {}", v.name, v.ty);
        }
    }
    println!("memory: arena {}, scratch {}, weights {} in {} constants", size(d.arena_bytes), size(d.scratch_bytes), size(d.constant_bytes), d.constants.len());
    println!("modules ({}):", d.modules.len());
    for (i, m) in d.modules.iter().enumerate() {
        println!("  {i:<3} {:<8} {:<14} {:<5} {:>4} functions {:>10}  {}", m.backend, m.format, m.place, m.functions, size(m.bytes as u64), m.target);
    }
    println!("partitions ({}):", d.partitions.len());
    for p in &d.partitions {
        println!("  {:<4} {:<8} {}", p.step, p.backend, p.kernel);
    }
    let per: Vec<String> = d.steps_per_backend.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!("steps: {} ({}); transfers: {}", d.steps, per.join(", "), d.transfers);
    println!("constants ({}):", d.constants.len());
    for (i, c) in d.constants.iter().enumerate() {
        println!("  {i:<4} {:<24} {:>10}  {}", c.ty, size(c.bytes), c.digest);
    }
    Ok(())
}
