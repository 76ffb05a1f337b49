//! blake3 digests: how objects, keys and constants are named everywhere in tessera.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A 32-byte blake3 digest, shown as 64 lower-case hex characters.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Digest(pub [u8; 32]);

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
    fn hex_round_trip() {
        let d = Digest::of(b"tessera");
        assert_eq!(d.to_hex().parse::<Digest>().unwrap(), d);
        assert!("xyz".parse::<Digest>().is_err());
    }
}
