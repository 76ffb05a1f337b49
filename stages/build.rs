//! Embeds the digests of this crate's source units (`src/code/units.rs`), so every stage's and backend's
//! code version follows its source (see `src/code/mod.rs`).

#[path = "src/code/units.rs"]
mod units;

fn main() {
    if let Err(e) = tessera_source_digest::emit(units::UNITS) {
        panic!("tessera-stages build script: digesting the source units: {e}");
    }
}
