use super::*;

/// A build root that cannot hold folders (here a file) falls back to a private folder: the compile works.
#[test]
fn an_unusable_build_root_falls_back_to_a_private_folder() {
    let Ok(tools) = toolchain() else {
        assert!(std::env::var_os("TESSERA_REQUIRE_CUTLASS").is_none(), "TESSERA_REQUIRE_CUTLASS is set but the toolchain is missing");
        eprintln!("skipping: no nvcc and CUTLASS here");
        return;
    };
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("a-file");
    std::fs::write(&root, b"").unwrap();
    let target = Target::parse("cuda -compiler=cutlass").unwrap();
    let cubin = tools.compile_under(&root, &arch(&target), "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] = 1.0f; }\n").unwrap();
    assert_eq!(&cubin[..4], b"\x7fELF");
}
