//! Digests of the runtime's source units, embedded at build time (`build.rs`, `units.rs`): the compiler puts
//! them into the keys of what this code decides (linked artifacts, measurements), so a change here is a
//! cold rebuild of exactly those.

include!(concat!(env!("OUT_DIR"), "/source_digests.rs"));

#[cfg(test)]
mod units;

#[cfg(test)]
mod tests {
    /// The embedded digests are those of the source as it is: the build script ran on this tree.
    #[test]
    fn embedded_digests_match_the_source() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for u in super::units::UNITS {
            let embedded = match u.name {
                "ARTIFACT" => super::ARTIFACT,
                "RUNTIME" => super::RUNTIME,
                other => panic!("unit {other} has no constant here"),
            };
            assert_eq!(tessera_source_digest::digest(root, u.paths).unwrap(), embedded, "unit {}", u.name);
        }
    }
}
