//! Key files for signed remote memo entries, and making a key pair.
//!
//! Text, one key a line, each line tagged with what it holds so that a secret key file given where public
//! keys are expected (or the reverse) is an error, not a silently wrong key; blank lines and lines starting
//! with `#` are ignored:
//! - secret key file (`--remote-signing-key`): exactly one line `ed25519-secret <64 hex digits>` (the
//!   32-byte seed). Made with mode 0600 by [`generate`]; a file readable by group or others is refused.
//! - public key file (`--remote-trust`): one or more lines `ed25519 <64 hex digits> [comment]`.
//!
//! Errors name the file and line, never the key material.

use super::sign::{unhex, MemoSigner, PublicKey};
use ed25519_dalek::{SigningKey, VerifyingKey};
use std::path::{Path, PathBuf};

/// The environment variable for `--remote-signing-key`.
pub const SIGNING_KEY_ENV: &str = "TESSERA_REMOTE_SIGNING_KEY";
/// The environment variable for `--remote-trust`.
pub const TRUST_ENV: &str = "TESSERA_REMOTE_TRUST";

const SECRET_TAG: &str = "ed25519-secret";
const PUBLIC_TAG: &str = "ed25519";

/// The names [`generate`] writes in its folder.
pub const SECRET_KEY_FILE: &str = "remote-signing.key";
pub const PUBLIC_KEY_FILE: &str = "remote-signing.pub";

/// A key file that cannot be used, naming it.
#[derive(Debug, thiserror::Error)]
#[error("key file {}: {why}", path.display())]
pub struct KeyFileError {
    pub path: PathBuf,
    pub why: String,
}

fn err(path: &Path, why: impl Into<String>) -> KeyFileError {
    KeyFileError { path: path.to_path_buf(), why: why.into() }
}

/// The meaningful lines: (line number, tag, rest of the line's words).
fn lines(text: &str) -> impl Iterator<Item = (usize, Vec<&str>)> {
    text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())).filter(|(_, l)| !l.is_empty() && !l.starts_with('#')).map(|(i, l)| (i, l.split_whitespace().collect()))
}

/// Reads a secret key file (see the module doc).
pub fn load_signing_key(path: &Path) -> Result<MemoSigner, KeyFileError> {
    let mut text = std::fs::read_to_string(path).map_err(|e| err(path, format!("cannot read it: {e}")))?;
    // Parsed first, so that a public key file given by mistake is named as such.
    let result = parse_secret(path, &text).and_then(|k| check_private(path).map(|_| k));
    // Best effort: do not leave the seed's hex in freed memory (the key itself is zeroized on drop).
    // SAFETY: zero bytes are valid UTF-8.
    unsafe { text.as_bytes_mut().fill(0) };
    std::hint::black_box(&text);
    result
}

fn parse_secret(path: &Path, text: &str) -> Result<MemoSigner, KeyFileError> {
    let found: Vec<_> = lines(text).collect();
    let [(n, words)] = found.as_slice() else {
        return Err(err(path, format!("expected exactly one line '{SECRET_TAG} <64 hex digits>', found {} key line(s)", found.len())));
    };
    match words.as_slice() {
        [tag, seed] if *tag == SECRET_TAG => {
            let seed: [u8; 32] = unhex(seed).ok_or_else(|| err(path, format!("line {n}: the secret key is not 64 hex digits")))?;
            Ok(MemoSigner::from_key(SigningKey::from_bytes(&seed)))
        }
        [tag, ..] if *tag == PUBLIC_TAG => Err(err(path, format!("line {n}: this is a public key; --remote-signing-key takes the secret key file ('{SECRET_TAG} ...', e.g. {SECRET_KEY_FILE})"))),
        _ => Err(err(path, format!("line {n}: expected '{SECRET_TAG} <64 hex digits>'"))),
    }
}

/// Refuses a secret key file that others can read (as ssh does): its holder can sign anything.
#[cfg(unix)]
fn check_private(path: &Path) -> Result<(), KeyFileError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| err(path, format!("cannot read it: {e}")))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(err(path, format!("a secret key readable by group or others (mode {mode:03o}): chmod 600 it")));
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_private(_: &Path) -> Result<(), KeyFileError> {
    Ok(())
}

/// Reads a public key file: one or more trusted keys (see the module doc).
pub fn load_trust(path: &Path) -> Result<Vec<PublicKey>, KeyFileError> {
    let text = std::fs::read_to_string(path).map_err(|e| err(path, format!("cannot read it: {e}")))?;
    let mut keys = Vec::new();
    for (n, words) in lines(&text) {
        match words.as_slice() {
            [tag, key, ..] if *tag == PUBLIC_TAG => keys.push(parse_public(path, n, key)?),
            [tag, ..] if *tag == SECRET_TAG => {
                return Err(err(path, format!("line {n}: this is a secret key; --remote-trust takes public keys ('{PUBLIC_TAG} ...', e.g. {PUBLIC_KEY_FILE}); keep the secret key private")))
            }
            _ => return Err(err(path, format!("line {n}: expected '{PUBLIC_TAG} <64 hex digits> [comment]'"))),
        }
    }
    if keys.is_empty() {
        return Err(err(path, format!("no key in it (expected lines '{PUBLIC_TAG} <64 hex digits> [comment]')")));
    }
    Ok(keys)
}

fn parse_public(path: &Path, n: usize, hex: &str) -> Result<PublicKey, KeyFileError> {
    let bytes: [u8; 32] = unhex(hex).ok_or_else(|| err(path, format!("line {n}: the public key is not 64 hex digits")))?;
    let key = VerifyingKey::from_bytes(&bytes).map_err(|_| err(path, format!("line {n}: not a valid ed25519 public key")))?;
    if key.is_weak() {
        return Err(err(path, format!("line {n}: a weak (small-order) ed25519 public key, which anyone can sign for")));
    }
    Ok(PublicKey(key))
}

/// The public key file's line for a key.
pub fn public_key_line(key: &PublicKey, comment: &str) -> String {
    format!("{PUBLIC_TAG} {} {comment}", key.to_hex()).trim_end().to_string()
}

/// Makes a key pair in `dir` (created if needed): [`SECRET_KEY_FILE`] (mode 0600) and [`PUBLIC_KEY_FILE`];
/// returns their paths. Never overwrites: an existing file is an error (a key in use would be lost).
pub fn generate(dir: &Path) -> Result<(PathBuf, PathBuf), KeyFileError> {
    std::fs::create_dir_all(dir).map_err(|e| err(dir, format!("cannot create the folder: {e}")))?;
    let (secret_path, public_path) = (dir.join(SECRET_KEY_FILE), dir.join(PUBLIC_KEY_FILE));
    for p in [&secret_path, &public_path] {
        if p.exists() {
            return Err(err(p, "exists already; not overwritten (move it away to make a new pair)"));
        }
    }
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| err(&secret_path, format!("no randomness from the OS: {e}")))?;
    let key = SigningKey::from_bytes(&seed);
    seed.fill(0);
    let mut text = format!("# tessera remote signing key (secret): keep it private\n{SECRET_TAG} {}\n", super::sign::hex(key.as_bytes()));
    let written = write_new(&secret_path, text.as_bytes(), 0o600);
    // SAFETY: zero bytes are valid UTF-8.
    unsafe { text.as_bytes_mut().fill(0) };
    std::hint::black_box(&text);
    written?;
    let public = PublicKey(key.verifying_key());
    let line = format!("# tessera remote signing key (public): give it to clients' --remote-trust\n{}\n", public_key_line(&public, ""));
    write_new(&public_path, line.as_bytes(), 0o644)?;
    Ok((secret_path, public_path))
}

/// Creates `path` (never replacing one) with `mode` from the start, so the secret is never readable by others.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), KeyFileError> {
    use std::io::Write;
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut f = o.open(path).map_err(|e| err(path, format!("cannot create it: {e}")))?;
    f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| err(path, format!("cannot write it: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memo::MemoEntry;
    use crate::remote::sign::Trust;
    use crate::Digest;

    #[test]
    fn generated_pairs_load_and_sign_what_the_public_key_verifies() {
        let t = tempfile::tempdir().unwrap();
        let (sk, pk) = generate(&t.path().join("keys")).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&sk).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let signer = load_signing_key(&sk).unwrap();
        let trust = load_trust(&pk).unwrap();
        assert_eq!(trust, vec![signer.public_key()]);
        let (k, e) = (Digest::of(b"k"), MemoEntry { output: Digest::of(b"o"), size: 1, compute_micros: 0, recorded_unix: 0 });
        assert_eq!(Trust::new(trust).check("s", &k, &e, Some(&signer.sign("s", &k, &e))), Ok(()));
        // Never overwritten.
        let e = generate(&t.path().join("keys")).unwrap_err().to_string();
        assert!(e.contains(SECRET_KEY_FILE) && e.contains("exists already"), "{e}");
        // Two pairs differ.
        let (sk2, _) = generate(&t.path().join("other")).unwrap();
        assert_ne!(load_signing_key(&sk2).unwrap().public_key(), signer.public_key());
    }

    #[test]
    fn bad_key_files_are_errors_naming_the_file_and_never_the_key() {
        let t = tempfile::tempdir().unwrap();
        let (sk, pk) = generate(t.path()).unwrap();
        let secret_hex = std::fs::read_to_string(&sk).unwrap().split_whitespace().last().unwrap().to_string();
        let write = |name: &str, text: &str| {
            let p = t.path().join(name);
            write_new(&p, text.as_bytes(), 0o600).unwrap();
            p
        };
        let cases = [
            (load_signing_key(&t.path().join("absent")).map(|_| ()), "absent", "cannot read"),
            (load_signing_key(&pk).map(|_| ()), PUBLIC_KEY_FILE, "this is a public key"),
            (load_trust(&sk).map(|_| ()), SECRET_KEY_FILE, "this is a secret key"),
            (load_signing_key(&write("short", "ed25519-secret abcd\n")).map(|_| ()), "short", "not 64 hex digits"),
            (load_signing_key(&write("empty", "# nothing\n")).map(|_| ()), "empty", "found 0 key line(s)"),
            (load_trust(&write("notrust", "\n")).map(|_| ()), "notrust", "no key in it"),
            (load_trust(&write("garbage", "ed25519 xyz\n")).map(|_| ()), "garbage", "line 1: the public key is not 64 hex digits"),
            (load_trust(&write("other", "ssh-ed25519 AAAA\n")).map(|_| ()), "other", "line 1: expected 'ed25519"),
            (load_trust(&write("weak", &format!("ed25519 01{}\n", "00".repeat(31)))).map(|_| ()), "weak", "weak"),
        ];
        for (r, file, says) in cases {
            let e = r.unwrap_err().to_string();
            assert!(e.contains(&t.path().join(file).display().to_string()) && e.contains(says), "{file}: {e}");
            assert!(!e.contains(&secret_hex), "never the key: {e}");
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&sk, std::fs::Permissions::from_mode(0o644)).unwrap();
            let e = load_signing_key(&sk).unwrap_err().to_string();
            assert!(e.contains("readable by group or others") && e.contains(SECRET_KEY_FILE), "{e}");
        }
        // Several trusted keys, with comments and blank lines.
        let (_, pk2) = generate(&t.path().join("b")).unwrap();
        let both = format!("{}\n\n{}  ci-builder-2\n", std::fs::read_to_string(&pk).unwrap(), std::fs::read_to_string(&pk2).unwrap().trim());
        assert_eq!(load_trust(&write("both", &both)).unwrap().len(), 2);
    }
}
