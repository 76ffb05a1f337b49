// The source units of tessera-kernels whose code decides a compiler output: the artifact format the linker
// writes, and the runtime that measurements run on and that library backends' call descriptions are made for.
// Shared by the build script and `code::tests`; see tessera-stages' `src/code/units.rs`.

use tessera_source_digest::Unit;

pub const UNITS: &[Unit] = &[
    Unit { name: "ARTIFACT", paths: &["src/artifact", "src/module.rs", "src/dtype.rs", "src/tensor.rs"] },
    Unit { name: "RUNTIME", paths: &["src/runtime", "src/random.rs"] },
];
