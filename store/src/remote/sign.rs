//! Signed remote memo entries: a writer holding an ed25519 signing key signs every memo entry it writes to
//! the remote tier; a client configured with trusted public keys uses a remote entry only when it carries a
//! valid signature from one of them.
//!
//! Why: objects cannot be forged (they are named by their blake3 digest), but a memo entry is a claim — "stage
//! S's output for key K is object O" — and whoever can write the server can make that claim for any key. A
//! signature moves the trust from "can write the server" to "holds the signing key".
//!
//! What is signed ([`message`]): a domain-separation prefix, the stage name, the key and every field of the
//! entry (output digest, size, compute time, recording time), each at a fixed width or length-prefixed, so a
//! signature cannot be moved to another key or stage, nor kept when any field changes, nor confused with a
//! signature over anything else tessera (or another program using the same key) signs.
//!
//! Without trusted keys the client behaves as before signing existed: it accepts signed and unsigned entries
//! alike and checks no signature (a signature proves nothing to a client that trusts no key).

use super::{lock, Remote, RemoteMemo};
use crate::error::{Result, StoreError};
use crate::memo::MemoEntry;
use crate::Digest;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

/// Prefix of every signed message: names what is signed and its layout version, so a signature made for a
/// memo entry can never verify as anything else, and a later layout cannot be confused with this one.
pub const DOMAIN: &[u8] = b"tessera remote memo entry signature v1\0";

/// The bytes a memo entry's signature covers (see the module doc).
pub fn message(stage: &str, key: &Digest, entry: &MemoEntry) -> Vec<u8> {
    let mut m = Vec::with_capacity(DOMAIN.len() + 8 + stage.len() + 32 + 32 + 24);
    m.extend_from_slice(DOMAIN);
    // Length-prefixed: no stage name is a prefix of another's encoding.
    m.extend_from_slice(&(stage.len() as u64).to_le_bytes());
    m.extend_from_slice(stage.as_bytes());
    m.extend_from_slice(key.as_bytes());
    m.extend_from_slice(entry.output.as_bytes());
    m.extend_from_slice(&entry.size.to_le_bytes());
    m.extend_from_slice(&entry.compute_micros.to_le_bytes());
    m.extend_from_slice(&entry.recorded_unix.to_le_bytes());
    m
}

/// A signature as the remote memo record carries it (field `signature`, absent when unsigned).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoSignature {
    /// The signer's public key, 64 hex digits (which trusted key to verify with; itself proves nothing).
    pub public_key: String,
    /// The ed25519 signature over [`message`], 128 hex digits.
    pub signature: String,
}

/// The signing side: an ed25519 secret key. Its Debug never shows the key; the key is zeroized on drop.
pub struct MemoSigner {
    key: SigningKey,
}

impl MemoSigner {
    pub(crate) fn from_key(key: SigningKey) -> MemoSigner {
        MemoSigner { key }
    }

    /// The public key that verifies this signer's signatures (what goes in a trust file).
    pub fn public_key(&self) -> PublicKey {
        PublicKey(self.key.verifying_key())
    }

    /// Signs (stage, key, entry).
    pub fn sign(&self, stage: &str, key: &Digest, entry: &MemoEntry) -> MemoSignature {
        let sig = self.key.sign(&message(stage, key, entry));
        MemoSignature { public_key: self.public_key().to_hex(), signature: hex(&sig.to_bytes()) }
    }
}

impl fmt::Debug for MemoSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MemoSigner(<secret key>)")
    }
}

/// An ed25519 public key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicKey(pub(crate) VerifyingKey);

impl PublicKey {
    pub fn to_hex(&self) -> String {
        hex(self.0.as_bytes())
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({})", self.to_hex())
    }
}

/// Why a remote memo entry's signature is not accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Untrusted {
    Unsigned,
    UntrustedKey,
    Malformed(String),
    BadSignature,
}

impl fmt::Display for Untrusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Untrusted::Unsigned => f.write_str("it is unsigned and this client requires a signature from a trusted key"),
            Untrusted::UntrustedKey => f.write_str("it is signed by a key this client does not trust"),
            Untrusted::Malformed(why) => write!(f, "its signature is malformed ({why})"),
            Untrusted::BadSignature => f.write_str("its signature does not verify for this stage, key and content (tampered, or moved from another entry)"),
        }
    }
}

/// The public keys a client trusts; empty means "require no signature" (the behaviour without signing).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trust {
    keys: Vec<PublicKey>,
}

impl Trust {
    pub fn new(keys: Vec<PublicKey>) -> Trust {
        Trust { keys }
    }

    pub fn keys(&self) -> &[PublicKey] {
        &self.keys
    }

    /// Whether signatures are required at all.
    pub fn is_required(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Accepts (stage, key, entry) only with a valid signature from a trusted key. Strict verification
    /// (`verify_strict`): no malleable or small-order-key signatures.
    pub fn check(&self, stage: &str, key: &Digest, entry: &MemoEntry, sig: Option<&MemoSignature>) -> std::result::Result<(), Untrusted> {
        if !self.is_required() {
            return Ok(());
        }
        let sig = sig.ok_or(Untrusted::Unsigned)?;
        let signer: [u8; 32] = unhex(&sig.public_key).ok_or_else(|| Untrusted::Malformed("public key is not 64 hex digits".into()))?;
        let trusted = self.keys.iter().find(|k| k.0.as_bytes() == &signer).ok_or(Untrusted::UntrustedKey)?;
        let bytes: [u8; 64] = unhex(&sig.signature).ok_or_else(|| Untrusted::Malformed("signature is not 128 hex digits".into()))?;
        trusted.0.verify_strict(&message(stage, key, entry), &Signature::from_bytes(&bytes)).map_err(|_| Untrusted::BadSignature)
    }
}

/// How a remote client signs and what it trusts (`Remote::with_signing`). The default signs nothing and
/// requires no signature.
#[derive(Debug, Default)]
pub struct Signing {
    /// Signs every memo entry this client writes to the remote.
    pub signer: Option<MemoSigner>,
    /// Required signers of every remote memo entry this client uses.
    pub trust: Trust,
}

/// Per-process state the signing rules need on the Remote (warn once).
#[derive(Debug, Default)]
pub(super) struct SigningState {
    pub(super) config: Signing,
    warned: AtomicBool,
}

impl SigningState {
    pub(super) fn new(config: Signing) -> SigningState {
        SigningState { config, warned: AtomicBool::new(false) }
    }
}

impl Remote {
    /// Configures signing: entries this client writes are signed with `signing.signer`, and remote entries
    /// are used only with a valid signature from `signing.trust` (when it names any key).
    pub fn with_signing(mut self, signing: Signing) -> Remote {
        if signing.trust.is_required() && signing.signer.is_none() && !self.read_only {
            // Not an error (the writer may be meant to fill the cache for untrusting clients), but its
            // entries will be rejected by every trusting client, itself included.
            tracing::warn!(remote = %self.url.url, "this client requires signed remote memo entries but has no signing key: the entries it writes are unsigned");
        }
        self.signing = SigningState::new(signing);
        self
    }

    /// The signing configuration.
    pub fn signing(&self) -> &Signing {
        &self.signing.config
    }

    /// The signature for a record this client writes, if it signs.
    pub(super) fn sign_memo(&self, stage: &str, key: &Digest, entry: &MemoEntry) -> Option<MemoSignature> {
        self.signing.config.signer.as_ref().map(|s| s.sign(stage, key, entry))
    }

    /// Checks a record's signature against the trusted keys: [`StoreError::RemoteUntrustedEntry`] when
    /// one is required and missing or invalid.
    pub(super) fn check_memo_signature(&self, stage: &str, key: &Digest, entry: &MemoEntry, sig: Option<&MemoSignature>) -> Result<()> {
        self.signing.config.trust.check(stage, key, entry, sig).map_err(|why| StoreError::RemoteUntrustedEntry {
            url: self.url.url.clone(),
            stage: stage.into(),
            key: *key,
            why: why.to_string(),
        })
    }

    /// Counts a remote memo entry rejected for its signature (in `memo_rejected` and
    /// `memo_signature_rejected`); warns once per process (a trusting client reading an unsigned cache
    /// would otherwise warn on every lookup), then at debug level.
    pub fn reject_untrusted_memo(&self, e: &StoreError) {
        {
            let mut s = lock(&self.stats);
            s.memo_rejected += 1;
            s.memo_signature_rejected += 1;
        }
        if !self.signing.warned.swap(true, Ordering::AcqRel) {
            tracing::info!(remote = %self.url.url, error = %e, "remote memo entry rejected for its signature; recomputing (the build's remote summary counts them)");
        } else {
            tracing::debug!(remote = %self.url.url, error = %e, "remote memo entry rejected for its signature");
        }
    }

    /// The raw memo record stored for (stage, key), if any: what any reader of the server can see (tests,
    /// inspection).
    pub fn memo_record_raw(&self, stage: &str, key: &Digest) -> Result<Option<Vec<u8>>> {
        let path = Self::memo_path(stage, key);
        self.service.read(&path).map_err(|e| self.failed(format!("reading memo entry {path}"), e))
    }

    /// Writes raw bytes as the memo record for (stage, key): what any writer of the server can do, which is
    /// why trusting clients check signatures (tests use it to play that writer).
    pub fn put_memo_record_raw(&self, stage: &str, key: &Digest, bytes: &[u8]) -> Result<()> {
        self.check_writable("memo record")?;
        let path = Self::memo_path(stage, key);
        self.service.write(&path, bytes).map_err(|e| self.failed(format!("writing memo entry {path}"), e))?;
        Ok(())
    }
}

impl RemoteMemo {
    /// The entry this record holds, as signed (`output` parsed by the caller).
    pub(super) fn entry(&self, output: Digest) -> MemoEntry {
        MemoEntry { output, size: self.size, compute_micros: self.compute_micros, recorded_unix: self.recorded_unix }
    }
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// `N` bytes from exactly `2N` hex digits.
pub(crate) fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let s = s.as_bytes();
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in s.chunks(2).enumerate() {
        let d = |c: u8| (c as char).to_digit(16);
        out[i] = (d(pair[0])? * 16 + d(pair[1])?) as u8;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer(seed: u8) -> MemoSigner {
        MemoSigner::from_key(SigningKey::from_bytes(&[seed; 32]))
    }

    fn entry(out: &[u8]) -> MemoEntry {
        MemoEntry { output: Digest::of(out), size: out.len() as u64, compute_micros: 7, recorded_unix: 1_700_000_000 }
    }

    #[test]
    fn a_signature_round_trips_and_binds_stage_key_and_every_field() {
        let s = signer(1);
        let trust = Trust::new(vec![s.public_key()]);
        let (k, e) = (Digest::of(b"k"), entry(b"out"));
        let sig = s.sign("lower", &k, &e);
        assert_eq!(trust.check("lower", &k, &e, Some(&sig)), Ok(()));
        // Moved to another key or stage (replay), or any field changed: rejected.
        assert_eq!(trust.check("lower", &Digest::of(b"k2"), &e, Some(&sig)), Err(Untrusted::BadSignature));
        assert_eq!(trust.check("compile", &k, &e, Some(&sig)), Err(Untrusted::BadSignature));
        for changed in [
            MemoEntry { output: Digest::of(b"evil"), ..e },
            MemoEntry { size: 4, ..e },
            MemoEntry { compute_micros: 8, ..e },
            MemoEntry { recorded_unix: 1, ..e },
        ] {
            assert_eq!(trust.check("lower", &k, &changed, Some(&sig)), Err(Untrusted::BadSignature), "{changed:?}");
        }
        assert_eq!(trust.check("lower", &k, &e, None), Err(Untrusted::Unsigned));
        // Another key's valid signature is not trusted; claiming a trusted signer does not help it.
        let other = signer(2).sign("lower", &k, &e);
        assert_eq!(trust.check("lower", &k, &e, Some(&other)), Err(Untrusted::UntrustedKey));
        let forged = MemoSignature { public_key: s.public_key().to_hex(), signature: other.signature.clone() };
        assert_eq!(trust.check("lower", &k, &e, Some(&forged)), Err(Untrusted::BadSignature));
        let junk = MemoSignature { public_key: "zz".into(), signature: sig.signature.clone() };
        assert!(matches!(trust.check("lower", &k, &e, Some(&junk)), Err(Untrusted::Malformed(_))));
        // One of several trusted keys is enough.
        let two = Trust::new(vec![signer(2).public_key(), s.public_key()]);
        assert_eq!(two.check("lower", &k, &e, Some(&sig)), Ok(()));
        // No trusted keys: nothing is required (the behaviour without signing).
        assert_eq!(Trust::default().check("lower", &k, &e, None), Ok(()));
    }

    #[test]
    fn the_message_is_domain_separated_and_unambiguous() {
        let (k, e) = (Digest::of(b"k"), entry(b"out"));
        let m = message("lower", &k, &e);
        assert!(m.starts_with(DOMAIN));
        // A signature over the same bytes without the prefix (another protocol using the key) does not verify.
        let s = signer(3);
        let raw = s.key.sign(&m[DOMAIN.len()..]);
        let sig = MemoSignature { public_key: s.public_key().to_hex(), signature: hex(&raw.to_bytes()) };
        assert_eq!(Trust::new(vec![s.public_key()]).check("lower", &k, &e, Some(&sig)), Err(Untrusted::BadSignature));
        // Stage names are length-prefixed: "ab" + key is not "a" + ("b" + key).
        assert_ne!(message("ab", &k, &e), message("a", &k, &e));
        assert_eq!(m.len(), DOMAIN.len() + 8 + 5 + 32 + 32 + 24);
    }

    #[test]
    fn hex_round_trips_and_rejects_bad_digits() {
        assert_eq!(unhex::<2>("0aff"), Some([0x0a, 0xff]));
        assert_eq!(unhex::<2>(&hex(&[1, 2])), Some([1, 2]));
        assert_eq!(unhex::<2>("0af"), None);
        assert_eq!(unhex::<2>("0agf"), None);
        assert!(format!("{:?}", signer(1)).contains("<secret key>"));
    }
}
