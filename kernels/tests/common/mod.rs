//! Test helpers: real shared-object modules compiled from C with the `cc` crate (as the `c` backend does),
//! and link inputs built around them.

#![allow(dead_code)]

use std::process::Command;
use tessera_stages::stages::link::{LinkInput, LinkStep, ValueRef};
use tessera_stages::backend::{FunctionInfo, Module};
use tessera_stages::ir::{DType, Tensor, TensorType};

/// Compiles C source into a shared object and returns its bytes.
pub fn compile_so(src: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let c = dir.path().join("m.c");
    let so = dir.path().join("m.so");
    std::fs::write(&c, src).unwrap();
    let triple = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let tool = cc::Build::new()
        .target(&triple)
        .host(&triple)
        .opt_level(2)
        .pic(true)
        .cargo_metadata(false)
        .cargo_warnings(false)
        .try_get_compiler()
        .expect("a C compiler");
    let mut cmd: Command = tool.to_command();
    cmd.arg("-shared").arg("-o").arg(&so).arg(&c);
    let out = cmd.output().expect("runs the C compiler");
    assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::read(&so).unwrap()
}

/// Kernels in the calling convention `void f(void* const* args)`: `[inputs.., outputs.., scratch?]`.
pub const KERNELS_C: &str = r#"
#include <stdint.h>
/* f32[2x2] + f32[2x2] */
void t_add(void* const* a) {
    const float* x = a[0]; const float* y = a[1]; float* o = a[2];
    for (int i = 0; i < 4; i++) o[i] = x[i] + y[i];
}
/* relu f32[2x2] */
void t_relu(void* const* a) {
    const float* x = a[0]; float* o = a[1];
    for (int i = 0; i < 4; i++) o[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
/* f32[2x3] @ f32[3x2] -> f32[2x2]; transposes w into its 24-byte scratch first. */
void t_matmul(void* const* a) {
    const float* x = a[0]; const float* w = a[1]; float* o = a[2]; float* wt = a[3];
    for (int k = 0; k < 3; k++) for (int j = 0; j < 2; j++) wt[j * 3 + k] = w[k * 2 + j];
    for (int i = 0; i < 2; i++) for (int j = 0; j < 2; j++) {
        float s = 0.0f;
        for (int k = 0; k < 3; k++) s += x[i * 3 + k] * wt[j * 3 + k];
        o[i * 2 + j] = s;
    }
}
/* i32[3] flags: whether each of its three pointers (input, constant, output) is 64-byte aligned. */
void t_probe(void* const* a) {
    int32_t* o = a[2];
    for (int i = 0; i < 3; i++) o[i] = ((uintptr_t)a[i] % 64) == 0;
}
"#;

pub fn f(symbol: &str, inputs: Vec<TensorType>, outputs: Vec<TensorType>, scratch_bytes: u64) -> FunctionInfo {
    FunctionInfo { symbol: symbol.into(), inputs, outputs, scratch_bytes }
}

pub fn t22() -> TensorType {
    TensorType::f32([2, 2])
}

/// The module of [`KERNELS_C`]: functions 0 add, 1 relu, 2 matmul, 3 probe.
pub fn kernels_module(bytes: Vec<u8>) -> Module {
    Module {
        backend: "c".into(),
        target: "llvm".into(),
        format: tessera_kernels::runtime::c::FORMAT,
        functions: vec![
            f("t_add", vec![t22(), t22()], vec![t22()], 0),
            f("t_relu", vec![t22()], vec![t22()], 0),
            f("t_matmul", vec![TensorType::f32([2, 3]), TensorType::f32([3, 2])], vec![t22()], 24),
            f("t_probe", vec![TensorType::f32([2, 3]), TensorType::f32([3, 2])], vec![TensorType::new(DType::I32, [3])], 0),
        ],
        bytes,
    }
}

pub const X: [f32; 6] = [1.0, -2.0, 3.0, -4.0, 5.0, -6.0];
pub const W: [f32; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
pub const B: [f32; 4] = [0.5, -20.0, 1.0, 2.0];

/// y = relu(x @ W + B) + B, with h = x @ W + B also an output, the input and a constant passed through as
/// outputs, and a probe of pointer alignment. Constants 1 and 2 are the same tensor (stored once); constant 3
/// is unused (left out).
pub fn mlp_input(module: Module) -> LinkInput {
    use ValueRef::*;
    let step = |function: u32, args: Vec<ValueRef>| LinkStep { module: 0, function, args };
    LinkInput {
        model: "mlp".into(),
        inputs: vec![("x".into(), TensorType::f32([2, 3]))],
        input_int_bounds: vec![],
        outputs: vec![("y".into(), Value(3)), ("h".into(), Value(1)), ("x_again".into(), Input(0)), ("bias".into(), Const(2)), ("aligned".into(), Value(4))],
        values: vec![t22(), t22(), t22(), t22(), TensorType::new(DType::I32, [3])],
        constants: vec![Tensor::from_f32([3, 2], &W), Tensor::from_f32([2, 2], &B), Tensor::from_f32([2, 2], &B), Tensor::from_f32([7], &[9.0; 7])],
        modules: vec![module],
        steps: vec![
            step(2, vec![Input(0), Const(0), Value(0)]),
            step(0, vec![Value(0), Const(1), Value(1)]),
            step(1, vec![Value(1), Value(2)]),
            step(3, vec![Input(0), Const(0), Value(4)]),
            step(0, vec![Value(2), Const(2), Value(3)]),
        ],
    }
}

/// Hand-computed: x @ W = [[10, 12], [-19, -24]]; + B = [[10.5, -8], [-18, -22]]; relu, + B = [[11, -20], [1, 2]].
pub const H: [f32; 4] = [10.5, -8.0, -18.0, -22.0];
pub const Y: [f32; 4] = [11.0, -20.0, 1.0, 2.0];
