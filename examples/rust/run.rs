//! Loads an artifact, prints how it was built and its inputs and outputs, and runs it from several threads at once on one
//! loaded model: `cargo run --release -p tessera-runtime --example run -- MODEL.tsr [THREADS]`.
//!
//! Inputs are filled with a ramp (floats) or zeros (integers, always a valid token id or index), so the
//! printed outputs are the same from run to run and thread to thread.

use tessera_runtime::{DType, Model, TensorView};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: run MODEL.tsr [THREADS]")?;
    let threads: usize = args.next().map(|t| t.parse()).transpose()?.unwrap_or(4);

    let model = Model::load(&path)?;
    println!("model {} ({} of weights, {} per concurrent run)", model.name(), mib(model.weight_bytes() as u64), mib(model.session_bytes()));
    match model.provenance() {
        Some(p) => println!("  built by tessera {} ({}) from {} {}, costs {}, for {}", p.tessera_version, p.source_revision, p.source.kind, p.source.name, p.costs, p.targets.join("; ")),
        None => println!("  provenance not recorded"),
    }
    for d in model.inputs() {
        println!("  input  {} {} {:?}", d.name, d.dtype, d.shape);
    }
    for d in model.outputs() {
        println!("  output {} {} {:?}", d.name, d.dtype, d.shape);
    }

    // One buffer per input: the views below borrow them, nothing is copied until a run copies them in.
    let data: Vec<Vec<u8>> = model.inputs().iter().map(|d| fill(d.dtype, d.numel())).collect();
    let inputs: Vec<(&str, TensorView)> =
        model.inputs().iter().zip(&data).map(|(d, b)| (d.name.as_str(), TensorView::from_bytes(d.dtype, &d.shape, b))).collect();

    let checksums: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (model, inputs) = (&model, &inputs);
                s.spawn(move || -> Result<f64, tessera_runtime::Error> {
                    let out = model.run(inputs)?;
                    Ok(out.iter().map(|t| t.to_f64_vec().iter().sum::<f64>()).sum())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("no panic")).collect::<Result<_, _>>()
    })?;
    for (t, c) in checksums.iter().enumerate() {
        println!("thread {t}: sum of outputs {c}");
    }
    println!("{} sessions for {threads} threads", model.session_count());
    Ok(())
}

fn fill(dtype: DType, n: usize) -> Vec<u8> {
    match dtype {
        DType::F32 => (0..n).flat_map(|i| ((i % 17) as f32 / 17.0 - 0.5).to_le_bytes()).collect(),
        other => vec![0; n * other.size()],
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}
