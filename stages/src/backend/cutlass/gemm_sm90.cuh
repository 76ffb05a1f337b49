// tessera's cutlass prelude for the Hopper family (`hopper.rs`), in modules that instantiate it: CUTLASS 3.x's
// collective builders for the TMA warp-specialized mainloops and epilogues, and the kernel joining them.
// Each launch's `Params`, tensor maps included, is built by CUTLASS's own host code at compile time (the probe)
// and passed by value.
#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/epilogue/thread/activation.h>
