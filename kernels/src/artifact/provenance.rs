//! Provenance: how an artifact was built (which tessera, from which source model, for which targets, with
//! which costs and options), recorded in a section after the data section.
//!
//! # Why a section of its own, outside the payload
//!
//! The *payload* (header, body, data section) is what the linker writes and the store memoizes: a pure
//! function of the link stage's key, shared by every machine and every revision of tessera whose code
//! versions give that key. Provenance names things no key holds and must not hold: the git revision of the
//! tessera that wrote the file (every commit would otherwise relink every model and change the bytes that
//! `fixtures/frozen` and the validation's plan timings are keyed by). So the pipeline *stamps* provenance onto
//! the payload when it writes `<model>.tsr` (the [`Stamper`]): the header's [`FLAG_PROVENANCE`] is set and the
//! section appended. The payload's own bytes are untouched: its digest (bytes 32..64) still covers the body
//! and data section, and the [payload digest](super::Artifact::payload_digest), the blake3 of the file with
//! the flag cleared and the section dropped, is exactly the store's artifact object digest, what
//! `tessera compile --json` reports and what reproducibility claims compare.
//!
//! # Layout, section version 1
//!
//! ```text
//! offset  size  field (P = the payload's end, align64(64 + body length) + data length)
//! P       4     section version (u32)  PROVENANCE_VERSION
//! P+4     4     reserved (u32)         0
//! P+8     8     encoding length (u64)  L
//! P+16    32    blake3 of the encoding
//! P+48    L     postcard encoding of `Provenance`; the file ends exactly at P + 48 + L
//! ```
//!
//! Like the payload, the section holds no time, no path and no hash-map order: the same build gives the same
//! bytes. A reader refuses a section of another version, a section whose digest or length is wrong, and a
//! header flag without a section (a file truncated at the payload's end), each as an error naming the file.

use super::{ArtifactErrorKind, BATCHED_FORMAT_VERSION, FORMAT_VERSION, HEADER_LEN, MAGIC};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Write};

/// The header flag (bit 0 of the flags word) saying a provenance section follows the data section.
pub const FLAG_PROVENANCE: u32 = 1;
/// Version of the section's layout and encoding; bump on any change to either (or to [`Provenance`]).
pub const PROVENANCE_VERSION: u32 = 1;
/// Bytes before the section's encoding: version, reserved word, length, digest.
pub const SECTION_HEADER_LEN: usize = 48;
/// Offset of the flags word in the header.
const FLAGS_AT: usize = 12;

/// How an artifact was built. Strings rather than the compiler's types: the runtime reads it without the
/// compiler, and names stay readable when the compiler's types change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Provenance {
    /// The version of the tessera that wrote the artifact (its crates' version, `0.1.0`).
    pub tessera_version: String,
    /// The source revision it was built from: a git commit (40 hex digits, `-dirty` added when the compiled
    /// sources differed from it), what the packager gave as `TESSERA_SOURCE_REVISION`, or `unknown` (a build
    /// outside a git checkout).
    pub source_revision: String,
    /// The model it was compiled from.
    pub source: SourceModel,
    /// The build's canonical targets (every attribute present), in target-set order.
    pub targets: Vec<String>,
    /// The precision the model computes in: `fp32`, `fp16` or `bf16`.
    pub precision: String,
    /// Where partition costs came from: `measured`, `analytical`, or `recorded` (a frozen build).
    pub costs: String,
    /// Every other build option that reached a key, by name: ONNX input shapes (`shape.NAME` = `1x128`), the
    /// GPU a frozen build's records were measured on (`measured_on`, its fingerprint as JSON), the backend a
    /// single-backend baseline build preferred (`prefer`). Fixture options are in the source name.
    pub options: BTreeMap<String, String>,
}

/// The source model of an artifact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceModel {
    /// `onnx` or `fixture`.
    pub kind: String,
    /// The ONNX file's name (without its folder: no paths in artifacts), or the fixture spec
    /// (`fixture:mlp3:b2`).
    pub name: String,
    /// blake3 of the ONNX file's bytes (external data files are not included; the artifact's constant
    /// digests cover the weights), or the fixture's recipe digest (its name, options and the builders' code
    /// version: what the load stage keys a fixture by).
    pub digest: Blake3,
}

/// A blake3 digest: 32 raw bytes in binary encodings (postcard), 64 hex digits in human-readable ones (JSON).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Blake3(pub [u8; 32]);

impl Blake3 {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Blake3 {
        Blake3(*blake3::hash(bytes).as_bytes())
    }

    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Option<Blake3> {
        if s.len() != 64 || !s.is_ascii() {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Blake3(out))
    }
}

impl fmt::Display for Blake3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Blake3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Blake3({})", self.to_hex())
    }
}

impl Serialize for Blake3 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.serialize_str(&self.to_hex())
        } else {
            self.0.serialize(s)
        }
    }
}

impl<'de> Deserialize<'de> for Blake3 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Blake3, D::Error> {
        if d.is_human_readable() {
            let s = String::deserialize(d)?;
            Blake3::from_hex(&s).ok_or_else(|| serde::de::Error::custom(format!("'{s}' is not 64 hex digits")))
        } else {
            <[u8; 32]>::deserialize(d).map(Blake3)
        }
    }
}

/// The section recording `p` (layout in the module documentation).
pub fn encode_section(p: &Provenance) -> Result<Vec<u8>, postcard::Error> {
    let encoded = postcard::to_stdvec(p)?;
    let mut out = Vec::with_capacity(SECTION_HEADER_LEN + encoded.len());
    out.extend_from_slice(&PROVENANCE_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(encoded.len() as u64).to_le_bytes());
    out.extend_from_slice(blake3::hash(&encoded).as_bytes());
    out.extend_from_slice(&encoded);
    Ok(out)
}

/// Decodes a whole section (`bytes` runs from the payload's end to the file's end). Every field is checked:
/// version, reserved word, exact length, digest, and an encoding with nothing after it.
pub fn decode_section(bytes: &[u8]) -> Result<Provenance, ArtifactErrorKind> {
    let fail = |msg: String| ArtifactErrorKind::Provenance(msg);
    if bytes.len() < SECTION_HEADER_LEN {
        return Err(fail(format!("truncated: {} bytes, shorter than the {SECTION_HEADER_LEN}-byte section header", bytes.len())));
    }
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let version = word(0);
    if version != PROVENANCE_VERSION {
        return Err(fail(format!("section version {version} is not supported (this runtime reads version {PROVENANCE_VERSION})")));
    }
    if word(4) != 0 {
        return Err(fail(format!("reserved word is {:#x}, not 0", word(4))));
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let actual = (bytes.len() - SECTION_HEADER_LEN) as u64;
    if len != actual {
        return Err(fail(format!("{actual} bytes of encoding, the section promises {len} (truncated or padded)")));
    }
    let encoded = &bytes[SECTION_HEADER_LEN..];
    if blake3::hash(encoded).as_bytes() != &bytes[16..48] {
        return Err(fail("digest mismatch: the section is corrupted".into()));
    }
    let (p, rest) = postcard::take_from_bytes::<Provenance>(encoded).map_err(|e| fail(format!("cannot decode: {e}")))?;
    if !rest.is_empty() {
        return Err(fail(format!("{} bytes after the encoding", rest.len())));
    }
    Ok(p)
}

/// The payload's length as an artifact header gives it: align64(64 + body length) + data length. `None` when
/// the lengths are absurd (beyond u64).
pub(crate) fn payload_len(header: &[u8]) -> Option<u64> {
    let body = u64::from_le_bytes(header[16..24].try_into().expect("8 bytes")) as u128;
    let data = u64::from_le_bytes(header[24..32].try_into().expect("8 bytes")) as u128;
    let len = (HEADER_LEN as u128 + body).div_ceil(64) * 64 + data;
    u64::try_from(len).ok()
}

/// The payload digest of an artifact whose payload is `bytes[..payload_len]`: the blake3 of those bytes with
/// the flags word cleared, i.e. of the file as the linker wrote it, before provenance was stamped on.
pub(crate) fn payload_digest(bytes: &[u8], payload_len: usize) -> Blake3 {
    let mut h = blake3::Hasher::new();
    h.update(&bytes[..FLAGS_AT]);
    h.update(&0u32.to_le_bytes());
    h.update(&bytes[FLAGS_AT + 4..payload_len]);
    Blake3(*h.finalize().as_bytes())
}

/// Writes an artifact with provenance: feed it the payload (an artifact as the linker wrote it, without
/// provenance) through [`Write`], then call [`finish`](Stamper::finish). It streams (the payload's weights are
/// never held twice) and checks what it stamps: the header's magic and version, flags 0, and exactly as many
/// bytes as the header promises.
pub struct Stamper<W: Write> {
    out: W,
    header: Vec<u8>,
    /// Payload bytes passed on so far, header included.
    written: u64,
    /// The payload's length, once the header is complete.
    payload_len: u64,
    section: Vec<u8>,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("stamping provenance: {msg}"))
}

impl<W: Write> Stamper<W> {
    /// A stamper writing to `out`, recording `p`.
    pub fn new(out: W, p: &Provenance) -> io::Result<Stamper<W>> {
        let section = encode_section(p).map_err(|e| invalid(format!("cannot encode the provenance: {e}")))?;
        Ok(Stamper { out, header: Vec::with_capacity(HEADER_LEN), written: 0, payload_len: 0, section })
    }

    /// The bytes the stamped file has beyond the payload.
    pub fn section_len(&self) -> u64 {
        self.section.len() as u64
    }

    /// Checks the complete header and writes it with [`FLAG_PROVENANCE`] set.
    fn header_done(&mut self) -> io::Result<()> {
        let h = &mut self.header;
        if h[..8] != MAGIC {
            return Err(invalid("the payload is not a tessera artifact (bad magic)".into()));
        }
        let version = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
        if version != FORMAT_VERSION && version != BATCHED_FORMAT_VERSION {
            return Err(invalid(format!("the payload is format version {version}, this tessera writes versions {FORMAT_VERSION} and {BATCHED_FORMAT_VERSION}")));
        }
        let flags = u32::from_le_bytes(h[FLAGS_AT..FLAGS_AT + 4].try_into().expect("4 bytes"));
        if flags != 0 {
            return Err(invalid(format!("the payload's flags are {flags:#x}: it already carries provenance, or is not as the linker wrote it")));
        }
        self.payload_len = payload_len(h).ok_or_else(|| invalid("the payload's header promises more than 2^64 bytes".into()))?;
        h[FLAGS_AT..FLAGS_AT + 4].copy_from_slice(&FLAG_PROVENANCE.to_le_bytes());
        self.out.write_all(h)
    }

    /// Appends the section after checking the whole payload came; returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        if self.header.len() < HEADER_LEN || self.written != self.payload_len {
            return Err(invalid(format!("the payload is {} bytes, its header promises {}", self.written, self.payload_len.max(HEADER_LEN as u64))));
        }
        self.out.write_all(&self.section)?;
        Ok(self.out)
    }
}

impl<W: Write> Write for Stamper<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.header.len() < HEADER_LEN {
            let n = (HEADER_LEN - self.header.len()).min(buf.len());
            self.header.extend_from_slice(&buf[..n]);
            self.written += n as u64;
            if self.header.len() == HEADER_LEN {
                self.header_done()?;
            }
            return Ok(n);
        }
        if self.written + buf.len() as u64 > self.payload_len {
            return Err(invalid(format!("the payload is longer than the {} bytes its header promises", self.payload_len)));
        }
        self.out.write_all(buf)?;
        self.written += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// `payload` (an artifact as the linker wrote it) with `p` stamped on, in memory.
pub fn with_provenance(payload: &[u8], p: &Provenance) -> io::Result<Vec<u8>> {
    let mut s = Stamper::new(Vec::with_capacity(payload.len() + 256), p)?;
    s.write_all(payload)?;
    s.finish()
}

#[cfg(test)]
#[path = "provenance_tests.rs"]
mod tests;
