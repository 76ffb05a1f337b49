// Each test binary that includes this module uses part of it.
#![allow(dead_code)]
//! Which GPU toolchains are here, for the end-to-end tests that need one without needing a GPU.

/// Whether NVRTC is here (the `cuda` backend plans and builds only where it can compile). CI installs it and
/// sets TESSERA_REQUIRE_NVRTC, so there a missing NVRTC fails instead of skipping; elsewhere the test says it
/// skipped and why (`what`: what cannot be done without it).
pub fn nvrtc_here(what: &str) -> bool {
    match tessera_kernels::runtime::cuda::libs::toolkit() {
        Ok(_) => true,
        Err(why) if std::env::var_os("TESSERA_REQUIRE_NVRTC").is_some() => panic!("TESSERA_REQUIRE_NVRTC is set and NVRTC is not here: {why}"),
        Err(why) => {
            eprintln!("SKIPPED: no NVRTC here ({why}); {what}");
            false
        }
    }
}
