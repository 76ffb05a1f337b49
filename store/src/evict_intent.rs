//! The eviction's intent file (`EVICTING`, evict.rs's "crash safety"): the digests an eviction is about to
//! delete, written before its entries go and removed after its objects are gone, and the finishing of an
//! eviction a crash interrupted, which a writable open runs ([`finish_interrupted`]). Below the store (store.rs), which calls it at open;
//! evict.rs, above the store, writes and clears the file.

use crate::error::{Result, StoreError};
use crate::index::Index;
use crate::layout::{fsync_dir, write_atomically, Layout};
use crate::objects::LocalObjects;
use crate::Digest;
use std::collections::BTreeSet;
use std::fs;

/// Finishes an eviction a crash interrupted: deletes the objects `EVICTING` lists that no memo entry and
/// no root names now, then the file. Called by a writable open after the journal replay; returns how many
/// objects it deleted, or `None` when no eviction was interrupted.
pub(crate) fn finish_interrupted(layout: &Layout, index: &Index, objects: &LocalObjects) -> Result<Option<usize>> {
    let path = layout.evict_intent();
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io("reading the interrupted eviction's list", &path)(e)),
    };
    let (memo, bad_memo) = index.memo_all()?;
    let (roots, bad_roots) = index.roots()?;
    let mut doomed = Vec::new();
    // With records that do not decode, what they name is unknown: keep everything (plain gc or
    // `verify --repair` sorts it out later); the file is written whole or not at all (renamed into place).
    if bad_memo.is_empty() && bad_roots.is_empty() {
        let named: BTreeSet<Digest> =
            memo.iter().map(|m| m.entry.output).chain(roots.into_values().flatten()).collect();
        doomed = text
            .lines()
            .filter_map(|l| l.trim().parse::<Digest>().ok())
            .filter(|d| !named.contains(d) && objects.contains(d))
            .collect();
    }
    remove_objects(objects, &doomed)?;
    clear_intent(layout)?;
    Ok(Some(doomed.len()))
}

/// Deletes objects and fsyncs the fan-out directories they were in.
pub(crate) fn remove_objects(objects: &LocalObjects, doomed: &[Digest]) -> Result<()> {
    let mut fans = BTreeSet::new();
    for d in doomed {
        objects.remove(d)?;
        if let Some(parent) = objects.path_of(d).parent() {
            fans.insert(parent.to_path_buf());
        }
    }
    for f in &fans {
        fsync_dir(f)?;
    }
    Ok(())
}

pub(crate) fn write_intent(layout: &Layout, doomed: &[Digest]) -> Result<()> {
    let mut text = String::with_capacity(doomed.len() * 65);
    for d in doomed {
        text.push_str(&d.to_hex());
        text.push('\n');
    }
    write_atomically(layout, &layout.evict_intent(), text.as_bytes())
}

pub(crate) fn clear_intent(layout: &Layout) -> Result<()> {
    let path = layout.evict_intent();
    match fs::remove_file(&path) {
        Ok(()) => fsync_dir(&layout.dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::io("removing the eviction's list", &path)(e)),
    }
}
