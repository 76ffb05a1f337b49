//! Helpers shared by the end-to-end tests in this folder.

use tessera_stages::ir::Tensor;

/// Asserts `got` matches `want`: same type, and for floats a relative error `max|got - want| / max|want|`
/// below `tol` (relative to the output's scale, so elements near zero do not turn rounding noise into a
/// failure); integer and bool outputs must match exactly; NaN never passes.
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f64) {
    assert_eq!(got.ty, want.ty, "{what}: type differs");
    let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
    if !want.dtype().is_float() {
        assert_eq!(a, b, "{what}: values differ");
        return;
    }
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
    let mut worst = (0f64, 0usize);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(!x.is_nan() && !y.is_nan(), "{what}: NaN at element {i} (got {x}, want {y})");
        let err = (x - y).abs() / scale;
        if err > worst.0 {
            worst = (err, i);
        }
    }
    assert!(
        worst.0 < tol,
        "{what}: relative error {:.3e} at element {} (got {}, want {}) is not below {tol:e}",
        worst.0,
        worst.1,
        a[worst.1],
        b[worst.1]
    );
}

/// The `tessera` binary of this build, for end-to-end tests that run it as a user would (several processes
/// on one store, processes killed mid-build). This package cannot name another package's binary
/// (`CARGO_BIN_EXE_*` is only set for the package's own), so the first call brings it up to date with the
/// cargo that built this test (a no-op after `cargo test --workspace`, which builds it) and returns its
/// path next to this test's `deps/` folder.
pub fn tessera_bin() -> std::path::PathBuf {
    static BIN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        let dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>/deps/<test>");
        let bin = dir.join(format!("tessera{}", std::env::consts::EXE_SUFFIX));
        let mut cmd = std::process::Command::new(env!("CARGO"));
        cmd.args(["build", "--quiet", "-p", "tessera", "--bin", "tessera"]);
        cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
        // The target folder this test was built in (its parent), whatever CARGO_TARGET_DIR said.
        cmd.env("CARGO_TARGET_DIR", dir.parent().expect("target/<profile>"));
        if dir.file_name().is_some_and(|p| p == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("cargo runs");
        assert!(status.success() && bin.exists(), "building the tessera binary failed ({status})");
        bin
    })
    .clone()
}

/// A small seeded random generator (splitmix64): reproducible choices in tests without a dependency.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}
