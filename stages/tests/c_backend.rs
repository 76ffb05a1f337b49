//! Whole zoo models through the c backend: each model (small batch, image and sequence sizes) is extracted as
//! one kernel, lowered, compiled into one module with the others, run on seeded random inputs with the
//! model's real weights, and compared with the reference interpreter (f32 within 1e-4 relative to the element
//! or to the output's mean magnitude; integer outputs exactly).

use std::ffi::c_void;
use std::time::Instant;
use tessera_fixtures::registry::{build_with, ModelOptions};
use tessera_stages::backend::c::CBackend;
use tessera_stages::backend::{Backend, LoweredKernel, INLINE_CONST_MAX};
use tessera_stages::interp::{random_tensor, run_graph};
use tessera_stages::ir::{extract_subgraph, subgraph_signature, ConstMode, DType, Graph, NodeId, Tensor, ValueDef};
use tessera_stages::target::Target;

struct Model {
    name: String,
    kernel: Graph,
    inputs: Vec<Tensor>,
}

/// The model as one kernel; lifted constants get their real values, model inputs seeded random values
/// (integers below the smallest table they index, as `interp::random_inputs` bounds them). `simplified`:
/// after the graph passes the pipeline runs (attention fused into one op).
fn model(name: &str, opts: ModelOptions, simplified: bool) -> Model {
    let mut g = build_with(name, &opts).unwrap();
    if simplified {
        let r = tessera_stages::passes::simplify::simplify(&mut g).unwrap();
        assert!(r.attentions > 0, "{name}: the simplified graph has Attention ops");
    }
    let all: Vec<NodeId> = (0..g.nodes.len() as u32).map(NodeId).collect();
    let sig = subgraph_signature(&g, &all, ConstMode::LiftLarge(INLINE_CONST_MAX));
    let kernel = extract_subgraph(&g, &sig);
    let random = tessera_stages::interp::random_inputs(&kernel, 7);
    let inputs = sig
        .inputs
        .iter()
        .zip(random)
        .enumerate()
        .map(|(k, (&v, r))| match &g.value(v).def {
            ValueDef::Const(t) => t.clone(),
            _ if kernel.ty(kernel.inputs[k]).dtype == DType::F32 => random_tensor(kernel.ty(kernel.inputs[k]), 7, k as u64, 1),
            _ => r,
        })
        .collect();
    Model { name: format!("{name}{}", if simplified { "-simplified" } else { "" }), kernel, inputs }
}

fn close(got: &[u8], want: &Tensor) -> Result<(), String> {
    if want.dtype() != DType::F32 {
        return if got == want.bytes() { Ok(()) } else { Err("integer output differs".into()) };
    }
    let g: Vec<f32> = got.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let w = want.to_f32_vec();
    let mean = w.iter().map(|v| v.abs() as f64).sum::<f64>() / w.len().max(1) as f64;
    let mut worst = 0f64;
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        if !a.is_finite() || !b.is_finite() {
            return Err(format!("element {i}: got {a}, want {b}"));
        }
        worst = worst.max((a - b).abs() as f64 / (b.abs() as f64).max(mean));
    }
    if worst > 1e-4 {
        return Err(format!("relative error {worst:e}"));
    }
    Ok(())
}

#[test]
fn zoo_models_match_the_reference() {
    let o = |batch, seq, image| ModelOptions { batch, seq, image };
    let models = [model("mlp3", o(2, None, None), false),
        model("resnet18", o(1, None, Some(32)), false),
        model("mobilenetv2", o(1, None, Some(32)), false),
        model("bert-tiny", o(2, Some(8), None), false),
        model("bert-tiny", o(2, Some(8), None), true)];
    let t = Target::parse("cpu -compiler=c").unwrap();
    let be = CBackend;
    let lowered: Vec<LoweredKernel> = models.iter().map(|m| be.lower(&t, &m.kernel, &format!("m_{}", m.name.replace('-', "_"))).unwrap()).collect();
    let t0 = Instant::now();
    let module = be.compile_module(&t, &lowered).unwrap();
    eprintln!("{} models: one module compiled in {:.2}s, {} bytes", models.len(), t0.elapsed().as_secs_f64(), module.bytes.len());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("zoo.so");
    std::fs::write(&path, &module.bytes).unwrap();
    // SAFETY: the module just compiled; no initializers beyond the C runtime's.
    let lib = unsafe { libloading::Library::new(&path) }.unwrap();
    let mut failures = Vec::new();
    for (m, lk) in models.iter().zip(&lowered) {
        let align = |b: &[u8]| {
            let mut v = vec![0u64; b.len().div_ceil(8).max(1)];
            bytemuck_copy(&mut v, b);
            v
        };
        let mut ins: Vec<Vec<u64>> = m.inputs.iter().map(|t| align(t.bytes())).collect();
        let mut outs: Vec<Vec<u64>> = lk.info.outputs.iter().map(|t| vec![u64::MAX; t.size_bytes().div_ceil(8).max(1)]).collect();
        let mut scratch = vec![u64::MAX; (lk.info.scratch_bytes as usize).div_ceil(8).max(1)];
        let mut args: Vec<*mut c_void> = ins.iter_mut().map(|b| b.as_mut_ptr() as *mut c_void).collect();
        args.extend(outs.iter_mut().map(|b| b.as_mut_ptr() as *mut c_void));
        args.push(scratch.as_mut_ptr() as *mut c_void);
        let t0 = Instant::now();
        // SAFETY: documented signature; buffers sized from the FunctionInfo.
        unsafe {
            let f: libloading::Symbol<unsafe extern "C" fn(*const *mut c_void)> = lib.get(lk.info.symbol.as_bytes()).unwrap();
            f(args.as_ptr());
        }
        let ours = t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        let want = run_graph(&m.kernel, &m.inputs).unwrap();
        eprintln!("{:12} c: {:8.2} ms  reference: {:8.2} ms  scratch {} KiB", m.name, ours * 1e3, t0.elapsed().as_secs_f64() * 1e3, lk.info.scratch_bytes / 1024);
        for (k, (o, w)) in outs.iter().zip(&want).enumerate() {
            let bytes: Vec<u8> = o.iter().flat_map(|x| x.to_ne_bytes()).take(w.bytes().len()).collect();
            if let Err(e) = close(&bytes, w) {
                failures.push(format!("{} output {k}: {e}", m.name));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn bytemuck_copy(dst: &mut [u64], src: &[u8]) {
    for (i, chunk) in src.chunks(8).enumerate() {
        let mut b = [0u8; 8];
        b[..chunk.len()].copy_from_slice(chunk);
        dst[i] = u64::from_ne_bytes(b);
    }
}
