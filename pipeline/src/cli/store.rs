//! `tessera store ...`: inspect and maintain the content-addressed store (see store/README.md).
//!
//! Every subcommand takes `--store DIR` (default `$TESSERA_STORE`, else `.tessera` in the working
//! directory) and `--wait`. Many processes use one store at once (compiles, `stats`, `verify`, `export`,
//! `import`); only what deletes (`gc`, `gc --max-size`, `verify --repair`) needs it alone, and without
//! `--wait` fails at once, naming the processes in the way.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use std::path::{Path, PathBuf};
use tessera_store::{OpenOptions, Store, StoreError};

/// Options every `tessera store` subcommand takes.
#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    /// The store directory.
    #[arg(long = "store", value_name = "DIR", env = tessera_store::STORE_ENV, default_value = tessera_store::DEFAULT_DIR)]
    pub dir: PathBuf,
    /// If the store is held in a way this command cannot share (gc needs it alone; others wait only for
    /// a gc), wait instead of failing.
    #[arg(long)]
    pub wait: bool,
}

#[derive(Subcommand, Debug)]
pub enum StoreCommand {
    /// Object and memo counts, bytes, hits and misses per stage, dedupe savings.
    Stats {
        #[command(flatten)]
        store: StoreArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Re-hash every object, check the index and the journal; bad objects are moved to quarantine/.
    /// Exits non-zero when anything was wrong.
    Verify {
        #[command(flatten)]
        store: StoreArgs,
        /// Also repair the index: rebuild it from the journal if damaged, drop memo entries whose
        /// output is gone, rewrite a damaged journal.
        #[arg(long)]
        repair: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove every object no root lists, and the memo entries that point at them; with --max-size, evict
    /// least recently used memo entries (and the objects only they name) down to a size instead.
    Gc {
        #[command(flatten)]
        store: StoreArgs,
        /// Only report what would be removed.
        #[arg(long)]
        dry_run: bool,
        /// Evict least recently used memo entries, and the objects only they name, until the objects take at
        /// most SIZE (bytes, or with K, M, G, T: 500M, 2G); objects a root lists are never evicted. Nothing
        /// else is removed.
        #[arg(long, value_name = "SIZE", value_parser = parse_size_arg)]
        max_size: Option<u64>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show or set the store's configuration: its size cap, which every `tessera compile` into the store
    /// enforces when it is done (as `gc --max-size` does).
    Config {
        #[command(flatten)]
        store: StoreArgs,
        /// The cap: bytes, or with K, M, G, T (500M, 2G); `none` removes it.
        #[arg(long, value_name = "SIZE", value_parser = parse_cap_arg)]
        max_size: Option<Cap>,
        /// Print the configuration as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a build's closure (objects a root lists, their memo entries, the root) to one archive file.
    Export {
        #[command(flatten)]
        store: StoreArgs,
        /// The archive to write (a tar file).
        file: PathBuf,
        /// Export only this root (default: every root, unless `--stage` is given).
        #[arg(long)]
        root: Option<String>,
        /// Also export every record of this stage (repeatable), e.g. `--stage tune --stage time-plans`: the
        /// measurements another machine needs to build from them (`tessera compile --frozen`). Without
        /// `--root`, only those records.
        #[arg(long = "stage", value_name = "STAGE")]
        stages: Vec<String>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Read an archive written by `export`, verifying every object.
    Import {
        #[command(flatten)]
        store: StoreArgs,
        /// The archive to read.
        file: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make an ed25519 key pair for signing remote memo entries: `remote-signing.key` (the secret key,
    /// mode 0600; for writers' `--remote-signing-key`) and `remote-signing.pub` (for clients'
    /// `--remote-trust`) in DIR. Never overwrites a key; prints the files' paths, never the keys.
    Keygen {
        /// The folder to write the two files in (created if needed).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Print the two files' paths as JSON.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: StoreCommand) -> anyhow::Result<()> {
    match cmd {
        StoreCommand::Stats { store, json } => {
            let s = open(&store, OpenOptions::read_only(), false)?;
            let stats = s.stats()?;
            if json {
                say(&format!("{}\n", stats.to_json()))
            } else {
                say(&stats.to_string())
            }
        }
        StoreCommand::Verify { store, repair, json } => {
            // Repair deletes and replaces: it holds the store alone (waits with --wait); a plain verify shares it.
            let mut s = open(&store, OpenOptions::writable().exclusive(repair), repair)?;
            let report = s.verify(repair)?;
            if json {
                say(&format!("{}\n", serde_json_report(&report)?))?;
            } else {
                say_lines(&report.lines())?;
            }
            if !report.is_clean() {
                let hint = if repair { "" } else { "; `--repair` fixes what the index and journal can" };
                bail!("verify found problems in {}{hint}", store.dir.display());
            }
            Ok(())
        }
        StoreCommand::Gc { store, dry_run, max_size: Some(max), json } => {
            let mut s = open(&store, OpenOptions::writable().exclusive(!dry_run), false)?;
            let r = s.evict_to(max, dry_run)?;
            if json {
                return say(&format!("{}\n", json_report(&r, "gc")?));
            }
            say_lines(&r.lines())
        }
        StoreCommand::Config { store, max_size, json } => {
            let opts = if max_size.is_some() { OpenOptions::writable() } else { OpenOptions::read_only() };
            let s = open(&store, opts, false)?;
            if let Some(cap) = max_size {
                s.set_max_size(cap.0)?;
            }
            if json {
                return say(&format!("{}\n", json_report(&serde_json::json!({ "max_size": s.max_size()? }), "config")?));
            }
            let line = match s.max_size()? {
                Some(n) => format!("max-size {n} ({}): every compile into this store evicts down to it\n", tessera_store::stats::human_bytes(n)),
                None => "max-size none: the store is not capped\n".to_string(),
            };
            say(&line)
        }
        StoreCommand::Gc { store, dry_run, max_size: None, json } => {
            let mut s = open(&store, OpenOptions::writable().exclusive(!dry_run), false)?;
            let r = s.gc(dry_run)?;
            if json {
                return say(&format!("{}\n", json_report(&r, "gc")?));
            }
            say_lines(&r.lines())
        }
        StoreCommand::Export { store, file, root, stages, json } => {
            let s = open(&store, OpenOptions::read_only(), false)?;
            let r = s.export_with(&file, root.as_deref(), &stages)?;
            if json {
                return say(&format!("{}\n", json_report(&r, "export")?));
            }
            say(&format!(
                "exported {} root(s), {} object(s) ({}), {} memo entr(ies) to {}\n",
                r.roots,
                r.objects,
                tessera_store::stats::human_bytes(r.bytes),
                r.memo_entries,
                file.display()
            ))
        }
        StoreCommand::Import { store, file, json } => {
            let s = open(&store, OpenOptions::writable(), false)?;
            let r = s.import(&file)?;
            if json {
                return say(&format!("{}\n", json_report(&r, "import")?));
            }
            say(&format!(
                "imported {} root(s), {} memo entr(ies); {} new object(s) ({}), {} already present\n",
                r.roots,
                r.memo_entries,
                r.objects_added,
                tessera_store::stats::human_bytes(r.bytes_added),
                r.objects_already_present
            ))
        }
        StoreCommand::Keygen { out, json } => {
            let (secret, public) = tessera_store::remote::keyfile::generate(&out)?;
            if json {
                return say(&format!("{}\n", json_report(&serde_json::json!({ "secret_key": secret, "public_key": public }), "keygen")?));
            }
            say(&format!(
                "wrote the secret key to {} (mode 0600: writers' --remote-signing-key; keep it private) and the public key to {} (clients' --remote-trust)\n",
                secret.display(),
                public.display()
            ))
        }
    }
}

/// `--max-size` of `store config`: a size, or `none` (no cap).
#[derive(Clone, Copy, Debug)]
pub struct Cap(pub Option<u64>);

fn parse_size_arg(s: &str) -> Result<u64, String> {
    tessera_store::parse_size(s)
}

fn parse_cap_arg(s: &str) -> Result<Cap, String> {
    if s.trim().eq_ignore_ascii_case("none") {
        Ok(Cap(None))
    } else {
        tessera_store::parse_size(s).map(|n| Cap(Some(n)))
    }
}

/// Opens the store; with `--wait`, says on stderr who it is waiting for. `repair` rebuilds a
/// damaged index from the journal. Prints what crash recovery did, if anything.
fn open(args: &StoreArgs, opts: OpenOptions, repair: bool) -> anyhow::Result<Store> {
    let try_open =
        |o: OpenOptions| if repair { Store::open_repairing(&args.dir, o) } else { Store::open(&args.dir, o) };
    let store = match try_open(opts) {
        Err(StoreError::Locked { holder, .. }) if args.wait => {
            eprintln!("waiting for the store {}: in use by {holder}", args.dir.display());
            try_open(opts.wait(true))
        }
        other => other,
    }
    .with_context(|| format!("opening the store {}", show(&args.dir)))?;
    for line in store.open_report().lines() {
        eprintln!("store: {line}");
    }
    Ok(store)
}

/// Writes to stdout; a closed pipe (`| head`) ends output quietly instead of panicking as `println!` does.
fn say(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

fn say_lines(lines: &[String]) -> anyhow::Result<()> {
    let mut text = lines.join("\n");
    text.push('\n');
    say(&text)
}

fn show(p: &Path) -> String {
    p.display().to_string()
}

fn serde_json_report(r: &tessera_store::VerifyReport) -> anyhow::Result<String> {
    json_report(r, "verify")
}

/// A report of a store command as pretty JSON (digests as hex, as everywhere).
fn json_report<T: serde::Serialize>(r: &T, what: &str) -> anyhow::Result<String> {
    serde_json::to_string_pretty(r).with_context(|| format!("encoding the {what} report"))
}

#[cfg(test)]
mod tests {
    use crate::cli::{run as run_cli, Cli};
    use clap::Parser;
    use std::path::PathBuf;
    use tessera_store::{MemoEntry, OpenOptions, Store};

    /// A scratch directory removed on drop (the pipeline crate has no tempfile dependency).
    struct Scratch(PathBuf);
    impl Scratch {
        fn new(name: &str) -> Self {
            let p = std::env::temp_dir().join(format!("tessera-cli-store-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Scratch(p)
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn cli(args: &[&str]) -> anyhow::Result<()> {
        let mut argv = vec!["tessera", "store"];
        argv.extend_from_slice(args);
        run_cli(Cli::try_parse_from(argv)?)
    }

    #[test]
    fn verify_fails_on_a_flipped_byte_and_export_import_round_trip() {
        let t = Scratch::new("verify");
        let dir = t.0.join("s");
        let d = {
            let s = Store::open(&dir, OpenOptions::writable()).unwrap();
            let d = s.put(b"an artifact").unwrap();
            let key = tessera_store::KeyBuilder::new("link", 1).input("m", "mlp").finish().unwrap();
            s.memo_record("link", &key, &MemoEntry::new(d, 11, std::time::Duration::ZERO)).unwrap();
            s.set_root("mlp", &[d]).unwrap();
            d
        };
        let ds = dir.to_str().unwrap();
        cli(&["verify", "--store", ds]).unwrap();
        cli(&["stats", "--store", ds, "--json"]).unwrap();
        cli(&["gc", "--store", ds, "--dry-run"]).unwrap();
        let archive = t.0.join("mlp.tar");
        cli(&["export", "--store", ds, "--root", "mlp", archive.to_str().unwrap()]).unwrap();
        let other = t.0.join("s2");
        cli(&["import", "--store", other.to_str().unwrap(), archive.to_str().unwrap()]).unwrap();
        let s2 = Store::open(&other, OpenOptions::read_only()).unwrap();
        assert_eq!(s2.get(&d).unwrap(), b"an artifact");
        assert_eq!(s2.root("mlp").unwrap(), Some(vec![d]));
        drop(s2);

        let path = dir.join("objects").join(&d.to_hex()[..2]).join(d.to_hex());
        let mut perms = std::fs::metadata(&path).unwrap().permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perms.set_readonly(false);
        std::fs::set_permissions(&path, perms).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[4] ^= 0x20;
        std::fs::write(&path, bytes).unwrap();
        let err = cli(&["verify", "--store", ds]).unwrap_err();
        assert!(err.to_string().contains("verify found problems"), "{err}");
        assert!(dir.join("quarantine").join(d.to_hex()).exists());
    }

    #[test]
    fn readers_share_the_store_and_gc_names_the_holders() {
        let t = Scratch::new("lock");
        let dir = t.0.to_str().unwrap();
        let held = Store::open(&t.0, OpenOptions::writable()).unwrap();
        // A reader runs while another handle (a compile) has the store open.
        cli(&["stats", "--store", dir]).unwrap();
        // What deletes needs the store alone, and says who is in the way.
        let err = cli(&["gc", "--store", dir]).unwrap_err();
        let msg = format!("{err:#}");
        assert!(
            msg.contains("in use by another process") && msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        drop(held);
        cli(&["gc", "--store", dir]).unwrap();
    }
}
