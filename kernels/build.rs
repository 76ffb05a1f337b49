//! Embeds the digests of this crate's source units (`src/code/units.rs`): the compiler's keys for linking and
//! measuring follow this code (see `src/code/mod.rs`).

#[path = "src/code/units.rs"]
mod units;

fn main() {
    if let Err(e) = tessera_source_digest::emit(units::UNITS) {
        panic!("tessera-kernels build script: digesting the source units: {e}");
    }
}
