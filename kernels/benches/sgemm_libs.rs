//! matrixmultiply against the `gemm` crate on the GEMM shapes that dominate the CPU comparison models of
//! issue 32 (MobileNetV2's pointwise convolutions, BERT's and GPT-2's projections at sequence 128, GPT-2's LM
//! head). Row-major C = A · B, beta 0, as the gemm backend calls it. Threads: run under `taskset -c 0` or
//! `taskset -c 0-1`; both libraries size their threads from the cores they may use.
//!
//! Run: `cargo bench -p tessera-kernels --bench sgemm_libs` (optionally `-- ITERS`).

use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time(iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    f();
    median((0..iters).map(|_| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64()
    }).collect())
}

fn main() {
    let iters: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(20);
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    // (name, m, n, k)
    let shapes: &[(&str, usize, usize, usize)] = &[
        ("mbv2 1x1 16->96 @112", 96, 12544, 16),
        ("mbv2 1x1 96->24 @56", 24, 3136, 96),
        ("mbv2 1x1 320->1280 @7", 1280, 49, 320),
        ("mbv2 1x1 64->384 @14", 384, 196, 64),
        ("mbv2 1x1 24->144 @56", 144, 3136, 24),
        ("mbv2 1x1 160->960 @7", 960, 49, 160),
        ("mbv2 stem im2col 27->32 @112", 32, 12544, 27),
        ("bert qkv 128x768x768", 128, 768, 768),
        ("bert ffn1 128x768x3072", 128, 3072, 768),
        ("bert ffn2 128x3072x768", 128, 768, 3072),
        ("attn scores 128x128x64", 128, 128, 64),
        ("gpt2 lm head 128x768x50257", 128, 50257, 768),
        ("resnet 3x3 64 @56 (im2col)", 64, 3136, 576),
        ("b8 ffn1 1024x768x3072", 1024, 3072, 768),
    ];
    println!("{threads} thread(s), {iters} iterations, median");
    println!("{:<30} {:>12} {:>10} {:>12} {:>10} {:>7}", "shape", "mm ms", "GFLOP/s", "gemm ms", "GFLOP/s", "ratio");
    for &(name, m, n, k) in shapes {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 7.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 11) as f32 - 5.0) / 5.0).collect();
        let mut c1 = vec![0f32; m * n];
        let mut c2 = vec![0f32; m * n];
        let t_mm = time(iters, || unsafe {
            matrixmultiply::sgemm(m, k, n, 1.0, a.as_ptr(), k as isize, 1, b.as_ptr(), n as isize, 1, 0.0, c1.as_mut_ptr(), n as isize, 1)
        });
        let par = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
        let t_g = pool.install(|| {
            time(iters, || unsafe {
                gemm::gemm(m, n, k, c2.as_mut_ptr(), 1, n as isize, false, a.as_ptr(), 1, k as isize, b.as_ptr(), 1, n as isize, 0.0, 1.0, false, false, false, par)
            })
        });
        let diff = c1.iter().zip(&c2).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(diff < 1e-2, "{name}: results differ by {diff}");
        let gf = 2.0 * (m * n * k) as f64 / 1e9;
        println!("{:<30} {:>12.3} {:>10.1} {:>12.3} {:>10.1} {:>7.2}", name, t_mm * 1e3, gf / t_mm, t_g * 1e3, gf / t_g, t_mm / t_g);
    }
}
