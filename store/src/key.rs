//! Memo keys: the one place where everything that decides a stage's output is hashed.
//!
//! A key is `blake3(KEY_FORMAT, stage name, stage code version, every named input, every named
//! environment fact)`, in the style of sccache's `HashKeyParams`: each stage lists its ingredients in
//! one builder chain, so a reviewer can check the list against what the stage reads.
//!
//! Why each ingredient is framed (kind tag, name length, name, value digest) rather than concatenated:
//! without lengths `input("ab", "c")` and `input("a", "bc")` would hash alike, and an input could alias an
//! environment fact with the same bytes. Each value is hashed on its own first, which also makes
//! [`KeyBuilder::finish_explained`] able to show which ingredient changed between two runs.
//!
//! Values are encoded canonically with postcard (a documented, stable wire format). Nothing hashed may
//! contain a `HashMap`/`HashSet` (iteration order varies between runs): use `BTreeMap` or sorted `Vec`s.

use crate::error::{Result, StoreError};
use crate::Digest;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Version of the key layout itself. Bump it when this module changes how keys are framed, so that
/// every old key misses (sccache's `CACHE_VERSION`). Stages have their own version: see [`KeyBuilder::new`].
pub const KEY_FORMAT_VERSION: u32 = 1;

/// Encodes a value canonically (postcard), the encoding used for everything that is hashed.
pub fn canonical_bytes<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    postcard::to_allocvec(value)
        .map_err(|cause| StoreError::Encode { what: std::any::type_name::<T>().to_string(), cause })
}

/// The digest of a value's canonical encoding.
pub fn canonical_digest<T: Serialize + ?Sized>(value: &T) -> Result<Digest> {
    Ok(Digest::of(&canonical_bytes(value)?))
}

/// What part an ingredient plays in a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum IngredientKind {
    /// The canonical input the stage computes on (graph, targets, partitions...).
    Input,
    /// A fact about the environment the output depends on (toolkit version, device fingerprint...).
    Env,
}

/// One named ingredient of a key, with the digest of its canonical value: what `finish_explained` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ingredient {
    pub kind: IngredientKind,
    pub name: String,
    pub value: Digest,
}

/// A computed key with the list of what went into it, for "why did this miss" reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyExplained {
    pub key: Digest,
    pub stage: String,
    pub stage_version: u32,
    pub ingredients: Vec<Ingredient>,
}

/// Builds a memo key. Ingredients are hashed in the order they are listed; a name may appear once per
/// kind. Encoding errors are kept and reported by [`finish`](Self::finish), so the chain stays readable:
///
/// ```
/// use tessera_store::KeyBuilder;
/// let key = KeyBuilder::new("partition", 3)
///     .input("graph", &vec![1u32, 2, 3])
///     .env("nvrtc", "12.4")
///     .finish()
///     .unwrap();
/// println!("{key}");
/// ```
#[derive(Debug)]
pub struct KeyBuilder {
    stage: String,
    stage_version: u32,
    ingredients: Vec<Ingredient>,
    names: BTreeSet<(IngredientKind, String)>,
    error: Option<StoreError>,
}

impl KeyBuilder {
    /// Starts a key for `stage` at code version `stage_version`. Bump the stage's version whenever its
    /// code changes what it outputs for the same inputs.
    pub fn new(stage: &str, stage_version: u32) -> Self {
        let error = if stage.is_empty() {
            Some(StoreError::InvalidName { what: "stage name", value: String::new(), reason: "must not be empty" })
        } else {
            None
        };
        KeyBuilder { stage: stage.to_string(), stage_version, ingredients: Vec::new(), names: BTreeSet::new(), error }
    }

    /// Adds a named input, encoded canonically with postcard.
    pub fn input<T: Serialize + ?Sized>(self, name: &str, value: &T) -> Self {
        self.add_encoded(IngredientKind::Input, name, value)
    }

    /// Adds a named input given as bytes that are already canonical (e.g. a structural graph encoding).
    pub fn input_bytes(self, name: &str, bytes: &[u8]) -> Self {
        self.add_digest(IngredientKind::Input, name, Digest::of(bytes))
    }

    /// Adds a named input given by its digest (an object already in the store, a constant's content digest).
    pub fn input_digest(self, name: &str, digest: &Digest) -> Self {
        self.add_digest(IngredientKind::Input, name, *digest)
    }

    /// Adds a named environment fact, encoded canonically with postcard.
    pub fn env<T: Serialize + ?Sized>(self, name: &str, value: &T) -> Self {
        self.add_encoded(IngredientKind::Env, name, value)
    }

    fn add_encoded<T: Serialize + ?Sized>(self, kind: IngredientKind, name: &str, value: &T) -> Self {
        match canonical_digest(value) {
            Ok(d) => self.add_digest(kind, name, d),
            Err(e) => self.fail(e),
        }
    }

    fn add_digest(mut self, kind: IngredientKind, name: &str, value: Digest) -> Self {
        if self.error.is_some() {
            return self;
        }
        if name.is_empty() {
            return self.fail(StoreError::InvalidName {
                what: "key ingredient name",
                value: String::new(),
                reason: "must not be empty",
            });
        }
        if !self.names.insert((kind, name.to_string())) {
            return self.fail(StoreError::InvalidName {
                what: "key ingredient name",
                value: name.to_string(),
                reason: "is listed twice for this key",
            });
        }
        self.ingredients.push(Ingredient { kind, name: name.to_string(), value });
        self
    }

    fn fail(mut self, e: StoreError) -> Self {
        if self.error.is_none() {
            self.error = Some(e);
        }
        self
    }

    /// The key.
    pub fn finish(self) -> Result<Digest> {
        Ok(self.finish_explained()?.key)
    }

    /// The key and the list of ingredients that made it.
    pub fn finish_explained(self) -> Result<KeyExplained> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let key = frame_key(KEY_FORMAT_VERSION, &self.stage, self.stage_version, &self.ingredients);
        Ok(KeyExplained { key, stage: self.stage, stage_version: self.stage_version, ingredients: self.ingredients })
    }
}

impl Clone for KeyBuilder {
    /// A builder can be cloned to share a common prefix of ingredients between keys.
    fn clone(&self) -> Self {
        // Only name and encoding errors are ever deferred here, and both are plain data.
        let error = self.error.as_ref().map(|e| match e {
            StoreError::Encode { what, cause } => StoreError::Encode { what: what.clone(), cause: cause.clone() },
            StoreError::InvalidName { what, value, reason } => {
                StoreError::InvalidName { what, value: value.clone(), reason }
            }
            other => StoreError::InvalidName { what: "key", value: other.to_string(), reason: "could not be built" },
        });
        KeyBuilder {
            stage: self.stage.clone(),
            stage_version: self.stage_version,
            ingredients: self.ingredients.clone(),
            names: self.names.clone(),
            error,
        }
    }
}

/// The framing of a key: every field tagged and length-delimited.
fn frame_key(format: u32, stage: &str, stage_version: u32, ingredients: &[Ingredient]) -> Digest {
    let mut h = blake3::Hasher::new_derive_key("tessera memo key");
    h.update(&format.to_le_bytes());
    put_str(&mut h, stage);
    h.update(&stage_version.to_le_bytes());
    h.update(&(ingredients.len() as u64).to_le_bytes());
    for ing in ingredients {
        h.update(&[match ing.kind {
            IngredientKind::Input => b'I',
            IngredientKind::Env => b'E',
        }]);
        put_str(&mut h, &ing.name);
        h.update(ing.value.as_bytes());
    }
    h.finalize().into()
}

fn put_str(h: &mut blake3::Hasher, s: &str) {
    h.update(&(s.len() as u64).to_le_bytes());
    h.update(s.as_bytes());
}

#[cfg(test)]
mod tests {
    //! One test per ingredient: changing it must change the key (sccache's discipline).
    use super::*;
    use std::collections::BTreeMap;

    fn base() -> KeyBuilder {
        KeyBuilder::new("partition", 3).input("graph", &vec![1u32, 2, 3]).env("nvrtc", "12.4")
    }

    fn key(b: KeyBuilder) -> Digest {
        b.finish().unwrap()
    }

    #[test]
    fn same_ingredients_same_key() {
        assert_eq!(key(base()), key(base()));
    }

    #[test]
    fn stage_name_changes_key() {
        let other = KeyBuilder::new("compile", 3).input("graph", &vec![1u32, 2, 3]).env("nvrtc", "12.4");
        assert_ne!(key(base()), key(other));
    }

    #[test]
    fn stage_version_changes_key() {
        let other = KeyBuilder::new("partition", 4).input("graph", &vec![1u32, 2, 3]).env("nvrtc", "12.4");
        assert_ne!(key(base()), key(other));
    }

    #[test]
    fn input_value_changes_key() {
        let other = KeyBuilder::new("partition", 3).input("graph", &vec![1u32, 2, 4]).env("nvrtc", "12.4");
        assert_ne!(key(base()), key(other));
    }

    #[test]
    fn input_name_changes_key() {
        let other = KeyBuilder::new("partition", 3).input("graph2", &vec![1u32, 2, 3]).env("nvrtc", "12.4");
        assert_ne!(key(base()), key(other));
    }

    #[test]
    fn env_value_changes_key() {
        let other = KeyBuilder::new("partition", 3).input("graph", &vec![1u32, 2, 3]).env("nvrtc", "12.5");
        assert_ne!(key(base()), key(other));
    }

    #[test]
    fn env_name_changes_key() {
        let other = KeyBuilder::new("partition", 3).input("graph", &vec![1u32, 2, 3]).env("cublas", "12.4");
        assert_ne!(key(base()), key(other));
    }

    #[test]
    fn adding_an_ingredient_changes_key() {
        assert_ne!(key(base()), key(base().env("sm_count", &132u32)));
        assert_ne!(key(base()), key(base().input("targets", "cuda")));
    }

    #[test]
    fn key_format_version_changes_key() {
        let e = base().finish_explained().unwrap();
        let v2 = frame_key(KEY_FORMAT_VERSION + 1, &e.stage, e.stage_version, &e.ingredients);
        assert_ne!(e.key, v2);
    }

    #[test]
    fn kind_is_part_of_key() {
        // The same name and value as an input or as an environment fact must not alias.
        let a = KeyBuilder::new("s", 1).input("x", "v");
        let b = KeyBuilder::new("s", 1).env("x", "v");
        assert_ne!(key(a), key(b));
    }

    #[test]
    fn names_and_values_cannot_alias() {
        let a = KeyBuilder::new("s", 1).input_bytes("ab", b"c");
        let b = KeyBuilder::new("s", 1).input_bytes("a", b"bc");
        assert_ne!(key(a), key(b));
        let c = KeyBuilder::new("sa", 1);
        let d = KeyBuilder::new("s", 1).input_bytes("a", b"");
        assert_ne!(key(c), key(d));
    }

    #[test]
    fn btreemap_inputs_are_order_independent() {
        let mut m1 = BTreeMap::new();
        m1.insert("b", 2);
        m1.insert("a", 1);
        let mut m2 = BTreeMap::new();
        m2.insert("a", 1);
        m2.insert("b", 2);
        assert_eq!(key(KeyBuilder::new("s", 1).input("m", &m1)), key(KeyBuilder::new("s", 1).input("m", &m2)));
    }

    #[test]
    fn input_digest_equals_input_bytes() {
        let bytes = b"canonical graph";
        let a = KeyBuilder::new("s", 1).input_bytes("g", bytes);
        let b = KeyBuilder::new("s", 1).input_digest("g", &Digest::of(bytes));
        assert_eq!(key(a), key(b));
    }

    #[test]
    fn bad_names_are_errors() {
        assert!(KeyBuilder::new("", 1).finish().is_err());
        assert!(KeyBuilder::new("s", 1).input("", &1u8).finish().is_err());
        let dup = KeyBuilder::new("s", 1).input("x", &1u8).input("x", &2u8).finish().unwrap_err();
        assert!(dup.to_string().contains("'x'"), "{dup}");
    }

    #[test]
    fn explained_lists_ingredients_in_order() {
        let e = base().finish_explained().unwrap();
        let names: Vec<_> = e.ingredients.iter().map(|i| (i.kind, i.name.as_str())).collect();
        assert_eq!(names, vec![(IngredientKind::Input, "graph"), (IngredientKind::Env, "nvrtc")]);
    }
}
