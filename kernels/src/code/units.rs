// The source units of tessera-kernels whose code decides a compiler output: the artifact format the linker
// writes, and the runtime that measurements run on and that library backends' call descriptions are made for.
// Shared by the build script and `code::tests`; see tessera-stages' `src/code/units.rs`.
//
// The runtime is one unit per module format plus the part they share (buffers, the executable that runs a
// linked artifact, the thread pool, measuring, the loader registry), so work on one backend's executor
// re-keys that backend's measurements only: a change to the `gemm` executor (a CPU backend) does not re-key
// the GPU records in fixtures/frozen, which only a GPU can make again. Each backend's code version carries its
// format's unit; the tune and plan-timing stages carry the shared one (and the backends' versions through
// their keys). `code::tests::every_runtime_file_is_in_one_unit` keeps the split whole.

use tessera_source_digest::Unit;

pub const UNITS: &[Unit] = &[
    Unit { name: "ARTIFACT", paths: &["src/artifact", "src/module.rs", "src/dtype.rs", "src/tensor.rs"] },
    Unit {
        name: "RUNTIME",
        paths: &[
            "src/runtime/mod.rs",
            "src/runtime/buffer.rs",
            "src/runtime/executable.rs",
            "src/runtime/isa.rs",
            "src/runtime/measure.rs",
            "src/runtime/pool.rs",
            "src/runtime/registry.rs",
            "src/random.rs",
        ],
    },
    Unit { name: "RUNTIME_C", paths: &["src/runtime/c.rs"] },
    Unit { name: "RUNTIME_GEMM", paths: &["src/runtime/gemm.rs", "src/runtime/gemm"] },
    Unit { name: "RUNTIME_CUDA", paths: &["src/runtime/cuda"] },
];
