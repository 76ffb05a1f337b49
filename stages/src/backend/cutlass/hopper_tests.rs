use super::*;

fn line_of(launch: usize, bytes: &[u8]) -> String {
    let h: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("launch {launch} grid 132 1 1 block 384 1 1 shared 200000 bytes {h}")
}

/// A probe's output becomes a parameter block: the marker a tensor map, placeholder words pointers to the
/// launch's arguments, bytes that differ between the runs zeros.
#[test]
fn probe_output_becomes_patches() {
    let mut a = vec![0u8; 256];
    a[..8].copy_from_slice(&(PLACEHOLDER + (2 << 40) + 64).to_le_bytes());
    a[128..136].copy_from_slice(MARKER);
    a[8] = 7; // padding: differs below
    let mut b = a.clone();
    b[8] = 9;
    let map = format!("map 0 type 1 address {} interleave 0 swizzle 3 l2 2 oob 0 dims 768 1024 1 strides 1536 1572864 box 64 128 1 element_strides 1 1 1", PLACEHOLDER + (1 << 40));
    let map2 = map.replace("map 0", "map 1");
    let mut b_marked = b.clone();
    b_marked[136] = 1; // the second run's map is number 1
    let out = format!("{map}\n{}\n{map2}\n{}\n", line_of(0, &a), line_of(0, &b_marked));
    let args = vec![vec![LaunchArg { index: 0, offset: 0 }, LaunchArg { index: 1, offset: 0 }, LaunchArg { index: 3, offset: 512 }, LaunchArg { index: 2, offset: 0 }]];
    let got = read_probe(&out, &args).unwrap();
    assert_eq!(got.len(), 1);
    let p = &got[0];
    assert_eq!((p.grid, p.block, p.shared_bytes), ([132, 1, 1], [384, 1, 1], 200000));
    assert_eq!(p.params.pointers, vec![PointerPatch { at: 0, arg: LaunchArg { index: 3, offset: 576 } }]);
    assert_eq!(p.params.tensor_maps.len(), 1);
    let t = &p.params.tensor_maps[0];
    assert_eq!((t.at, t.arg, t.dims.clone(), t.strides.clone(), t.box_dims.clone(), t.swizzle), (128, LaunchArg { index: 1, offset: 0 }, vec![768, 1024, 1], vec![1536, 1572864], vec![64, 128, 1], 3));
    assert!(p.params.bytes.iter().all(|&x| x == 0), "patched places and padding are zero");
    assert!(read_probe("error 0 needs a workspace\n", &args).unwrap_err().to_string().contains("needs a workspace"));
    assert!(read_probe(&format!("{map}\n{}\n", line_of(0, &a)), &args).unwrap_err().to_string().contains("two runs"));
}

#[test]
fn declarations_name_the_schedule_and_the_epilogue() {
    let g = HopperGemm { element: Element::F16, tile: HOPPER_TILES[0], source: Source::Bias, activation: Activation::Gelu };
    let d = g.declaration();
    assert_eq!(g.type_name(), "sm90_pingpong_128x128x64_f16_bias_gelu");
    assert!(d.contains("KernelTmaWarpSpecializedPingpong") && d.contains("LinCombPerColBiasEltAct<cutlass::epilogue::thread::GELU, cutlass::half_t, float, cutlass::half_t>"), "{d}");
    let r = HopperGemm { tile: HOPPER_TILES[1], source: Source::Residual, ..g }.declaration();
    assert!(r.contains("KernelTmaWarpSpecializedCooperative") && r.contains("float, float, cutlass::half_t, cutlass::layout::RowMajor, 8"), "{r}");
}
