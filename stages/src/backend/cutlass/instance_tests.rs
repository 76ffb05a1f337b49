use super::*;

#[test]
fn alignments_are_the_widest_dividing_access() {
    assert_eq!(alignment(Element::F16, 768), Some(8));
    assert_eq!(alignment(Element::F16, 12), Some(4));
    assert_eq!(alignment(Element::F16, 6), Some(2));
    assert_eq!(alignment(Element::F16, 7), None, "cp.async cannot copy one half");
    assert_eq!(alignment(Element::F32, 7), Some(1));
    assert_eq!(alignment(Element::F32, 1000), Some(1));
}

#[test]
fn tiles_split_into_whole_warps_and_fit_shared_memory() {
    for e in [Element::F16, Element::F32] {
        let names: std::collections::BTreeSet<String> = tiles(e).iter().map(|t| t.name()).collect();
        assert_eq!(names.len(), tiles(e).len(), "configuration names are distinct");
        for t in tiles(e) {
            for i in 0..3 {
                assert_eq!(t.threadblock[i] % t.warp[i], 0, "{}", t.name());
            }
            assert!(t.threads() >= 64 && t.threads() <= 512, "{}", t.name());
            assert!(t.shared_bytes(e) <= tessera_kernels::runtime::cuda::format::MAX_SHARED_BYTES, "{}", t.name());
        }
    }
}

#[test]
fn a_declaration_names_every_template_argument() {
    let g = Gemm { element: Element::F16, tile: HALF_TILES[0], align_a: 8, align_b: 8, align_c: 8, activation: Activation::Gelu };
    let d = g.declaration();
    assert!(d.starts_with("using gemm_f16_128x128x32_64x64x32_s4_a888_gelu = cutlass::gemm::device::GemmBatched<"), "{d}");
    assert!(d.contains("GemmShape<16, 8, 16>") && d.contains("cutlass::epilogue::thread::GELU, cutlass::half_t, 8, float, float") && d.contains("== 65536"), "{d}");
}
