//! `tessera targets`: every target kind, its attributes and defaults, and which backends run here.

use crate::zoo::all_backends;
use anyhow::{Context, Result};
use clap::Args;
use tessera_stages::target::{Target, KINDS, REGISTRY_VERSION};

#[derive(Args, Debug)]
pub struct TargetsArgs {
    /// Print the registry as JSON.
    #[arg(long)]
    pub json: bool,
    /// Print this machine's GPU fingerprint (JSON): what its measurements are keyed by, and what
    /// `tessera compile --frozen --measured-on FILE` takes to build from them on another machine.
    #[arg(long, conflicts_with = "json")]
    pub gpu_fingerprint: bool,
}

pub fn run(args: TargetsArgs) -> Result<()> {
    if args.gpu_fingerprint {
        let fp = tessera_stages::device::this_gpu().context("this machine has no GPU tessera can use (no CUDA driver or no device)")?;
        println!("{}", serde_json::to_string_pretty(&fp)?);
        return Ok(());
    }
    let backends = all_backends();
    let status = |backend: &str| -> String {
        match backends.iter().find(|b| b.name() == backend) {
            None => "not in this build yet".into(),
            Some(b) => match (b.available(), b.opt_in()) {
                (Ok(()), None) => "available".into(),
                (Ok(()), Some(why)) => format!("available, not in default builds: {why}"),
                (Err(why), _) => format!("unavailable: {why}"),
            },
        }
    };
    if args.json {
        let kinds: Vec<serde_json::Value> = KINDS
            .iter()
            .map(|k| {
                serde_json::json!({
                    "kind": k.name,
                    "doc": k.doc,
                    "attributes": k.attrs.iter().map(|a| serde_json::json!({
                        "name": a.name, "type": a.ty.describe(), "default": a.default, "doc": a.doc,
                    })).collect::<Vec<_>>(),
                    "backends": k.backends().iter().map(|b| serde_json::json!({
                        "compiler": b.compiler, "backend": b.name, "doc": b.doc, "status": status(b.name),
                        "default": b.compiler == k.default_compiler,
                        "options": b.options.iter().map(|a| serde_json::json!({
                            "name": a.name, "type": a.ty.describe(), "default": a.default, "doc": a.doc,
                        })).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>(),
                    "default": Target::parse(k.name).map(|t| t.canonical()).unwrap_or_default(),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "registry_version": REGISTRY_VERSION, "kinds": kinds }))?);
        return Ok(());
    }
    println!("target kinds (registry version {REGISTRY_VERSION}); syntax: `kind -attr=value -flag`, or JSON");
    for k in KINDS {
        println!("\n{} — {}", k.name, k.doc);
        if let Ok(t) = Target::parse(k.name) {
            println!("  canonical default: {}", t.canonical());
        }
        println!("  attributes of every backend of the device:{}", if k.attrs.is_empty() { " none" } else { "" });
        for a in k.attrs {
            println!("    -{:<12} {:<32} default {:<9} {}", a.name, a.ty.describe(), a.default, a.doc);
        }
        println!("  backends (-compiler), each with its own options:");
        for b in k.backends() {
            let default = if b.compiler == k.default_compiler { " (default: takes what no other backend claims)" } else { "" };
            println!("    -compiler={:<8} backend {:<8} {}{}", b.compiler, b.name, status(b.name), default);
            println!("      {}", b.doc);
            for a in b.options {
                println!("      -{:<12} {:<32} default {:<9} {}", a.name, a.ty.describe(), a.default, a.doc);
            }
        }
    }
    Ok(())
}
