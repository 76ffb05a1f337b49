// The source units of tessera-stages: which files produce each stage's and backend's output. Shared by the
// build script (which embeds their digests) and `code::tests` (which recomputes them), so the table cannot
// drift from what is embedded. Paths are relative to the crate root; folders count recursively, test-only
// files excluded (`tessera_source_digest::is_test_only`).
//
// A unit lists the code that turns a key's inputs into the output. The IR's own code (`src/ir`) is not in
// the backends' units: kernels reach a backend as IR graphs whose structural hash is the input, and that
// hash has its own version. When a new file starts producing part of an output, add it here: so
// `src/ir/view.rs`, the strided views through which the plan of `src/backend/c` (shared by every GPU backend)
// lets the `cuda` attention read its heads, joins the units that hold that plan.
//
// The GPU backends share part of `src/backend/c`, not all of it: its plan (`plan.rs`, with the loop nests of
// `nest.rs` it builds on), C expressions (`cexpr.rs`), scratch assignment (`scratch.rs`), cost helpers
// (`cost.rs`) and source text (`text.rs`: the scalar math `scalar.h`, indentation). Their units list those
// files (`c_shared!`), so work on the C code generator alone does not re-key GPU kernels and measurements.
// `code::tests::gpu_backends_use_only_the_shared_part_of_c` checks that no GPU backend file names another
// module of `backend::c`. The library backends (`cublas`, `cudnn`, `cutlass`) take their fusion rule (an anchor
// and the epilogues fused into it) from `src/backend/gemm/support.rs`, and only that file of the `gemm`
// backend is in their units: the `gemm` lowering and its plan are CPU code
// (`code::tests::gpu_backends_use_only_the_support_rule_of_gemm`).

use tessera_source_digest::Unit;

/// The files of `src/backend/c` the GPU backends use (see above).
macro_rules! c_shared {
    ($($more:expr),*) => {
        &["src/backend/c/plan.rs", "src/backend/c/nest.rs", "src/backend/c/cexpr.rs", "src/backend/c/scratch.rs", "src/backend/c/cost.rs", "src/backend/c/text.rs", "src/backend/c/scalar.h", "src/ir/view.rs", $($more),*]
    };
}

pub const UNITS: &[Unit] = &[
    Unit { name: "TARGETS", paths: &["src/target", "src/stages/targets.rs"] },
    Unit { name: "LOAD", paths: &["src/stages/load.rs", "src/ir/serial.rs"] },
    Unit { name: "PASSES", paths: &["src/passes"] },
    // What an ONNX file imports to (the ONNX recipe of the load stage): the importer, the IR it builds and
    // the interpreter its eager folding runs. (`src/ir/view.rs` is digested here as part of `src/ir`, and
    // again in the backend units below, which is what versions the `cuda` kernels it shapes.)
    Unit { name: "IMPORT", paths: &["src/onnx", "src/stages/onnx_externals.rs", "src/ir", "src/interp"] },
    Unit { name: "PRECISION", paths: &["src/stages/precision.rs"] },
    Unit { name: "LAYOUT", paths: &["src/stages/layout.rs"] },
    Unit { name: "CALIBRATE", paths: &["src/stages/calibrate.rs", "src/calibration.rs", "src/interp"] },
    // The plan records each input's integer bound (`interp::int_input_bounds`), which the artifact carries.
    Unit { name: "PARTITION", paths: &["src/partition", "src/stages/partition.rs", "src/stages/select.rs", "src/stages/prune.rs", "src/stages/validate.rs", "src/interp/random.rs"] },
    Unit { name: "TUNE", paths: &["src/stages/tune.rs", "src/device.rs", "src/fingerprint.rs", "src/interp/random.rs"] },
    Unit { name: "LOWER", paths: &["src/stages/lower.rs"] },
    Unit { name: "COMPILE", paths: &["src/stages/compile.rs"] },
    Unit { name: "LINK", paths: &["src/stages/link.rs"] },
    // Backends: each one's folder, and the folders of the backends whose code it shares.
    Unit { name: "BACKEND_C", paths: &["src/backend/c", "src/ir/view.rs"] },
    Unit { name: "BACKEND_GEMM", paths: &["src/backend/gemm"] },
    Unit { name: "BACKEND_CUDA", paths: c_shared!["src/backend/cuda"] },
    Unit { name: "BACKEND_CUBLAS", paths: c_shared!["src/backend/cublas", "src/backend/library.rs", "src/backend/gemm/support.rs"] },
    Unit { name: "BACKEND_CUDNN", paths: c_shared!["src/backend/cudnn", "src/backend/library.rs", "src/backend/gemm/support.rs"] },
    Unit { name: "BACKEND_CUTLASS", paths: c_shared!["src/backend/cutlass", "src/backend/library.rs", "src/backend/gemm/support.rs"] },
];
