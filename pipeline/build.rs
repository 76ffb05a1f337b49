//! Embeds the source revision this tessera is built from as `TESSERA_SOURCE_REVISION`, for the provenance the
//! pipeline stamps on every artifact it writes (`src/provenance.rs`) and for `tessera --version`.
//!
//! The revision is, in order: `$TESSERA_SOURCE_REVISION` when the packager sets it (a wheel or tarball build
//! that knows its commit); else the commit of the git checkout this crate is the workspace of, with `-dirty`
//! when the compiled sources differ from it; else `unknown` (a tarball, or a copy inside someone else's
//! repository). It never reaches a key or the store: only the stamped section holds it, so an incremental
//! build, a rebuild at another commit and a build outside git all produce the same payloads.
//!
//! Rebuild triggers: the script runs again when HEAD moves (HEAD, its reflog, the branch ref it names,
//! packed-refs) or a compiled source changes (the `SOURCES` below, the same paths whose changes mark the
//! revision dirty), and not otherwise: an edit to a test or a README does not rebuild the CLI, nor does a
//! commit in another worktree of the same repository. In a `git worktree` `.git` is a file; `git rev-parse
//! --git-path` finds HEAD and its reflog in the worktree's own folder and refs in the common one.

use std::path::{Path, PathBuf};
use std::process::Command;

/// What is compiled into the `tessera` binary and library, relative to the workspace root: each crate's
/// sources, build script and manifest, and the lock file. "-dirty" means one of these differs from HEAD.
const SOURCES: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "source-digest/src",
    "source-digest/Cargo.toml",
    "store/src",
    "store/Cargo.toml",
    "stages/src",
    "stages/build.rs",
    "stages/Cargo.toml",
    "kernels/src",
    "kernels/build.rs",
    "kernels/Cargo.toml",
    "fixtures/src",
    "fixtures/Cargo.toml",
    "pipeline/src",
    "pipeline/build.rs",
    "pipeline/Cargo.toml",
];

fn main() {
    println!("cargo:rerun-if-env-changed=TESSERA_SOURCE_REVISION");
    let given = std::env::var("TESSERA_SOURCE_REVISION").ok().filter(|r| !r.trim().is_empty());
    let revision = match given {
        Some(r) => r.trim().to_string(),
        None => {
            let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR")).join("..");
            git_revision(&root).unwrap_or_else(|| "unknown".to_string())
        }
    };
    println!("cargo:rustc-env=TESSERA_SOURCE_REVISION={revision}");
}

/// `git args` in `root`: its standard output, trimmed, when git runs and succeeds.
fn git(root: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").current_dir(root).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The checkout's commit (and "-dirty"), printing the rerun triggers; `None` outside a checkout of this
/// workspace.
fn git_revision(root: &Path) -> Option<String> {
    // Only a checkout whose top is this workspace: a source tarball unpacked inside another repository must not
    // take that repository's commit.
    let top = PathBuf::from(git(root, &["rev-parse", "--show-toplevel"])?);
    if top.canonicalize().ok()? != root.canonicalize().ok()? {
        return None;
    }
    let commit = git(root, &["rev-parse", "--verify", "HEAD"])?;
    // HEAD's reflog moves with every commit, checkout or reset in this worktree (only), even where the branch
    // lives in packed-refs and a commit creates its loose ref, a file that did not exist to be watched.
    let mut watched = vec![];
    for p in ["HEAD", "logs/HEAD", "packed-refs"] {
        watched.push(git(root, &["rev-parse", "--git-path", p])?);
    }
    if let Some(branch) = git(root, &["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(root, &["rev-parse", "--git-path", &branch])?);
    }
    watched.extend(SOURCES.iter().map(|s| s.to_string()));
    for p in watched {
        let p = root.join(p);
        // A path that does not exist (a branch only in packed-refs) would make cargo run the script every build.
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    // --no-optional-locks: a build must not take the index lock (or rewrite the index) under the user's feet.
    let mut status = vec!["--no-optional-locks", "status", "--porcelain", "--"];
    status.extend(SOURCES);
    let dirty = !git(root, &status)?.is_empty();
    Some(if dirty { format!("{commit}-dirty") } else { commit })
}
