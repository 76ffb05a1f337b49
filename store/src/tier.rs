//! The two narrow interfaces a second, remote tier would implement (a cache server or object store,
//! shared by many machines), so that adding one is an addition, not a rewrite.
//!
//! The intended composition, as in sccache's multi-level storage: reads fall through local -> remote
//! and back-fill local on a remote hit (objects are content-addressed and verified on arrival, so a
//! remote tier cannot poison the local one); writes go local first, then remote. Nothing in the
//! local store depends on a remote tier existing.

use crate::error::Result;
use crate::memo::MemoEntry;
use crate::objects::{LocalObjects, PutOutcome};
use crate::Digest;
use std::io::{Read, Write};

/// A place objects live. Every implementation must verify content against its digest before handing
/// any byte out.
pub trait ObjectTier: Send + Sync {
    fn contains(&self, d: &Digest) -> bool;
    /// Stores a stream; returns what it hashed to.
    fn put_stream(&self, r: &mut dyn Read) -> Result<PutOutcome>;
    /// Streams a verified object into `w`; `Ok(None)` when this tier does not have it.
    fn get_stream(&self, d: &Digest, w: &mut dyn Write) -> Result<Option<u64>>;
}

/// A place memo entries live.
pub trait MemoTier: Send + Sync {
    fn lookup(&self, stage: &str, key: &Digest) -> Result<Option<MemoEntry>>;
    fn record(&self, stage: &str, key: &Digest, entry: &MemoEntry) -> Result<()>;
}

impl ObjectTier for LocalObjects {
    fn contains(&self, d: &Digest) -> bool {
        LocalObjects::contains(self, d)
    }
    fn put_stream(&self, r: &mut dyn Read) -> Result<PutOutcome> {
        self.put_reader(r)
    }
    fn get_stream(&self, d: &Digest, mut w: &mut dyn Write) -> Result<Option<u64>> {
        if !LocalObjects::contains(self, d) {
            return Ok(None);
        }
        self.get_to_writer(d, &mut w).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{OpenOptions, Store};

    #[test]
    fn local_objects_through_the_trait() {
        let t = tempfile::tempdir().unwrap();
        let s = Store::open(t.path(), OpenOptions::writable()).unwrap();
        let tier: &dyn ObjectTier = s.objects();
        let o = tier.put_stream(&mut &b"via trait"[..]).unwrap();
        let mut out = Vec::new();
        assert_eq!(tier.get_stream(&o.digest, &mut out).unwrap(), Some(9));
        assert_eq!(out, b"via trait");
        assert_eq!(tier.get_stream(&Digest::of(b"no"), &mut out).unwrap(), None);
    }
}
