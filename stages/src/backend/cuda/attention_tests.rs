use super::*;

#[test]
fn tiles_are_valid_and_chosen_by_problem_size() {
    for t in [AttnTiles::default(), MID_TILES, SMALL_TILES] {
        t.check().unwrap();
    }
    assert!(AttnTiles { bq: 60, bk: 64, threads: 256 }.check().is_err(), "bq not a multiple of the warps");
    assert!(AttnTiles { bq: 64, bk: 48, threads: 256 }.check().is_err(), "bk not a multiple of 32");
    assert!(AttnTiles { bq: 64, bk: 64, threads: 100 }.check().is_err(), "threads not whole warps");
    // Large batches take the large tile; BERT-base batch 1 (12 heads x 128) takes the smallest.
    assert_eq!(AttnTiles::for_problem(8 * 12, 512), AttnTiles::default());
    assert_eq!(AttnTiles::for_problem(12, 128), SMALL_TILES);
    // A single query row never takes a tile of 64 rows, however many matrices.
    assert_eq!(AttnTiles::for_problem(100_000, 1), SMALL_TILES);
}

#[test]
fn shared_layout_is_aligned_and_sized() {
    for (t, d, dv) in [(AttnTiles::default(), 64, 64), (SMALL_TILES, 80, 80), (MID_TILES, 5, 3), (AttnTiles::default(), 128, 128)] {
        let l = Layout::new(t, d, dv);
        assert_eq!(l.dq % 4, 0);
        assert!(l.dq >= d && l.dvp >= dv && l.dvp % 32 == 0);
        assert_eq!(l.k_at, t.bq as usize * l.dq);
        assert!(l.v_at >= l.k_at + l.dq * l.ks && l.p_at == l.v_at + t.bk as usize * l.dvp);
        for off in [l.k_at, l.v_at, l.p_at] {
            assert_eq!(off % 4, 0, "float4 alignment of {off}");
        }
        assert!(l.bytes() <= MAX_SHARED_BYTES as usize, "{t:?} {d} {dv}: {}", l.bytes());
    }
    // D = Dv = 64 at the default tile: Q 16 KiB, K 16.25 KiB, V 16 KiB, P 16 KiB.
    assert_eq!(Layout::new(AttnTiles::default(), 64, 64).bytes(), 4 * (64 * 64 + 64 * 65 + 64 * 64 + 64 * 64));
}

#[test]
fn mask_offsets_skip_broadcast_axes() {
    assert_eq!(at2(0, 1), "j * 1u");
    assert_eq!(at2(9, 0), "r * 9u");
    assert_eq!(at2(0, 0), "0u");
    assert_eq!(matrix_strides(&[2, 1, 5, 4], &[2, 3]), vec![20, 0]);
    assert_eq!(matrix_strides(&[5, 4], &[2, 3]), vec![0, 0]);
}
