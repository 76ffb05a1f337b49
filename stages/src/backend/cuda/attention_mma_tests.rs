use super::*;

#[test]
fn tiles_are_valid_and_chosen_by_problem_size() {
    let t = |warps, bk, split| MmaTiles { warps, bk, split };
    assert!(t(4, 64, 1).check().is_ok() && t(1, 32, 4).check().is_ok() && t(2, 64, 4).check().is_ok());
    assert!(t(0, 64, 1).check().is_err());
    assert!(t(4, 40, 1).check().is_err(), "bk not a multiple of 16");
    assert!(t(4, 64, 4).check().is_err(), "16 warps");
    assert!(t(1, 128, 4).check().is_err(), "512 keys a round");
    // BERT-base batch 8 (96 matrices of 128 rows) fills the GPU with two warps per block; batch 1 needs one,
    // its 128 keys split in four; a decode step (one query) splits its keys too.
    assert_eq!(MmaTiles::for_problem(96, 128, 128), t(2, 64, 1));
    assert_eq!(MmaTiles::for_problem(12, 128, 128), t(1, 32, 4));
    assert_eq!(MmaTiles::for_problem(12, 197, 197), t(1, 32, 4));
    assert_eq!(MmaTiles::for_problem(12, 1, 40), t(1, 32, 2));
    assert_eq!(MmaTiles::for_problem(12 * 64, 512, 512).warps, 4);
    assert_eq!(t(1, 32, 4).threads(), 128);
}

#[test]
fn applies_to_fp16_and_bf16_with_small_head_dims_only() {
    for h in [[DType::F16; 3], [DType::BF16; 3]] {
        assert!(applies(h, 64, 64) && applies(h, 5, 3) && applies(h, 128, 128));
        assert!(!applies(h, 129, 64) && !applies(h, 64, 256) && !applies(h, 0, 64));
    }
    assert!(!applies([DType::F32, DType::F16, DType::F16], 64, 64));
    assert!(!applies([DType::BF16, DType::F16, DType::F16], 64, 64), "one type throughout");
}

#[test]
fn shared_layout_is_aligned_and_sized() {
    for (d, dv) in [(64, 64), (5, 3), (80, 80), (128, 128)] {
        for transposed in [false, true] {
            let t = MmaTiles { warps: 1, bk: 32, split: 4 };
            let l = Layout::new(t, d, dv, transposed);
            assert!(l.dp >= d && l.dp % 16 == 0 && l.dvp >= dv && l.dvp % 16 == 0);
            // Rows 16-byte aligned (ldmatrix, cp.async), V and the second stage too.
            for at in [l.ldk, l.ldv, l.v_at, l.stage] {
                assert_eq!(at % 8, 0, "{d} {dv} {transposed}: {l:?}");
            }
            assert!(l.bytes(t) <= 227 * 1024, "{d} {dv}: {} bytes", l.bytes(t));
            // The slices' partial results fit where the stages were.
            assert!(l.bytes(t) == 2 * l.stage * 2 || dv > 64, "{d} {dv}: {l:?}");
        }
    }
    // Two stages of K (64 keys x 64 dims, rows padded to 72) and V (the same).
    let t = MmaTiles { warps: 4, bk: 64, split: 1 };
    assert_eq!(Layout::new(t, 64, 64, false).bytes(t), 2 * 2 * (64 * 72 + 64 * 72));
    // K transposed: 64 dims x 64 keys, rows padded to 72.
    assert_eq!(Layout::new(t, 64, 64, true).bytes(t), 2 * 2 * (64 * 72 + 64 * 72));
    // Four slices of 32 keys: rounds of 128 keys; three slices' partials (32 lanes x 36 floats each).
    let t = MmaTiles { warps: 1, bk: 32, split: 4 };
    assert_eq!(Layout::new(t, 64, 64, false).bytes(t), 2 * 2 * (128 * 72 + 128 * 72));
    assert_eq!(Layout::partial_bytes(t, 64), 3 * 32 * 36 * 4);
}
