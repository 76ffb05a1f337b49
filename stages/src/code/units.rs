// The source units of tessera-stages: which files produce each stage's and backend's output. Shared by the
// build script (which embeds their digests) and `code::tests` (which recomputes them), so the table cannot
// drift from what is embedded. Paths are relative to the crate root; folders count recursively, test-only
// files excluded (`tessera_source_digest::is_test_only`).
//
// A unit lists the code that turns a key's inputs into the output. The IR's own code (`src/ir`) is not in
// the backends' units: kernels reach a backend as IR graphs whose structural hash is the input, and that
// hash has its own version. When a new file starts producing part of an output, add it here: so
// `src/ir/view.rs`, the strided views through which the shared plan (`src/backend/lowering/plan.rs`) lets
// the `cuda` attention read its heads, joins the units that hold that plan.
//
// Backends do not import one another (`code::tests::backends_import_no_other_backend`). What several share
// lives outside every backend's folder, and each unit lists its backend's folder with the shared files that
// backend uses:
// - `src/backend/lowering` (`lowering!`): the fusion plan (`plan.rs`, with the loop nests of `nest.rs`), C
//   expressions (`cexpr.rs`), scratch assignment (`scratch.rs`), source text (`text.rs`: the scalar math
//   `scalar.h`, indentation) and the partition cost formulas (`cost.rs`: flops and boundary bytes), with
//   `src/ir/view.rs`. In the units of `c` and of every GPU backend (the library backends use its cost
//   formulas), so work on one code generator alone (`c`'s lowering, prelude, loops) does not re-key
//   another backend's kernels and measurements.
// - `src/rules/epilogue.rs`: the epilogue chain (an anchor and the epilogues fused into it), which `gemm`
//   lowers and the library backends (`cublas`, `cudnn`, `cutlass`, with `src/backend/library.rs`) restrict to
//   what their fused call computes. The rest of `src/rules` (the rule vocabulary, `Rule` and `Kinds`) shapes
//   candidates, not code: it is in the partitioner's unit, which decides what kernels a backend is given.

use tessera_source_digest::Unit;

/// The shared lowering machinery and the views its plan reads through (see above), with a unit's own paths.
macro_rules! lowering {
    ($($more:expr),*) => {
        &["src/backend/lowering", "src/ir/view.rs", $($more),*]
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
    Unit { name: "PARTITION", paths: &["src/partition", "src/rules", "src/stages/partition.rs", "src/stages/select.rs", "src/stages/prune.rs", "src/stages/validate.rs", "src/interp/random.rs"] },
    Unit { name: "TUNE", paths: &["src/stages/tune.rs", "src/device.rs", "src/fingerprint.rs", "src/interp/random.rs"] },
    Unit { name: "LOWER", paths: &["src/stages/lower.rs"] },
    Unit { name: "COMPILE", paths: &["src/stages/compile.rs"] },
    Unit { name: "LINK", paths: &["src/stages/link.rs"] },
    // Backends: each one's folder, and the shared files it uses (above).
    Unit { name: "BACKEND_C", paths: lowering!["src/backend/c"] },
    Unit { name: "BACKEND_GEMM", paths: &["src/backend/gemm", "src/rules/epilogue.rs"] },
    Unit { name: "BACKEND_CUDA", paths: lowering!["src/backend/cuda"] },
    Unit { name: "BACKEND_CUBLAS", paths: lowering!["src/backend/cublas", "src/backend/library.rs", "src/rules/epilogue.rs"] },
    Unit { name: "BACKEND_CUDNN", paths: lowering!["src/backend/cudnn", "src/backend/library.rs", "src/rules/epilogue.rs"] },
    Unit { name: "BACKEND_CUTLASS", paths: lowering!["src/backend/cutlass", "src/backend/library.rs", "src/rules/epilogue.rs"] },
];
