//! The c backend against the reference interpreter: every op family on small graphs (broadcasting, groups,
//! dilations, strides, ceil_mode, negative steps, multi-output ops...), fused multi-node kernels, scratch
//! reuse, determinism of source and shared objects, and error reporting.
//!
//! Each test batches its kernels into one module (one compile), loads the shared object, runs every function
//! on seeded random inputs and compares with `interp::run_graph` on the same kernel graph: f32 within 1e-4
//! relative (to the element, or to the output's mean magnitude for elements near zero), integers and bools
//! exactly; a NaN passes only where the reference has one and the case opts in.

use super::*;
use crate::backend::{Backend, FunctionInfo, LoweredKernel, INLINE_CONST_MAX};
use crate::interp::{random_inputs, run_graph};
use crate::ir::*;
use crate::target::Target;
use std::ffi::c_void;
use std::time::Instant;

fn target() -> Target {
    Target::parse("cpu -compiler=c").unwrap()
}

/// The whole graph as one partition, extracted as the pipeline does; also the original names of its inputs.
fn kernel_of(g: &Graph) -> (Graph, Vec<String>) {
    let all: Vec<NodeId> = (0..g.nodes.len() as u32).map(NodeId).collect();
    let sig = subgraph_signature(g, &all, ConstMode::LiftLarge(INLINE_CONST_MAX));
    let names = sig.inputs.iter().map(|&v| g.value(v).name.clone()).collect();
    (extract_subgraph(g, &sig), names)
}

struct Case {
    name: String,
    kernel: Graph,
    inputs: Vec<Tensor>,
    nan_ok: bool,
}

fn seed_of(name: &str) -> u64 {
    u64::from_le_bytes(blake3::hash(name.as_bytes()).as_bytes()[..8].try_into().unwrap())
}

/// A case on seeded random inputs.
fn case(name: &str, g: Graph) -> Case {
    let (kernel, _) = kernel_of(&g);
    let inputs = random_inputs(&kernel, seed_of(name));
    Case { name: name.to_string(), kernel, inputs, nan_ok: false }
}

/// A case whose inputs come from `make(original input name, type)` (lifted constants stay random).
fn case_with(name: &str, g: Graph, nan_ok: bool, make: impl Fn(&str, &TensorType) -> Option<Tensor>) -> Case {
    let (kernel, names) = kernel_of(&g);
    let mut inputs = random_inputs(&kernel, seed_of(name));
    for (k, n) in names.iter().enumerate() {
        if let Some(t) = make(n, kernel.ty(kernel.inputs[k])) {
            inputs[k] = t;
        }
    }
    Case { name: name.to_string(), kernel, inputs, nan_ok }
}

fn symbol(name: &str) -> String {
    format!("k_{}", name.replace(|c: char| !c.is_ascii_alphanumeric(), "_"))
}

/// A buffer of `bytes` bytes, 8-byte aligned, filled with `fill` (0xff makes unwritten floats NaN).
fn buffer(bytes: usize, fill: u8) -> Vec<u64> {
    vec![u64::from_ne_bytes([fill; 8]); bytes.div_ceil(8).max(1)]
}

fn as_bytes(b: &[u64], n: usize) -> &[u8] {
    &bytemuck::cast_slice(b)[..n]
}

/// Compares one output; `Err` describes the first mismatch.
fn compare(got: &[u8], want: &Tensor, nan_ok: bool) -> Result<(), String> {
    if want.dtype() != DType::F32 {
        if got != want.bytes() {
            let pos = got.iter().zip(want.bytes()).position(|(a, b)| a != b).unwrap_or(0);
            return Err(format!("{} differs at byte {pos}: got {:?}, want {:?}", want.ty, &got[pos..(pos + 8).min(got.len())], &want.bytes()[pos..(pos + 8).min(got.len())]));
        }
        return Ok(());
    }
    let g: Vec<f32> = got.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let w = want.to_f32_vec();
    let finite: Vec<f32> = w.iter().copied().filter(|v| v.is_finite()).collect();
    let mean = finite.iter().map(|v| v.abs() as f64).sum::<f64>() / finite.len().max(1) as f64;
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let ok = if b.is_nan() {
            nan_ok && a.is_nan()
        } else if b.is_infinite() || a.is_nan() {
            a == b
        } else {
            ((a - b).abs() as f64) <= 1e-4 * (b.abs() as f64).max(mean)
        };
        if !ok {
            return Err(format!("{} element {i}: got {a:e}, want {b:e}", want.ty));
        }
    }
    Ok(())
}

/// Lowers every case into one module, compiles it once, runs each function and compares with the reference.
fn run(cases: Vec<Case>) {
    let be = CBackend;
    let t = target();
    let lowered: Vec<LoweredKernel> = cases
        .iter()
        .map(|c| be.lower(&t, &c.kernel, &symbol(&c.name)).unwrap_or_else(|e| panic!("lowering {}: {e}", c.name)))
        .collect();
    let t0 = Instant::now();
    let module = be.compile_module(&t, &lowered).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("compiled {} kernels in {:.2}s ({} bytes)", lowered.len(), t0.elapsed().as_secs_f64(), module.bytes.len());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("module.so");
    std::fs::write(&path, &module.bytes).unwrap();
    // SAFETY: the library is the module just compiled; its initializers are the C runtime's only.
    let lib = unsafe { libloading::Library::new(&path) }.unwrap();
    let mut failures = Vec::new();
    for (c, lk) in cases.iter().zip(&lowered) {
        let want = match run_graph(&c.kernel, &c.inputs) {
            Ok(w) => w,
            Err(e) => panic!("reference failed on {}: {e}", c.name),
        };
        let mut ins: Vec<Vec<u64>> = c.inputs.iter().map(|t| {
            let mut b = buffer(t.bytes().len(), 0);
            bytemuck::cast_slice_mut::<u64, u8>(&mut b)[..t.bytes().len()].copy_from_slice(t.bytes());
            b
        }).collect();
        let mut outs: Vec<Vec<u64>> = lk.info.outputs.iter().map(|t| buffer(t.size_bytes(), 0xff)).collect();
        let mut scratch = buffer(lk.info.scratch_bytes as usize, 0xff);
        let mut args: Vec<*mut c_void> = ins.iter_mut().map(|b| b.as_mut_ptr() as *mut c_void).collect();
        args.extend(outs.iter_mut().map(|b| b.as_mut_ptr() as *mut c_void));
        if lk.info.scratch_bytes > 0 {
            args.push(scratch.as_mut_ptr() as *mut c_void);
        }
        // SAFETY: the symbol has the documented signature; every buffer has the size its FunctionInfo gives.
        unsafe {
            let f: libloading::Symbol<unsafe extern "C" fn(*const *mut c_void)> = lib.get(lk.info.symbol.as_bytes()).unwrap();
            f(args.as_ptr());
        }
        for (k, (o, w)) in outs.iter().zip(&want).enumerate() {
            if let Err(e) = compare(as_bytes(o, w.bytes().len()), w, c.nan_ok) {
                failures.push(format!("{} output {k}: {e}", c.name));
            }
        }
        // Inputs are read-only.
        for (b, t) in ins.iter().zip(&c.inputs) {
            if as_bytes(b, t.bytes().len()) != t.bytes() {
                failures.push(format!("{}: an input buffer was modified", c.name));
            }
        }
    }
    if !failures.is_empty() {
        let src = module_source(&lowered).unwrap();
        let _ = std::fs::write(std::env::temp_dir().join("tessera_c_failed_module.c"), src);
        panic!("{} of {} kernels differ from the reference:\n{}", failures.len(), cases.len(), failures.join("\n"));
    }
}

// ---- graph building helpers -------------------------------------------------------------------------------

fn f32in(g: &mut Graph, name: &str, shape: &[usize]) -> ValueId {
    g.add_input(name, TensorType::f32(shape.to_vec()))
}

fn node(g: &mut Graph, op: Op, inputs: &[ValueId]) -> ValueId {
    let name = format!("n{}", g.nodes.len());
    g.add(name, op, inputs).unwrap_or_else(|e| panic!("{e}"))
}

fn cst(g: &mut Graph, t: Tensor) -> ValueId {
    let name = format!("c{}", g.values.len());
    g.add_const(name, t)
}

fn ramp(n: usize, scale: f32, offset: f32) -> Vec<f32> {
    (0..n).map(|i| ((i * 7919 % 97) as f32 / 97.0 - 0.5) * scale + offset).collect()
}

fn un(u: UnaryOp) -> Op {
    Op::Unary(u)
}

fn bin(b: BinaryOp) -> Op {
    Op::Binary(b)
}

/// x scaled by `s` (a fused Mul by a literal), to widen the random input range.
fn scaled(g: &mut Graph, x: ValueId, s: f32) -> ValueId {
    let c = cst(g, Tensor::scalar_f32(s));
    node(g, bin(BinaryOp::Mul), &[x, c])
}

// ---- elementwise -------------------------------------------------------------------------------------------

#[test]
fn unary_and_activations() {
    use UnaryOp::*;
    let mut cases = Vec::new();
    for (name, u, positive, scale) in [
        ("relu", Relu, false, 1.0),
        ("sigmoid", Sigmoid, false, 8.0),
        ("tanh", Tanh, false, 4.0),
        ("erf", Erf, false, 6.0),
        ("sqrt", Sqrt, true, 3.0),
        ("exp", Exp, false, 10.0),
        ("log", Log, true, 5.0),
        ("neg", Neg, false, 1.0),
        ("reciprocal", Reciprocal, false, 1.0),
        ("abs", Abs, false, 1.0),
        ("floor", Floor, false, 7.0),
        ("ceil", Ceil, false, 7.0),
        ("hardswish", HardSwish, false, 8.0),
    ] {
        let mut g = Graph::new(name);
        let x = f32in(&mut g, "x", &[3, 17]);
        let mut v = scaled(&mut g, x, scale);
        if positive {
            v = node(&mut g, un(Abs), &[v]);
        }
        let y = node(&mut g, un(u), &[v]);
        g.outputs.push(y);
        cases.push(case(&format!("unary_{name}"), g));
    }
    for (name, op, scale) in [
        ("leaky", Op::LeakyRelu { alpha: 0.1 }, 2.0),
        ("hardsigmoid", Op::HardSigmoid { alpha: 0.2, beta: 0.5 }, 6.0),
        ("clip", Op::Clip { min: -0.5, max: 0.25 }, 1.0),
        ("clip_open", Op::Clip { min: f32::NEG_INFINITY, max: 0.25 }, 1.0),
        ("gelu_erf", Op::Gelu { approximate: GeluApprox::Erf }, 4.0),
        ("gelu_tanh", Op::Gelu { approximate: GeluApprox::Tanh }, 4.0),
    ] {
        let mut g = Graph::new(name);
        let x = f32in(&mut g, "x", &[2, 3, 11]);
        let v = scaled(&mut g, x, scale);
        let y = node(&mut g, op, &[v]);
        g.outputs.push(y);
        cases.push(case(&format!("act_{name}"), g));
    }
    // Many unary ops of one input in one kernel: one loop, several stored outputs.
    let mut g = Graph::new("multi");
    let x = f32in(&mut g, "x", &[64]);
    for u in [Relu, Sigmoid, Tanh, Exp, Neg] {
        let y = node(&mut g, un(u), &[x]);
        g.outputs.push(y);
    }
    cases.push(case("unary_multi", g));
    run(cases);
}

#[test]
fn binary_broadcasting() {
    use BinaryOp::*;
    let shapes: [(&[usize], &[usize]); 6] = [
        (&[2, 3, 4], &[4]),
        (&[2, 1, 4], &[3, 1]),
        (&[1], &[2, 3]),
        (&[5], &[5]),
        (&[2, 3, 1, 5], &[1, 3, 4, 1]),
        (&[], &[3, 2]),
    ];
    let mut cases = Vec::new();
    for (i, (sa, sb)) in shapes.iter().enumerate() {
        for b in [Add, Sub, Mul, Div, Pow, Min, Max, Mod, FMod, Equal, Less, Greater, LessOrEqual, GreaterOrEqual] {
            let mut g = Graph::new("bin");
            let x = f32in(&mut g, "x", sa);
            let y = f32in(&mut g, "y", sb);
            let (x, y) = if b == Pow {
                let ax = node(&mut g, un(UnaryOp::Abs), &[x]);
                (ax, scaled(&mut g, y, 3.0))
            } else if matches!(b, Mod | FMod) {
                (scaled(&mut g, x, 10.0), y)
            } else {
                (x, y)
            };
            let z = node(&mut g, bin(b), &[x, y]);
            g.outputs.push(z);
            cases.push(case(&format!("bin_{b:?}_{i}"), g));
        }
    }
    // Constants: a scalar literal, a small inline array, a large lifted one.
    let mut g = Graph::new("consts");
    let x = f32in(&mut g, "x", &[8, 16]);
    let c1 = cst(&mut g, Tensor::scalar_f32(0.5));
    let c2 = cst(&mut g, Tensor::from_f32([16], &ramp(16, 2.0, 0.0)));
    let c3 = cst(&mut g, Tensor::from_f32([8, 16], &ramp(128, 1.0, 0.1)));
    let a = node(&mut g, bin(Mul), &[x, c1]);
    let b = node(&mut g, bin(Add), &[a, c2]);
    let c = node(&mut g, bin(Sub), &[b, c3]);
    g.outputs.push(c);
    cases.push(case("bin_consts", g));
    run(cases);
}

#[test]
fn integer_and_bool_ops() {
    use BinaryOp::*;
    let mut cases = Vec::new();
    for d in [DType::I64, DType::I32] {
        for b in [Add, Sub, Mul, Div, Pow, Min, Max, Mod, FMod, Equal, Less, Greater, LessOrEqual, GreaterOrEqual] {
            let mut g = Graph::new("int");
            let x = g.add_input("x", TensorType::new(d, [3, 4]));
            let y = g.add_input("y", TensorType::new(d, [4]));
            let c50 = cst(&mut g, Tensor::from_f64_as(d, Vec::new(), &[50.0]));
            let one = cst(&mut g, Tensor::from_f64_as(d, Vec::new(), &[1.0]));
            let two = cst(&mut g, Tensor::from_f64_as(d, Vec::new(), &[2.0]));
            let c101 = cst(&mut g, Tensor::from_f64_as(d, Vec::new(), &[101.0]));
            let five = cst(&mut g, Tensor::from_f64_as(d, Vec::new(), &[5.0]));
            // x in [-50, 50); y odd in [-99, 99] (never 0), or in [0, 5) for Pow.
            let xs = node(&mut g, bin(Sub), &[x, c50]);
            let ys = if b == Pow {
                node(&mut g, bin(Mod), &[y, five])
            } else {
                let y1 = node(&mut g, bin(Add), &[y, one]);
                let y2 = node(&mut g, bin(Mul), &[y1, two]);
                node(&mut g, bin(Sub), &[y2, c101])
            };
            let z = node(&mut g, bin(b), &[xs, ys]);
            g.outputs.push(z);
            cases.push(case(&format!("int_{d}_{b:?}"), g));
        }
        for (name, op) in [("neg", un(UnaryOp::Neg)), ("abs", un(UnaryOp::Abs)), ("relu", un(UnaryOp::Relu)), ("clip", Op::Clip { min: -10.5, max: 20.0 })] {
            let mut g = Graph::new("intu");
            let x = g.add_input("x", TensorType::new(d, [13]));
            let c50 = cst(&mut g, Tensor::from_f64_as(d, Vec::new(), &[50.0]));
            let xs = node(&mut g, bin(Sub), &[x, c50]);
            let z = node(&mut g, op, &[xs]);
            g.outputs.push(z);
            cases.push(case(&format!("int_{d}_{name}"), g));
        }
    }
    // Bool logic and Where on every dtype.
    for d in [DType::F32, DType::I64, DType::I32, DType::Bool] {
        let mut g = Graph::new("logic");
        let a = f32in(&mut g, "a", &[4, 5]);
        let b = f32in(&mut g, "b", &[5]);
        let x = g.add_input("x", TensorType::new(d, [4, 5]));
        let y = g.add_input("y", TensorType::new(d, [4, 1]));
        let lt = node(&mut g, bin(Less), &[a, b]);
        let gt = node(&mut g, bin(Greater), &[a, b]);
        let n = node(&mut g, un(UnaryOp::Not), &[lt]);
        let and = node(&mut g, bin(And), &[n, gt]);
        let or = node(&mut g, bin(Or), &[lt, and]);
        let eq = node(&mut g, bin(Equal), &[or, gt]);
        let w = node(&mut g, Op::Where, &[eq, x, y]);
        g.outputs.extend([w, and, or]);
        cases.push(case(&format!("where_{d}"), g));
    }
    // Casts between every pair.
    let types = [DType::F32, DType::I64, DType::I32, DType::Bool];
    for from in types {
        for to in types {
            let mut g = Graph::new("cast");
            let x = f32in(&mut g, "x", &[3, 7]);
            // Values in (-1000, 1000) with fractions, then into the source type.
            let xs = scaled(&mut g, x, 1000.0);
            let src = node(&mut g, Op::Cast { to: from }, &[xs]);
            let y = node(&mut g, Op::Cast { to }, &[src]);
            g.outputs.push(y);
            cases.push(case(&format!("cast_{from}_{to}"), g));
        }
    }
    // Cast of specials to integers: NaN and out-of-range give the minimum.
    let mut g = Graph::new("cast_special");
    let x = f32in(&mut g, "x", &[6]);
    let a = node(&mut g, Op::Cast { to: DType::I64 }, &[x]);
    let b = node(&mut g, Op::Cast { to: DType::I32 }, &[x]);
    let c = node(&mut g, Op::Cast { to: DType::Bool }, &[x]);
    g.outputs.extend([a, b, c]);
    cases.push(case_with("cast_special", g, false, |_, _| Some(Tensor::from_f32([6], &[f32::NAN, f32::INFINITY, -3e9, 3e19, -2.7, 2.7]))));
    run(cases);
}

#[test]
fn nan_propagates_like_the_reference() {
    let vals = [f32::NAN, 1.0, -2.0, f32::INFINITY, f32::NEG_INFINITY, 0.5, f32::NAN, -0.25];
    let mut g = Graph::new("nan");
    let x = f32in(&mut g, "x", &[2, 4]);
    let y = f32in(&mut g, "y", &[2, 4]);
    let outs = [
        node(&mut g, un(UnaryOp::Relu), &[x]),
        node(&mut g, bin(BinaryOp::Max), &[x, y]),
        node(&mut g, bin(BinaryOp::Min), &[x, y]),
        node(&mut g, Op::Clip { min: -1.0, max: 1.0 }, &[x]),
        node(&mut g, un(UnaryOp::IsNaN), &[x]),
        node(&mut g, Op::Reduce { kind: ReduceKind::Max, axes: vec![1], keepdims: false }, &[x]),
        node(&mut g, Op::Reduce { kind: ReduceKind::Min, axes: vec![0], keepdims: true }, &[x]),
        node(&mut g, Op::Softmax { axis: 1 }, &[x]),
        node(&mut g, Op::LeakyRelu { alpha: 0.5 }, &[x]),
    ];
    g.outputs.extend(outs);
    let pool_in = f32in(&mut g, "p", &[1, 1, 2, 4]);
    let mp = node(&mut g, Op::MaxPool(PoolAttrs { kernel: vec![2, 2], strides: vec![1, 2], pads: vec![0; 4], dilations: vec![1, 1], ceil_mode: false }), &[pool_in]);
    g.outputs.push(mp);
    let c = case_with("nan", g, true, move |n, t| {
        let k = if n == "y" { 3 } else { 0 };
        Some(Tensor::from_f32(t.shape.clone(), &(0..8).map(|i| vals[(i + k) % 8]).collect::<Vec<_>>()))
    });
    run(vec![c]);
}

// ---- matmul and conv ---------------------------------------------------------------------------------------

#[test]
fn matmul_shapes() {
    let shapes: [(&[usize], &[usize]); 11] = [
        (&[3, 5], &[5, 7]),
        (&[1, 300], &[300, 20]),
        (&[2, 3, 4], &[4, 5]),
        (&[2, 3, 4], &[2, 4, 5]),
        (&[2, 1, 3, 4], &[3, 4, 5]),
        (&[4], &[4, 5]),
        (&[2, 3, 4], &[4]),
        (&[4], &[4]),
        (&[37, 70], &[70, 33]),
        (&[5, 600], &[600, 530]),
        (&[3, 0], &[0, 4]),
    ];
    let mut cases = Vec::new();
    for (i, (sa, sb)) in shapes.iter().enumerate() {
        let mut g = Graph::new("mm");
        let a = f32in(&mut g, "a", sa);
        let b = f32in(&mut g, "b", sb);
        let y = node(&mut g, Op::MatMul, &[a, b]);
        g.outputs.push(y);
        cases.push(case(&format!("matmul_{i}"), g));
    }
    // A lifted weight, and a K > KC product with a fused epilogue (partials wait in the output).
    let mut g = Graph::new("mmw");
    let a = f32in(&mut g, "a", &[6, 520]);
    let w = cst(&mut g, Tensor::from_f32([520, 9], &ramp(520 * 9, 0.2, 0.0)));
    let m = node(&mut g, Op::MatMul, &[a, w]);
    let r = node(&mut g, un(UnaryOp::Tanh), &[m]);
    g.outputs.push(r);
    cases.push(case("matmul_weight_epilogue", g));
    // Integer matmul.
    for d in [DType::I64, DType::I32] {
        let mut g = Graph::new("mmi");
        let a = g.add_input("a", TensorType::new(d, [2, 3, 4]));
        let b = g.add_input("b", TensorType::new(d, [4, 2]));
        let y = node(&mut g, Op::MatMul, &[a, b]);
        g.outputs.push(y);
        cases.push(case(&format!("matmul_int_{d}"), g));
    }
    run(cases);
}

fn conv_attrs(strides: &[usize], pads: &[usize], dilations: &[usize], group: usize) -> ConvAttrs {
    ConvAttrs { strides: strides.to_vec(), pads: pads.to_vec(), dilations: dilations.to_vec(), group }
}

#[test]
fn conv_variants() {
    struct C {
        name: &'static str,
        x: &'static [usize],
        w: &'static [usize],
        a: ConvAttrs,
        bias: bool,
    }
    let list = [
        C { name: "1d", x: &[2, 3, 10], w: &[4, 3, 3], a: conv_attrs(&[2], &[1, 2], &[1], 1), bias: true },
        C { name: "2d_group_dil", x: &[1, 4, 9, 8], w: &[6, 2, 3, 3], a: conv_attrs(&[2, 1], &[1, 0, 2, 1], &[1, 2], 2), bias: true },
        C { name: "depthwise", x: &[1, 6, 7, 7], w: &[6, 1, 3, 3], a: conv_attrs(&[1, 1], &[1, 1, 1, 1], &[1, 1], 6), bias: true },
        C { name: "depthwise_s2", x: &[2, 4, 8, 8], w: &[4, 1, 3, 3], a: conv_attrs(&[2, 2], &[0, 0, 1, 1], &[1, 1], 4), bias: false },
        C { name: "pointwise", x: &[2, 8, 5, 5], w: &[16, 8, 1, 1], a: conv_attrs(&[1, 1], &[0; 4], &[1, 1], 1), bias: true },
        C { name: "deep_k", x: &[1, 32, 6, 6], w: &[8, 32, 3, 3], a: conv_attrs(&[1, 1], &[1; 4], &[1, 1], 1), bias: true },
        C { name: "3d", x: &[1, 2, 4, 5, 5], w: &[3, 2, 2, 3, 3], a: conv_attrs(&[1, 2, 1], &[0, 1, 1, 1, 0, 1], &[1, 1, 2], 1), bias: false },
        C { name: "7x7_s2", x: &[1, 3, 16, 16], w: &[8, 3, 7, 7], a: conv_attrs(&[2, 2], &[3; 4], &[1, 1], 1), bias: false },
    ];
    let mut cases = Vec::new();
    for c in list {
        let mut g = Graph::new(c.name);
        let x = f32in(&mut g, "x", c.x);
        let wn: usize = c.w.iter().product();
        let w = cst(&mut g, Tensor::from_f32(c.w.to_vec(), &ramp(wn, 0.5, 0.0)));
        let mut ins = vec![x, w];
        if c.bias {
            ins.push(cst(&mut g, Tensor::from_f32([c.w[0]], &ramp(c.w[0], 1.0, 0.0))));
        }
        let y = node(&mut g, Op::Conv(c.a.clone()), &ins);
        g.outputs.push(y);
        cases.push(case(&format!("conv_{}", c.name), g));
        // The same conv with an epilogue: per-channel scale, residual add, relu.
        let mut g2 = Graph::new(c.name);
        let x = f32in(&mut g2, "x", c.x);
        let w = cst(&mut g2, Tensor::from_f32(c.w.to_vec(), &ramp(wn, 0.5, 0.0)));
        let y = node(&mut g2, Op::Conv(c.a), &[x, w]);
        let out_shape = g2.ty(y).shape.clone();
        let mut sc_shape = vec![1usize; out_shape.len()];
        sc_shape[1] = out_shape[1];
        let sc = cst(&mut g2, Tensor::from_f32(sc_shape.clone(), &ramp(out_shape[1], 1.0, 1.0)));
        let res = f32in(&mut g2, "res", &out_shape);
        let a = node(&mut g2, bin(BinaryOp::Mul), &[y, sc]);
        let b = node(&mut g2, bin(BinaryOp::Add), &[a, res]);
        let r = node(&mut g2, un(UnaryOp::Relu), &[b]);
        g2.outputs.push(r);
        cases.push(case(&format!("conv_epi_{}", c.name), g2));
    }
    // An epilogue operand that cannot be walked per GEMM tile (broadcast along only the last spatial dim):
    // the conv runs alone and the group after it.
    let mut g = Graph::new("nofuse");
    let x = f32in(&mut g, "x", &[1, 3, 6, 6]);
    let w = cst(&mut g, Tensor::from_f32([4, 3, 3, 3], &ramp(108, 0.5, 0.0)));
    let y = node(&mut g, Op::Conv(conv_attrs(&[1, 1], &[1; 4], &[1, 1], 1)), &[x, w]);
    let r = f32in(&mut g, "r", &[1, 1, 1, 6]);
    let z = node(&mut g, bin(BinaryOp::Add), &[y, r]);
    g.outputs.push(z);
    cases.push(case("conv_unfusable_epilogue", g));
    // ConvTranspose.
    for (name, x, w, a, bias) in [
        ("ct2d", vec![1, 4, 5, 5], vec![4, 3, 3, 3], ConvTransposeAttrs { strides: vec![2, 2], pads: vec![1, 1, 0, 1], dilations: vec![1, 1], group: 1, output_padding: vec![1, 0] }, true),
        ("ct1d_group", vec![2, 4, 4], vec![4, 2, 3], ConvTransposeAttrs { strides: vec![1], pads: vec![0, 0], dilations: vec![2], group: 2, output_padding: vec![0] }, false),
    ] {
        let mut g = Graph::new(name);
        let xv = f32in(&mut g, "x", &x);
        let wn: usize = w.iter().product();
        let wv = cst(&mut g, Tensor::from_f32(w.clone(), &ramp(wn, 0.5, 0.0)));
        let mut ins = vec![xv, wv];
        if bias {
            let m = w[1] * a.group;
            ins.push(cst(&mut g, Tensor::from_f32([m], &ramp(m, 1.0, 0.0))));
        }
        let y = node(&mut g, Op::ConvTranspose(a), &ins);
        g.outputs.push(y);
        cases.push(case(&format!("convtranspose_{name}"), g));
    }
    run(cases);
}

// ---- pools, reductions, normalizations ------------------------------------------------------------------------

#[test]
fn pools() {
    let mut cases = Vec::new();
    let p = |k: &[usize], s: &[usize], pads: &[usize], d: &[usize], ceil: bool| PoolAttrs { kernel: k.to_vec(), strides: s.to_vec(), pads: pads.to_vec(), dilations: d.to_vec(), ceil_mode: ceil };
    let variants = [
        ("k3s2p1", vec![1, 2, 9, 9], p(&[3, 3], &[2, 2], &[1, 1, 1, 1], &[1, 1], false)),
        ("ceil", vec![2, 3, 6, 7], p(&[3, 3], &[2, 2], &[0, 0, 0, 0], &[1, 1], true)),
        ("ceil_pad", vec![1, 1, 7, 7], p(&[3, 2], &[2, 3], &[1, 0, 1, 1], &[1, 1], true)),
        ("dil1d", vec![2, 2, 11], p(&[3], &[2], &[2, 1], &[2], false)),
        ("k2s2", vec![1, 4, 8, 8], p(&[2, 2], &[2, 2], &[0; 4], &[1, 1], false)),
        // 2-D with dilation: MaxPool's general loop (without dilation it has a loop of its own).
        ("dil2d", vec![1, 2, 9, 8], p(&[2, 3], &[1, 2], &[1, 2, 0, 1], &[2, 2], false)),
        // Padding as large as allowed (one tap inside at the edges), strides larger than the kernel.
        ("pad_max", vec![1, 2, 5, 7], p(&[3, 3], &[4, 3], &[2, 2, 2, 2], &[1, 1], false)),
    ];
    for (name, shape, attrs) in variants {
        for (kind, op) in [
            ("max", Op::MaxPool(attrs.clone())),
            ("avg", Op::AveragePool { pool: attrs.clone(), count_include_pad: false }),
            ("avgpad", Op::AveragePool { pool: attrs.clone(), count_include_pad: true }),
        ] {
            let mut g = Graph::new(name);
            let x = f32in(&mut g, "x", &shape);
            let y = node(&mut g, op, &[x]);
            g.outputs.push(y);
            cases.push(case(&format!("pool_{kind}_{name}"), g));
        }
    }
    // NaN and infinities through both MaxPool loops: a NaN in a window wins, -inf alone stays above no value.
    let special = [f32::NAN, 1.0, -2.0, f32::INFINITY, f32::NEG_INFINITY, 0.5, -0.25, 3.0, -1.0, 2.0, f32::NEG_INFINITY];
    for (name, attrs) in [("2d", p(&[3, 3], &[2, 2], &[1, 1, 1, 1], &[1, 1], false)), ("2d_dil", p(&[2, 2], &[1, 1], &[1, 1, 0, 0], &[2, 2], false))] {
        let mut g = Graph::new("pool_special");
        let x = f32in(&mut g, "x", &[1, 2, 7, 6]);
        let y = node(&mut g, Op::MaxPool(attrs), &[x]);
        g.outputs.push(y);
        cases.push(case_with(&format!("pool_max_special_{name}"), g, true, move |_, t| {
            Some(Tensor::from_f32(t.shape.clone(), &(0..84).map(|i| if i % 13 == 0 || i % 7 == 3 { special[i % 11] } else { i as f32 * 0.1 - 4.0 }).collect::<Vec<_>>()))
        }));
    }
    let mut g = Graph::new("gap");
    let x = f32in(&mut g, "x", &[2, 5, 4, 3]);
    let y = node(&mut g, Op::GlobalAveragePool, &[x]);
    g.outputs.push(y);
    cases.push(case("gap", g));
    run(cases);
}

#[test]
fn reductions() {
    let mut cases = Vec::new();
    let axes_list: [&[usize]; 6] = [&[2], &[0], &[1], &[0, 2], &[0, 1, 2], &[1, 2]];
    for (i, axes) in axes_list.iter().enumerate() {
        for kind in [ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max, ReduceKind::Min] {
            for keepdims in [false, true] {
                let mut g = Graph::new("red");
                let x = f32in(&mut g, "x", &[3, 4, 5]);
                let y = node(&mut g, Op::Reduce { kind, axes: axes.to_vec(), keepdims }, &[x]);
                g.outputs.push(y);
                cases.push(case(&format!("reduce_{kind:?}_{i}_{keepdims}"), g));
            }
        }
    }
    for d in [DType::I64, DType::I32] {
        for kind in [ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max, ReduceKind::Min] {
            for axes in [vec![1], vec![0]] {
                let mut g = Graph::new("redi");
                let x = g.add_input("x", TensorType::new(d, [3, 4]));
                let c = cst(&mut g, Tensor::from_f64_as(d, Vec::new(), &[50.0]));
                let xs = node(&mut g, bin(BinaryOp::Sub), &[x, c]);
                let y = node(&mut g, Op::Reduce { kind, axes: axes.clone(), keepdims: false }, &[xs]);
                g.outputs.push(y);
                cases.push(case(&format!("reduce_{d}_{kind:?}_{}", axes[0]), g));
            }
        }
    }
    // Reducing a size-1 axis, and an empty one.
    let mut g = Graph::new("red1");
    let x = f32in(&mut g, "x", &[3, 1, 4]);
    let y = node(&mut g, Op::Reduce { kind: ReduceKind::Mean, axes: vec![1], keepdims: false }, &[x]);
    g.outputs.push(y);
    cases.push(case("reduce_size1", g));
    let mut g = Graph::new("red0");
    let x = f32in(&mut g, "x", &[3, 0]);
    let y = node(&mut g, Op::Reduce { kind: ReduceKind::Sum, axes: vec![1], keepdims: false }, &[x]);
    g.outputs.push(y);
    cases.push(case("reduce_empty", g));
    run(cases);
}

#[test]
fn softmax_and_norms() {
    let mut cases = Vec::new();
    for axis in 0..3 {
        for log in [false, true] {
            let mut g = Graph::new("sm");
            let x = f32in(&mut g, "x", &[2, 3, 5]);
            let xs = scaled(&mut g, x, 10.0);
            let op = if log { Op::LogSoftmax { axis } } else { Op::Softmax { axis } };
            let y = node(&mut g, op, &[xs]);
            g.outputs.push(y);
            cases.push(case(&format!("softmax_{axis}_{log}"), g));
        }
    }
    for (name, axis, scale_shape, bias) in [("last", 2, vec![8], true), ("two_axes", 1, vec![3, 8], true), ("scalar_scale", 2, vec![1], false), ("row_scale", 1, vec![3, 1], true)] {
        let mut g = Graph::new(name);
        let x = f32in(&mut g, "x", &[2, 3, 8]);
        let n: usize = scale_shape.iter().product();
        let s = cst(&mut g, Tensor::from_f32(scale_shape.clone(), &ramp(n, 1.0, 1.0)));
        let mut ins = vec![x, s];
        if bias {
            ins.push(cst(&mut g, Tensor::from_f32(scale_shape.clone(), &ramp(n, 0.5, 0.0))));
        }
        let y = node(&mut g, Op::LayerNorm { axis, epsilon: 1e-5 }, &ins);
        g.outputs.push(y);
        cases.push(case(&format!("layernorm_{name}"), g));
    }
    let mut g = Graph::new("bn");
    let x = f32in(&mut g, "x", &[2, 3, 4, 4]);
    let ps: Vec<ValueId> = (0..4).map(|i| f32in(&mut g, &format!("p{i}"), &[3])).collect();
    let var = node(&mut g, un(UnaryOp::Abs), &[ps[3]]);
    let y = node(&mut g, Op::BatchNorm { epsilon: 1e-3 }, &[x, ps[0], ps[1], ps[2], var]);
    g.outputs.push(y);
    cases.push(case("batchnorm", g));
    run(cases);
}

// ---- data movement -------------------------------------------------------------------------------------------

#[test]
fn data_movement() {
    let mut cases = Vec::new();
    for d in [DType::F32, DType::I64, DType::Bool] {
        let mut g = Graph::new("mv");
        let x = g.add_input("x", TensorType::new(d, [2, 3, 4]));
        let y = g.add_input("y", TensorType::new(d, [2, 3, 2]));
        let outs = vec![
            node(&mut g, Op::Transpose { perm: vec![2, 0, 1] }, &[x]),
            node(&mut g, Op::Transpose { perm: vec![1, 0, 2] }, &[x]),
            node(&mut g, Op::Concat { axis: 2 }, &[x, y, x]),
            node(&mut g, Op::Slice { axes: vec![0, 2], starts: vec![1, 3], ends: vec![2, -1], steps: vec![1, -2] }, &[x]),
            node(&mut g, Op::Slice { axes: vec![1], starts: vec![0], ends: vec![3], steps: vec![2] }, &[x]),
            node(&mut g, Op::Expand { shape: vec![3, 2, 3, 4] }, &[x]),
            node(&mut g, Op::Tile { repeats: vec![2, 1, 3] }, &[y]),
            node(&mut g, Op::Pad { pads: vec![1, 0, -1, 0, 2, 2], mode: PadMode::Constant, value: 1.5 }, &[x]),
            node(&mut g, Op::Pad { pads: vec![0, 2, 3, 1, 1, 2], mode: PadMode::Reflect, value: 0.0 }, &[x]),
            node(&mut g, Op::Pad { pads: vec![1, 1, 0, 0, 2, 5], mode: PadMode::Edge, value: 0.0 }, &[x]),
            node(&mut g, Op::Reshape { shape: vec![6, 4] }, &[x]),
        ];
        let split = g.add_node("split", Op::Split { axis: 1, sizes: vec![1, 2] }, &[y]).unwrap();
        let cc = node(&mut g, Op::Concat { axis: 0 }, &[x, x]);
        g.outputs.extend(outs);
        g.outputs.extend(split);
        g.outputs.push(cc);
        cases.push(case(&format!("movement_{d}"), g));
    }
    // Gather: inline negative indices (i64), input indices (i32), and an embedding table with a lifted weight.
    let mut g = Graph::new("gather");
    let x = f32in(&mut g, "x", &[5, 3, 4]);
    let i1 = cst(&mut g, Tensor::from_i64([3], &[-1, 0, 2]));
    let a = node(&mut g, Op::Gather { axis: 0 }, &[x, i1]);
    let i2 = g.add_input("i2", TensorType::new(DType::I32, [2, 2]));
    let b = node(&mut g, Op::Gather { axis: 1 }, &[x, i2]);
    let table = cst(&mut g, Tensor::from_f32([50, 16], &ramp(800, 1.0, 0.0)));
    let tok = g.add_input("tok", TensorType::new(DType::I64, [2, 3]));
    let e = node(&mut g, Op::Gather { axis: 0 }, &[table, tok]);
    let ie = g.add_input("ie", TensorType::new(DType::I64, [5, 2, 4]));
    let ge = node(&mut g, Op::GatherElements { axis: 1 }, &[x, ie]);
    g.outputs.extend([a, b, e, ge]);
    cases.push(case("gather", g));
    // Aliases and copies: an input returned as an output, a reshape of an input, an identity.
    let mut g = Graph::new("alias");
    let x = f32in(&mut g, "x", &[2, 6]);
    let r = node(&mut g, Op::Reshape { shape: vec![3, 4] }, &[x]);
    let i = node(&mut g, Op::Identity, &[x]);
    let e = node(&mut g, un(UnaryOp::Exp), &[r]);
    g.outputs.extend([r, i, e]);
    cases.push(case("aliases", g));
    run(cases);
}

// ---- fused kernels -----------------------------------------------------------------------------------------

/// Number of item functions in a kernel's source (one per loop nest / GEMM / dedicated op).
fn items(code: &[u8]) -> usize {
    // Item functions, not the range functions of their parallel loops.
    String::from_utf8_lossy(code).lines().filter(|l| l.contains("static void") && !l.contains("_range")).count()
}

#[test]
fn fused_kernels() {
    let mut cases = Vec::new();
    // matmul + bias + gelu: one item (the GEMM with its epilogue).
    let mut g = Graph::new("mlp");
    let x = f32in(&mut g, "x", &[8, 64]);
    let w = cst(&mut g, Tensor::from_f32([64, 96], &ramp(64 * 96, 0.3, 0.0)));
    let b = cst(&mut g, Tensor::from_f32([96], &ramp(96, 1.0, 0.0)));
    let m = node(&mut g, Op::MatMul, &[x, w]);
    let a = node(&mut g, bin(BinaryOp::Add), &[m, b]);
    let y = node(&mut g, Op::Gelu { approximate: GeluApprox::Erf }, &[a]);
    g.outputs.push(y);
    let mlp = case("fused_matmul_bias_gelu", g);
    // conv + bias + relu: one item.
    let mut g = Graph::new("cbr");
    let x = f32in(&mut g, "x", &[1, 8, 10, 10]);
    let w = cst(&mut g, Tensor::from_f32([16, 8, 3, 3], &ramp(16 * 72, 0.3, 0.0)));
    let b = cst(&mut g, Tensor::from_f32([16], &ramp(16, 1.0, 0.0)));
    let c = node(&mut g, Op::Conv(conv_attrs(&[1, 1], &[1; 4], &[1, 1], 1)), &[x, w, b]);
    let y = node(&mut g, un(UnaryOp::Relu), &[c]);
    g.outputs.push(y);
    let cbr = case("fused_conv_bias_relu", g);
    // Residual + layer norm chain: h = x + r; y = LN(h) * 2 + h.
    let mut g = Graph::new("ln");
    let x = f32in(&mut g, "x", &[4, 32]);
    let r = f32in(&mut g, "r", &[4, 32]);
    let s = cst(&mut g, Tensor::from_f32([32], &ramp(32, 1.0, 1.0)));
    let bb = cst(&mut g, Tensor::from_f32([32], &ramp(32, 0.5, 0.0)));
    let h = node(&mut g, bin(BinaryOp::Add), &[x, r]);
    let n = node(&mut g, Op::LayerNorm { axis: 1, epsilon: 1e-5 }, &[h, s, bb]);
    let two = cst(&mut g, Tensor::scalar_f32(2.0));
    let t = node(&mut g, bin(BinaryOp::Mul), &[n, two]);
    let y = node(&mut g, bin(BinaryOp::Add), &[t, h]);
    g.outputs.push(y);
    let ln = case("fused_residual_layernorm", g);
    // Attention: softmax(Q K^T / sqrt(d)) V.
    let mut g = Graph::new("attn");
    let q = f32in(&mut g, "q", &[2, 6, 8]);
    let k = f32in(&mut g, "k", &[2, 6, 8]);
    let v = f32in(&mut g, "v", &[2, 6, 8]);
    let kt = node(&mut g, Op::Transpose { perm: vec![0, 2, 1] }, &[k]);
    let s = node(&mut g, Op::MatMul, &[q, kt]);
    let sc = cst(&mut g, Tensor::scalar_f32(1.0 / 8f32.sqrt()));
    let s2 = node(&mut g, bin(BinaryOp::Mul), &[s, sc]);
    let p = node(&mut g, Op::Softmax { axis: 2 }, &[s2]);
    let o = node(&mut g, Op::MatMul, &[p, v]);
    g.outputs.push(o);
    let attn = case("fused_attention", g);

    let t = target();
    let count = |c: &Case| items(&CBackend.lower(&t, &c.kernel, "k").unwrap().code);
    assert_eq!(count(&mlp), 1, "matmul + bias + gelu is one GEMM with its epilogue");
    assert_eq!(count(&cbr), 1, "conv + bias + relu is one GEMM with its epilogue");
    // add (stored: read twice) ; layer norm ; mul+add
    assert_eq!(count(&ln), 3);
    // transpose ; matmul*scale ; softmax ; matmul
    assert_eq!(count(&attn), 4);
    cases.extend([mlp, cbr, ln, attn]);
    run(cases);
}

#[test]
fn elementwise_chains_fuse_into_one_loop() {
    let mut g = Graph::new("chain");
    let x = f32in(&mut g, "x", &[4, 8]);
    let y = f32in(&mut g, "y", &[8]);
    let a = node(&mut g, bin(BinaryOp::Add), &[x, y]);
    let b = node(&mut g, un(UnaryOp::Tanh), &[a]);
    let c = node(&mut g, un(UnaryOp::Exp), &[x]);
    let d = node(&mut g, bin(BinaryOp::Mul), &[b, c]);
    let e = node(&mut g, un(UnaryOp::Sigmoid), &[d]);
    g.outputs.push(e);
    let c = case("chain", g);
    let lk = CBackend.lower(&target(), &c.kernel, "k").unwrap();
    assert_eq!(items(&lk.code), 1);
    assert_eq!(lk.info.scratch_bytes, 0, "no intermediate reaches memory");
    run(vec![c]);
}

#[test]
fn scratch_is_reused_across_lifetimes() {
    // A chain of ops that each materialize: softmax, transpose, softmax, transpose, ...
    let mut g = Graph::new("chain");
    let x = f32in(&mut g, "x", &[16, 32]);
    let mut v = x;
    let mut intermediates = 0usize;
    for _ in 0..6 {
        v = node(&mut g, Op::Softmax { axis: 1 }, &[v]);
        intermediates += g.ty(v).size_bytes();
        v = node(&mut g, Op::Transpose { perm: vec![1, 0] }, &[v]);
        intermediates += g.ty(v).size_bytes();
    }
    g.outputs.push(v);
    let c = case("scratch_chain", g);
    let lk = CBackend.lower(&target(), &c.kernel, "k").unwrap();
    let last = g_last_size(&c.kernel);
    assert!(lk.info.scratch_bytes > 0);
    assert!(
        (lk.info.scratch_bytes as usize) < intermediates - last,
        "scratch {} should be well below the {} bytes of intermediates",
        lk.info.scratch_bytes,
        intermediates - last
    );
    // Two live buffers of 2 KiB plus the softmax row temp suffice.
    assert!(lk.info.scratch_bytes <= 2 * 2048 + 2 * 256, "scratch {}", lk.info.scratch_bytes);
    run(vec![c]);
}

fn g_last_size(g: &Graph) -> usize {
    g.ty(g.outputs[0]).size_bytes()
}

// ---- determinism and errors ----------------------------------------------------------------------------------

#[test]
fn lowering_is_deterministic_and_name_independent() {
    let build = |prefix: &str, swap: bool| {
        let mut g = Graph::new("m");
        let x = f32in(&mut g, &format!("{prefix}x"), &[4, 8]);
        let w = cst(&mut g, Tensor::from_f32([8, 8], &ramp(64, 1.0, 0.0)));
        let (a, b) = if swap {
            let b = node(&mut g, un(UnaryOp::Exp), &[x]);
            (node(&mut g, Op::MatMul, &[x, w]), b)
        } else {
            let a = node(&mut g, Op::MatMul, &[x, w]);
            (a, node(&mut g, un(UnaryOp::Exp), &[x]))
        };
        let y = node(&mut g, bin(BinaryOp::Add), &[a, b]);
        g.outputs.push(y);
        kernel_of(&g).0
    };
    let t = target();
    let k1 = CBackend.lower(&t, &build("a", false), "k").unwrap();
    let k2 = CBackend.lower(&t, &build("b", true), "k").unwrap();
    assert_eq!(k1, k2);
}

#[test]
fn modules_are_byte_identical_across_directories() {
    let mut g = Graph::new("m");
    let x = f32in(&mut g, "x", &[4, 8]);
    let y = node(&mut g, Op::Softmax { axis: 1 }, &[x]);
    g.outputs.push(y);
    let t = target();
    let k = CBackend.lower(&t, &kernel_of(&g).0, "k_det").unwrap();
    // Each compile runs in a fresh temporary directory of its own.
    let m1 = CBackend.compile_module(&t, std::slice::from_ref(&k)).unwrap();
    let m2 = CBackend.compile_module(&t, std::slice::from_ref(&k)).unwrap();
    assert_eq!(m1.bytes, m2.bytes);
    assert!(m1.bytes.starts_with(b"\x7fELF"));
    let faster = Target::parse("cpu -compiler=c -opt-level=3").unwrap();
    let m3 = CBackend.compile_module(&faster, &[k]).unwrap();
    assert_ne!(m1.bytes, m3.bytes, "the target's flags reach the compiler");
    assert_eq!(m3.target, faster.canonical());
}

#[test]
fn compiler_errors_name_the_kernel() {
    let t = target();
    let mut g = Graph::new("m");
    let x = f32in(&mut g, "x", &[4]);
    let y = node(&mut g, un(UnaryOp::Relu), &[x]);
    g.outputs.push(y);
    let good = CBackend.lower(&t, &kernel_of(&g).0, "k_good").unwrap();
    let bad = LoweredKernel { info: FunctionInfo { symbol: "k_bad".into(), inputs: vec![], outputs: vec![], scratch_bytes: 0 }, code: b"void k_bad(void* const* args) {\n    this is not C;\n}\n".to_vec() };
    let e = CBackend.compile_module(&t, &[good, bad]).unwrap_err();
    // A compile failure (not a missing compiler), located in the bad kernel alone.
    let BackendError::Compile { backend, tool, kernels, located, log } = &e else { panic!("not a compile failure: {e:?}") };
    assert_eq!((backend.as_str(), *tool, kernels.as_slice(), *located), ("c", "C", ["k_bad".to_string()].as_slice(), true), "{e}");
    assert!(log.contains("module.c:"), "{e}");
    let shown = e.to_string();
    assert!(shown.starts_with("backend c: C compilation failed in kernel k_bad:\n") && !shown.contains("k_good"), "{shown}");
}

#[test]
fn refuses_fp16_and_bad_symbols() {
    let t = target();
    let mut g = Graph::new("m");
    let x = g.add_input("x", TensorType::new(DType::F16, [4]));
    let y = node(&mut g, un(UnaryOp::Relu), &[x]);
    g.outputs.push(y);
    assert!(!CBackend.supports(&g, NodeId(0), &t));
    // An op it cannot run is a refusal (the tune stage costs it as unsupported)...
    let e = CBackend.lower(&t, &g, "k").unwrap_err();
    assert!(matches!(&e, BackendError::Unsupported { why, .. } if why.contains("f16") && why.contains("Relu")), "{e:?}");
    let mut g = Graph::new("m");
    let x = f32in(&mut g, "x", &[4]);
    let y = node(&mut g, un(UnaryOp::Relu), &[x]);
    g.outputs.push(y);
    assert!(CBackend.supports(&g, NodeId(0), &t));
    assert!(CBackend.lower(&t, &g, "not a symbol").is_err());
    // ...a target selecting another backend is an invalid request.
    let gemm = Target::parse("cpu -compiler=gemm").unwrap();
    assert!(matches!(CBackend.lower(&gemm, &g, "k"), Err(BackendError::Invalid { .. })));
}

#[test]
fn cost_grows_with_work_and_rewards_fusion() {
    let t = target();
    let mut g = Graph::new("m");
    let x = f32in(&mut g, "x", &[64, 256]);
    let w = cst(&mut g, Tensor::from_f32([256, 256], &ramp(65536, 1.0, 0.0)));
    let m = node(&mut g, Op::MatMul, &[x, w]);
    let r = node(&mut g, un(UnaryOp::Relu), &[m]);
    g.outputs.push(r);
    let both = CBackend.estimate_us(&g, &[NodeId(0), NodeId(1)], &t);
    let mm = CBackend.estimate_us(&g, &[NodeId(0)], &t);
    let relu = CBackend.estimate_us(&g, &[NodeId(1)], &t);
    assert!(both > 0.0 && mm > relu);
    assert!(both < mm + relu, "fusing saves the intermediate's round trip and a call");
}

#[test]
fn available_finds_a_compiler() {
    CBackend.available().unwrap();
    assert!(!toolchain::toolchain().unwrap().version.is_empty());
}

#[test]
#[ignore]
fn dump_sources() {
    let mut g = Graph::new("mlp");
    let x = f32in(&mut g, "x", &[8, 64]);
    let w = cst(&mut g, Tensor::from_f32([64, 96], &ramp(64 * 96, 0.3, 0.0)));
    let b = cst(&mut g, Tensor::from_f32([96], &ramp(96, 1.0, 0.0)));
    let m = node(&mut g, Op::MatMul, &[x, w]);
    let a = node(&mut g, bin(BinaryOp::Add), &[m, b]);
    let y = node(&mut g, Op::Gelu { approximate: GeluApprox::Erf }, &[a]);
    g.outputs.push(y);
    let k = CBackend.lower(&target(), &kernel_of(&g).0, "k_mlp").unwrap();
    println!("{}", String::from_utf8_lossy(&k.code));
    let mut g = Graph::new("chain");
    let x = f32in(&mut g, "x", &[4, 8]);
    let y = f32in(&mut g, "y", &[8]);
    let a = node(&mut g, bin(BinaryOp::Add), &[x, y]);
    let b = node(&mut g, un(UnaryOp::Tanh), &[a]);
    let c = node(&mut g, Op::Reduce { kind: ReduceKind::Sum, axes: vec![0], keepdims: false }, &[b]);
    g.outputs.extend([c, a]);
    let k = CBackend.lower(&target(), &kernel_of(&g).0, "k_chain").unwrap();
    println!("{}", String::from_utf8_lossy(&k.code));
}

/// Timing of generated kernels against the reference interpreter (run with --ignored --nocapture).
#[test]
#[ignore]
fn bench_against_reference() {
    let mut cases = Vec::new();
    let mut g = Graph::new("mm");
    let a = f32in(&mut g, "a", &[512, 512]);
    let w = cst(&mut g, Tensor::from_f32([512, 512], &ramp(512 * 512, 0.1, 0.0)));
    let b = cst(&mut g, Tensor::from_f32([512], &ramp(512, 0.1, 0.0)));
    let m = node(&mut g, Op::MatMul, &[a, w]);
    let y = node(&mut g, bin(BinaryOp::Add), &[m, b]);
    let r = node(&mut g, un(UnaryOp::Relu), &[y]);
    g.outputs.push(r);
    cases.push(("matmul512_bias_relu", case("bench_mm", g), 2.0 * 512f64.powi(3)));
    let mut g = Graph::new("conv");
    let x = f32in(&mut g, "x", &[1, 64, 56, 56]);
    let w = cst(&mut g, Tensor::from_f32([64, 64, 3, 3], &ramp(64 * 576, 0.1, 0.0)));
    let c = node(&mut g, Op::Conv(conv_attrs(&[1, 1], &[1; 4], &[1, 1], 1)), &[x, w]);
    let r = node(&mut g, un(UnaryOp::Relu), &[c]);
    g.outputs.push(r);
    cases.push(("conv3x3_64x56x56_relu", case("bench_conv", g), 2.0 * 64.0 * 56.0 * 56.0 * 576.0));
    let mut g = Graph::new("dw");
    let x = f32in(&mut g, "x", &[1, 128, 56, 56]);
    let w = cst(&mut g, Tensor::from_f32([128, 1, 3, 3], &ramp(128 * 9, 0.1, 0.0)));
    let c = node(&mut g, Op::Conv(conv_attrs(&[1, 1], &[1; 4], &[1, 1], 128)), &[x, w]);
    g.outputs.push(c);
    cases.push(("depthwise3x3_128x56x56", case("bench_dw", g), 2.0 * 128.0 * 56.0 * 56.0 * 9.0));
    let mut g = Graph::new("ew");
    let x = f32in(&mut g, "x", &[1 << 20]);
    let y = f32in(&mut g, "y", &[1 << 20]);
    let a = node(&mut g, bin(BinaryOp::Add), &[x, y]);
    let b = node(&mut g, un(UnaryOp::Relu), &[a]);
    let c = node(&mut g, bin(BinaryOp::Mul), &[b, x]);
    g.outputs.push(c);
    cases.push(("add_relu_mul_1M", case("bench_ew", g), 3.0 * (1 << 20) as f64));
    let mut g = Graph::new("ln");
    let x = f32in(&mut g, "x", &[128, 768]);
    let s = cst(&mut g, Tensor::from_f32([768], &ramp(768, 1.0, 1.0)));
    let y = node(&mut g, Op::LayerNorm { axis: 1, epsilon: 1e-5 }, &[x, s]);
    let z = node(&mut g, Op::Softmax { axis: 1 }, &[y]);
    g.outputs.push(z);
    cases.push(("layernorm_softmax_128x768", case("bench_ln", g), 0.0));
    let be = CBackend;
    // The bench (only) may try another target, e.g. "cpu -compiler=c -march=x86-64-v3".
    let t = std::env::var("TESSERA_BENCH_TARGET").map(|s| Target::parse(&s).unwrap()).unwrap_or_else(|_| target());
    println!("target: {t}");
    let lowered: Vec<LoweredKernel> = cases.iter().map(|(_, c, _)| be.lower(&t, &c.kernel, &symbol(&c.name)).unwrap()).collect();
    let t0 = Instant::now();
    let module = be.compile_module(&t, &lowered).unwrap();
    println!("module of {} kernels compiled in {:.2}s", lowered.len(), t0.elapsed().as_secs_f64());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.so");
    std::fs::write(&path, &module.bytes).unwrap();
    let lib = unsafe { libloading::Library::new(&path) }.unwrap();
    for ((name, c, flops), lk) in cases.iter().zip(&lowered) {
        let mut ins: Vec<Vec<u8>> = c.inputs.iter().map(|t| t.bytes().to_vec()).collect();
        let mut outs: Vec<Vec<u64>> = lk.info.outputs.iter().map(|t| buffer(t.size_bytes(), 0)).collect();
        let mut scratch = buffer(lk.info.scratch_bytes as usize, 0);
        let mut args: Vec<*mut c_void> = ins.iter_mut().map(|b| b.as_mut_ptr() as *mut c_void).collect();
        args.extend(outs.iter_mut().map(|b| b.as_mut_ptr() as *mut c_void));
        args.push(scratch.as_mut_ptr() as *mut c_void);
        let f: libloading::Symbol<unsafe extern "C" fn(*const *mut c_void)> = unsafe { lib.get(lk.info.symbol.as_bytes()) }.unwrap();
        unsafe { f(args.as_ptr()) };
        let iters = 10;
        let t0 = Instant::now();
        for _ in 0..iters {
            unsafe { f(args.as_ptr()) };
        }
        let ours = t0.elapsed().as_secs_f64() / iters as f64;
        let t0 = Instant::now();
        run_graph(&c.kernel, &c.inputs).unwrap();
        let reference = t0.elapsed().as_secs_f64();
        let gf = if *flops > 0.0 { format!("{:.1} GFLOP/s", flops / ours / 1e9) } else { String::new() };
        println!("{name:28} c: {:8.3} ms {gf:>14}   reference: {:8.3} ms", ours * 1e3, reference * 1e3);
    }
}

/// Attention in every shape of the shared cases (K layouts, broadcast batches, masks, NaN rows, no keys),
/// and fed by and feeding other items (its operands in scratch, its result read by a fused group).
#[test]
fn attention_matches_the_reference() {
    let mut cases: Vec<Case> = crate::backend::attention_cases::cases()
        .into_iter()
        .map(|c| {
            let nan = c.may_be_nan();
            case_with(&format!("attention_{}", c.name), c.graph(), nan, |_, _| None)
        })
        .collect();
    // q computed by a group and the result consumed by one: the item reads and writes scratch.
    let mut g = Graph::new("attention_in_a_kernel");
    let x = f32in(&mut g, "x", &[2, 4, 16]);
    let q = node(&mut g, un(UnaryOp::Tanh), &[x]);
    let k = f32in(&mut g, "k", &[2, 16, 4]);
    let v = node(&mut g, Op::Reshape { shape: vec![2, 4, 16] }, &[x]);
    let a = AttentionAttrs { scale: 0.25, k_transposed: true, mask: false, keep_fill: None, nan_to_zero: false };
    let y = node(&mut g, Op::Attention(a), &[q, k, v]);
    let z = node(&mut g, un(UnaryOp::Relu), &[y]);
    g.outputs.push(z);
    cases.push(case("attention_in_a_kernel", g));
    run(cases);
}

/// Attention, LayerNorm, Softmax and elementwise groups with enough rows that their rows run in parallel ranges on the runtime's
/// threads (`Func::parallel_for`): the code calls the runtime's parallel-for, and every row still matches the
/// reference (rows share no scratch: a race would show here as wrong rows).
#[test]
fn rows_in_parallel_match_the_reference() {
    let mut cases = Vec::new();
    for (name, k_transposed) in [("parallel_attention", false), ("parallel_attention_kt", true)] {
        let mut g = Graph::new(name);
        let q = f32in(&mut g, "q", &[3, 96, 32]);
        let k = f32in(&mut g, "k", if k_transposed { &[3, 32, 80] } else { &[3, 80, 32] });
        let v = f32in(&mut g, "v", &[3, 80, 24]);
        let a = AttentionAttrs { scale: 0.18, k_transposed, mask: false, keep_fill: None, nan_to_zero: false };
        let y = node(&mut g, Op::Attention(a), &[q, k, v]);
        g.outputs.push(y);
        cases.push(case(name, g));
    }
    let mut g = Graph::new("parallel_layer_norm");
    let x = f32in(&mut g, "x", &[300, 160]);
    let sc = f32in(&mut g, "s", &[160]);
    let b = f32in(&mut g, "b", &[160]);
    let y = node(&mut g, Op::LayerNorm { axis: 1, epsilon: 1e-5 }, &[x, sc, b]);
    g.outputs.push(y);
    cases.push(case("parallel_layer_norm", g));
    let mut g = Graph::new("parallel_softmax");
    let x = f32in(&mut g, "x", &[2, 150, 256]);
    let y = node(&mut g, Op::Softmax { axis: 2 }, &[x]);
    g.outputs.push(y);
    cases.push(case("parallel_softmax", g));
    // Elementwise groups: one coalesced loop in blocks (the last one partial), and a broadcast nest by rows.
    let mut g = Graph::new("parallel_elementwise_flat");
    let x = f32in(&mut g, "x", &[70001]);
    let t = node(&mut g, un(UnaryOp::Tanh), &[x]);
    let y = node(&mut g, bin(BinaryOp::Mul), &[t, x]);
    g.outputs.push(y);
    cases.push(case("parallel_elementwise_flat", g));
    let mut g = Graph::new("parallel_elementwise_rows");
    let x = f32in(&mut g, "x", &[300, 1, 200]);
    let b = f32in(&mut g, "b", &[7, 200]);
    let s = node(&mut g, bin(BinaryOp::Add), &[x, b]);
    let y = node(&mut g, un(UnaryOp::Relu), &[s]);
    g.outputs.push(y);
    cases.push(case("parallel_elementwise_rows", g));
    let t = target();
    for c in &cases {
        let code = String::from_utf8_lossy(&CBackend.lower(&t, &c.kernel, "k").unwrap().code).to_string();
        assert!(code.contains("tsr_parallel_for("), "{}: no parallel loop", c.kernel.name);
    }
    run(cases);
}

// ---- CumSum, GatherND, ScatterND -----------------------------------------------------------------------

/// Cos, Sin, ... Round, Softplus, Mish (`backend/unary_cases.rs`, shared with the cuda backend's tests).
#[test]
fn math_unary_ops_match_the_reference() {
    run(crate::backend::unary_cases::cases().into_iter().map(|(name, g)| case(&format!("math_{name}"), g)).collect());
}

#[test]
fn scan_and_nd_ops_match_the_reference() {
    run(crate::backend::scan_nd_cases::cases().into_iter().map(|(name, g)| case(name, g)).collect());
}
