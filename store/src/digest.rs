//! blake3 digests: how objects, keys and constants are named everywhere in tessera.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A 32-byte blake3 digest, shown as 64 lower-case hex characters.
///
/// Serialized as a 64-character hex string for human-readable formats (JSON: `compile --json`, reports,
/// shard summaries) and as its 32 raw bytes for the others (postcard), exactly as the derived
/// implementation did: postcard encodings of digests are hashed into every stage key, so that encoding must
/// never change (`postcard_bytes_are_pinned` below).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(pub [u8; 32]);

/// The binary encoding: what `#[derive(Serialize, Deserialize)]` on `Digest` produced (a newtype named
/// `Digest` around a 32-element byte tuple), kept byte for byte.
#[derive(Serialize, Deserialize)]
#[serde(rename = "Digest")]
struct RawDigest([u8; 32]);

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.serialize_str(&self.to_hex())
        } else {
            RawDigest(self.0).serialize(s)
        }
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if d.is_human_readable() {
            d.deserialize_any(HexVisitor)
        } else {
            RawDigest::deserialize(d).map(|r| Digest(r.0))
        }
    }
}

/// Reads a digest from a human-readable format: a 64-character hex string, or (what tessera wrote before
/// digests were hex there, e.g. an older shard summary) an array of 32 byte values.
struct HexVisitor;

impl<'de> serde::de::Visitor<'de> for HexVisitor {
    type Value = Digest;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a digest: 64 hex characters (or an array of 32 bytes)")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Digest, E> {
        v.parse().map_err(E::custom)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Digest, A::Error> {
        let mut out = [0u8; 32];
        for (i, b) in out.iter_mut().enumerate() {
            *b = seq.next_element()?.ok_or_else(|| serde::de::Error::invalid_length(i, &self))?;
        }
        if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
            return Err(serde::de::Error::invalid_length(33, &self));
        }
        Ok(Digest(out))
    }
}

impl Digest {
    /// Digest of a byte string.
    pub fn of(bytes: &[u8]) -> Self {
        Digest(*blake3::hash(bytes).as_bytes())
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    /// The first 12 hex characters, for reports.
    pub fn short(&self) -> String {
        self.to_hex()[..12].to_string()
    }
}

impl From<blake3::Hash> for Digest {
    fn from(h: blake3::Hash) -> Self {
        Digest(*h.as_bytes())
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.short())
    }
}

/// A string that is not 64 hex characters.
#[derive(Debug, thiserror::Error)]
#[error("'{0}' is not a digest (64 hex characters)")]
pub struct ParseDigestError(pub String);

impl FromStr for Digest {
    type Err = ParseDigestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ParseDigestError(s.to_string()));
        }
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| ParseDigestError(s.to_string()))?;
        }
        Ok(Digest(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postcard_bytes_are_pinned() {
        // Postcard encodings of digests are hashed into every stage key: these bytes must never change.
        let d = Digest(std::array::from_fn(|i| (i * 7 + 200) as u8));
        let bytes = postcard::to_allocvec(&d).unwrap();
        assert_eq!(bytes, d.0.to_vec(), "a digest is its 32 raw bytes in postcard, no length, no tag");
        let d = Digest::of(b"tessera");
        assert_eq!(postcard::to_allocvec(&d).unwrap(), d.as_bytes().to_vec());
        assert_eq!(postcard::from_bytes::<Digest>(&bytes_of(&d)).unwrap(), d);
        // Inside a structure and an option, as keys and records hold them: still the raw bytes, where the
        // derived implementation put them.
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Rec {
            n: u8,
            d: Digest,
            o: Option<Digest>,
            v: Vec<Digest>,
        }
        let r = Rec { n: 5, d, o: Some(d), v: vec![d] };
        let mut want = vec![5u8];
        want.extend_from_slice(d.as_bytes());
        want.push(1);
        want.extend_from_slice(d.as_bytes());
        want.push(1);
        want.extend_from_slice(d.as_bytes());
        assert_eq!(postcard::to_allocvec(&r).unwrap(), want);
        assert_eq!(postcard::from_bytes::<Rec>(&want).unwrap(), r);
        // And what the derive wrote: a newtype around [u8; 32].
        #[derive(Serialize)]
        struct Derived([u8; 32]);
        assert_eq!(postcard::to_allocvec(&Derived(d.0)).unwrap(), postcard::to_allocvec(&d).unwrap());
    }

    fn bytes_of(d: &Digest) -> Vec<u8> {
        d.as_bytes().to_vec()
    }

    #[test]
    fn json_is_hex_and_round_trips() {
        let d = Digest::of(b"tessera");
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, format!("\"{}\"", d.to_hex()));
        assert_eq!(json.len(), 66);
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), d);
        // Inside a structure.
        let v = serde_json::to_value(std::collections::BTreeMap::from([("digest", d)])).unwrap();
        assert_eq!(v["digest"], serde_json::Value::String(d.to_hex()));
        // Upper-case hex reads too; what tessera wrote before (an array of 32 bytes) still reads.
        assert_eq!(serde_json::from_str::<Digest>(&json.to_uppercase()).unwrap(), d);
        assert_eq!(serde_json::from_str::<Digest>(&serde_json::to_string(&d.0).unwrap()).unwrap(), d);
        // Bad input says what a digest is.
        for bad in ["\"abc\"", "3", "[1, 2]", &serde_json::to_string(&vec![0u8; 33]).unwrap(), "[256, 0]"] {
            let e = serde_json::from_str::<Digest>(bad).unwrap_err().to_string();
            assert!(e.contains("digest") || e.contains("u8") || e.contains("256"), "{bad}: {e}");
        }
    }

    #[test]
    fn hex_round_trip() {
        let d = Digest::of(b"tessera");
        assert_eq!(d.to_hex().parse::<Digest>().unwrap(), d);
        assert!("xyz".parse::<Digest>().is_err());
    }
}
