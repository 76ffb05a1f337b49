//! `tessera inspect ARTIFACT`: what a compiled artifact holds, without running it: the model's inputs and
//! outputs, its memory (arena, scratch, constants), each module (backend, canonical target, format, functions,
//! size), the steps per backend and the host/GPU transfers, and the file's blake3 digest. `--json` prints the
//! same as one JSON object, digests as hex.

use anyhow::Context;
use clap::Args;
use std::collections::BTreeMap;
use std::path::PathBuf;
use tessera_kernels::artifact::Artifact;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The artifact (.tsr) to describe.
    pub artifact: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

fn size(bytes: u64) -> String {
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

/// The description, as JSON (the text form prints the same fields).
pub fn describe(path: &std::path::Path) -> anyhow::Result<serde_json::Value> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let a = Artifact::read_named(&bytes, &path.display().to_string())?;
    let b = &a.body;
    let mut steps: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &b.steps {
        let backend = b.modules.get(s.module as usize).map_or("?", |m| m.backend.as_str());
        *steps.entry(backend).or_insert(0) += 1;
    }
    let const_bytes: u64 = b.constants.iter().map(|c| c.ty.size_bytes() as u64).sum();
    Ok(serde_json::json!({
        "file": path.display().to_string(),
        "file_bytes": bytes.len(),
        "blake3": blake3::hash(&bytes).to_hex().to_string(),
        "model": b.model,
        "inputs": b.inputs.iter().map(|i| serde_json::json!({"name": i.name, "type": i.ty.to_string()})).collect::<Vec<_>>(),
        "outputs": b.outputs.iter().map(|o| serde_json::json!({"name": o.name, "type": o.ty.to_string()})).collect::<Vec<_>>(),
        "arena_bytes": b.arena_bytes,
        "scratch_bytes": b.scratch_bytes,
        "constants": b.constants.len(),
        "constant_bytes": const_bytes,
        "modules": b.modules.iter().map(|m| serde_json::json!({
            "backend": m.backend,
            "target": m.target,
            "format": m.format.name,
            "place": format!("{:?}", m.format.place).to_lowercase(),
            "functions": m.functions.len(),
            "bytes": m.bytes.len(),
        })).collect::<Vec<_>>(),
        "steps": b.steps.len(),
        "steps_per_backend": steps,
        "transfers": b.transfers.len(),
    }))
}

pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let d = describe(&args.artifact)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
        return Ok(());
    }
    let s = |k: &str| d[k].as_str().unwrap_or_default().to_string();
    let n = |k: &str| d[k].as_u64().unwrap_or_default();
    println!("{} ({}, blake3 {}): model {}", s("file"), size(n("file_bytes")), &s("blake3")[..16], s("model"));
    for (title, key) in [("inputs", "inputs"), ("outputs", "outputs")] {
        println!("{title}:");
        for v in d[key].as_array().into_iter().flatten() {
            println!("  {:<24} {}", v["name"].as_str().unwrap_or_default(), v["type"].as_str().unwrap_or_default());
        }
    }
    println!("memory: arena {}, scratch {}, {} constants ({})", size(n("arena_bytes")), size(n("scratch_bytes")), n("constants"), size(n("constant_bytes")));
    let modules = d["modules"].as_array().cloned().unwrap_or_default();
    println!("modules ({}):", modules.len());
    for (i, m) in modules.iter().enumerate() {
        println!(
            "  {i:<3} {:<8} {:<14} {:<5} {:>4} functions {:>10}  {}",
            m["backend"].as_str().unwrap_or_default(),
            m["format"].as_str().unwrap_or_default(),
            m["place"].as_str().unwrap_or_default(),
            m["functions"],
            size(m["bytes"].as_u64().unwrap_or_default()),
            m["target"].as_str().unwrap_or_default()
        );
    }
    let per: Vec<String> = d["steps_per_backend"].as_object().into_iter().flatten().map(|(k, v)| format!("{k} {v}")).collect();
    println!("steps: {} ({}); transfers: {}", n("steps"), per.join(", "), n("transfers"));
    Ok(())
}
