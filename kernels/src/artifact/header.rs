//! The fixed 64-byte header and the framing of body and data section (layout in the parent module's docs).

use super::provenance::{decode_section, payload_len, Provenance, FLAG_PROVENANCE};
use super::{align_up, ArtifactErrorKind, BatchedBody, Body};

/// First 8 bytes of every artifact. The 0x1a (DOS end-of-file) stops `type`/`more` from dumping the binary.
pub const MAGIC: [u8; 8] = *b"TESSERA\x1a";
/// Version of the payload's layout (header, body, data section) and the body encoding; bump on any change to
/// either. The provenance section is announced by a header flag and has its own version
/// ([`super::provenance::PROVENANCE_VERSION`]): adding it left every payload's bytes as they were.
pub const FORMAT_VERSION: u32 = 3;
/// Version of a payload holding several plans, one per batch size (see [`super::batched`]): the same header,
/// padding and data section as [`FORMAT_VERSION`], the body a postcard [`BatchedBody`]
/// instead of one [`Body`]. A version of its own rather than a flag: a runtime that reads only single plans
/// refuses such a file by its version, and single-plan files keep every byte they had. Bump both versions on
/// any change to the body encoding.
pub const BATCHED_FORMAT_VERSION: u32 = 4;
/// Size of the header; the body starts here.
pub const HEADER_LEN: usize = 64;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Writes header, body, padding and the data section.
pub fn encode(body: &Body, data: &[u8]) -> Result<Vec<u8>, postcard::Error> {
    Ok(frame(FORMAT_VERSION, &postcard::to_stdvec(body)?, data))
}

/// Writes a payload of several plans (version [`BATCHED_FORMAT_VERSION`]); the caller validated it.
pub(crate) fn encode_batched(body: &BatchedBody, data: &[u8]) -> Result<Vec<u8>, postcard::Error> {
    Ok(frame(BATCHED_FORMAT_VERSION, &postcard::to_stdvec(body)?, data))
}

/// Header, an encoded body, padding and the data section, with the header's lengths and digest.
fn frame(version: u32, encoded: &[u8], data: &[u8]) -> Vec<u8> {
    let data_start = align_up((HEADER_LEN + encoded.len()) as u64) as usize;
    let mut out = Vec::with_capacity(data_start + data.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(encoded.len() as u64).to_le_bytes());
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    out.extend_from_slice(&[0; 32]);
    debug_assert_eq!(out.len(), HEADER_LEN);
    out.extend_from_slice(encoded);
    out.resize(data_start, 0);
    out.extend_from_slice(data);
    let digest = blake3::hash(&out[HEADER_LEN..]);
    out[32..64].copy_from_slice(digest.as_bytes());
    out
}

/// A decoded file: its plans, its data section, and its provenance when the header says one follows.
pub(crate) struct Decoded<'a> {
    /// One body (version [`FORMAT_VERSION`]), or one per batch size (version [`BATCHED_FORMAT_VERSION`]).
    pub plans: Vec<Body>,
    /// The batch size of each plan of a version-4 file; empty for a single plan.
    pub batches: Vec<u64>,
    pub data: &'a [u8],
    /// Where the payload ends (the data section's end): the section, if any, starts here.
    pub payload_len: usize,
    pub provenance: Option<Provenance>,
}

/// Checks the header, lengths and digest, then decodes the body, and the provenance section when the header's
/// [`FLAG_PROVENANCE`] says one follows. Every header byte is checked (magic, version, known flags, exact
/// lengths, digest), so any change to it is detected.
pub(crate) fn decode(bytes: &[u8]) -> Result<Decoded<'_>, ArtifactErrorKind> {
    if bytes.len() < HEADER_LEN {
        // A prefix of the magic is still worth telling apart from a file that is something else.
        if bytes.len() < MAGIC.len() && !MAGIC.starts_with(bytes) || bytes.len() >= MAGIC.len() && bytes[..8] != MAGIC {
            return Err(ArtifactErrorKind::BadMagic);
        }
        return Err(ArtifactErrorKind::TooShort { len: bytes.len() });
    }
    if bytes[..8] != MAGIC {
        return Err(ArtifactErrorKind::BadMagic);
    }
    let version = u32_at(bytes, 8);
    if version != FORMAT_VERSION && version != BATCHED_FORMAT_VERSION {
        return Err(ArtifactErrorKind::Version { found: version });
    }
    let flags = u32_at(bytes, 12);
    if flags & !FLAG_PROVENANCE != 0 {
        return Err(ArtifactErrorKind::Flags(flags));
    }
    let stamped = flags & FLAG_PROVENANCE != 0;
    let body_len = u64_at(bytes, 16);
    let actual = bytes.len() as u64;
    // `None`: lengths beyond u64 (a corrupted header); never equal to a real file's length.
    let payload_len = payload_len(bytes);
    match payload_len {
        // A stamped file ending exactly at the payload is refused below, naming the missing section.
        Some(p) if p == actual || stamped && p < actual => {}
        _ => return Err(ArtifactErrorKind::Length { expected: payload_len.unwrap_or(u64::MAX), actual }),
    }
    let payload_len = payload_len.expect("checked above") as usize;
    if blake3::hash(&bytes[HEADER_LEN..payload_len]).as_bytes() != &bytes[32..64] {
        return Err(ArtifactErrorKind::Digest);
    }
    let body_end = HEADER_LEN + body_len as usize;
    let data_start = align_up(body_end as u64) as usize;
    if bytes[body_end..data_start].iter().any(|&b| b != 0) {
        return Err(ArtifactErrorKind::Invalid("non-zero padding between body and data".into()));
    }
    let encoded = &bytes[HEADER_LEN..body_end];
    let (plans, batches) = if version == FORMAT_VERSION {
        (vec![take_all::<Body>(encoded)?], Vec::new())
    } else {
        let b = take_all::<BatchedBody>(encoded)?;
        b.plans.into_iter().map(|p| (p.body, p.batch)).unzip()
    };
    let provenance = match stamped {
        false => None,
        true if payload_len == bytes.len() => {
            return Err(ArtifactErrorKind::Provenance("the header announces one, but the file ends with the data section (truncated)".into()))
        }
        true => Some(decode_section(&bytes[payload_len..])?),
    };
    Ok(Decoded { plans, batches, data: &bytes[data_start..payload_len], payload_len, provenance })
}

/// Decodes a whole body: nothing may follow the encoding.
fn take_all<T: serde::de::DeserializeOwned>(encoded: &[u8]) -> Result<T, ArtifactErrorKind> {
    let (value, rest) = postcard::take_from_bytes::<T>(encoded).map_err(ArtifactErrorKind::Decode)?;
    if !rest.is_empty() {
        return Err(ArtifactErrorKind::Invalid(format!("{} bytes after the body", rest.len())));
    }
    Ok(value)
}

#[cfg(test)]
#[path = "header_tests.rs"]
mod tests;
