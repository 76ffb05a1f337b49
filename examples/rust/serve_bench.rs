//! Serving figures of the Rust API (scripts/bench_runtime.sh builds and runs it; bench/runtime.md has the
//! results): `cargo run --release -p tessera-runtime --example serve_bench -- MODEL.tsr INDIR ITERS WARMUP SECONDS`
//!
//! Reads input i of the model from INDIR/i.bin (raw little-endian bytes, as examples/c/serve_bench.c and
//! examples/python/serve_bench.py read them), then prints one JSON line per API call:
//! - latency: `WARMUP` untimed runs, then the median (p10, p90) of `ITERS` timed runs on one thread, of
//!   `Model::run` (outputs allocated per run, as `tessera bench` does) and of `Model::run_into` (outputs in
//!   buffers allocated once);
//! - throughput: runs per second of `run_into` with 1, 2 and 4 threads on the one loaded model, each thread
//!   looping for `SECONDS` with its own output buffers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};
use tessera_runtime::{Error, Model, TensorView, TensorViewMut};

/// One way of running the model once, given the calling thread's output buffers.
type RunOnce<'a> = dyn Fn(&mut [Vec<u8>]) -> Result<(), Error> + Sync + 'a;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [path, dir, iters, warmup, seconds] = args.as_slice() else {
        return Err("usage: serve_bench MODEL.tsr INDIR ITERS WARMUP SECONDS".into());
    };
    let (iters, warmup, seconds): (usize, usize, f64) = (iters.parse()?, warmup.parse()?, seconds.parse()?);
    if iters == 0 {
        return Err("ITERS must be at least 1".into());
    }
    let model = Model::load(path)?;
    let data: Vec<Vec<u8>> = (0..model.inputs().len())
        .map(|i| {
            let file = format!("{dir}/{i}.bin");
            std::fs::read(&file).map_err(|e| format!("{file}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let inputs: Vec<(&str, TensorView)> =
        model.inputs().iter().zip(&data).map(|(d, b)| (d.name.as_str(), TensorView::from_bytes(d.dtype, &d.shape, b))).collect();

    let run = |_: &mut [Vec<u8>]| model.run(&inputs).map(drop);
    let run_into = |bufs: &mut [Vec<u8>]| {
        let mut outs: Vec<(&str, TensorViewMut)> =
            model.outputs().iter().zip(bufs.iter_mut()).map(|(d, b)| (d.name.as_str(), TensorViewMut::from_bytes(d.dtype, &d.shape, b))).collect();
        model.run_into(&inputs, &mut outs)
    };
    let buffers = || -> Vec<Vec<u8>> { model.outputs().iter().map(|d| vec![0u8; d.size_bytes()]).collect() };

    let apis: [(&str, &RunOnce); 2] = [("rust run", &run), ("rust run_into", &run_into)];
    for (api, f) in apis {
        let mut bufs = buffers();
        for _ in 0..warmup {
            f(&mut bufs)?;
        }
        let mut us = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            f(&mut bufs)?;
            us.push(t.elapsed().as_secs_f64() * 1e6);
        }
        us.sort_by(f64::total_cmp);
        let mut line = format!(
            "{{\"api\": \"{api}\", \"model\": \"{}\", \"iters\": {iters}, \"median_us\": {:.2}, \"p10_us\": {:.2}, \"p90_us\": {:.2}",
            model.name(),
            quantile(&us, 0.5),
            quantile(&us, 0.1),
            quantile(&us, 0.9)
        );
        if api == "rust run_into" {
            for threads in [1, 2, 4] {
                line += &format!(", \"runs_per_s_{threads}\": {:.1}", throughput(&model, threads, seconds, f, &buffers)?);
            }
        }
        println!("{line}}}");
    }
    Ok(())
}

/// Runs per second of `f` from `threads` threads on one model for `seconds` (after one untimed run each).
fn throughput(model: &Model, threads: usize, seconds: f64, f: &RunOnce, buffers: &(dyn Fn() -> Vec<Vec<u8>> + Sync)) -> Result<f64, Error> {
    // Sessions made before the clock starts: the timed runs allocate nothing.
    model.reserve_sessions(threads)?;
    let start_line = Barrier::new(threads + 1);
    let stop = AtomicBool::new(false);
    let (start, done) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| -> Result<(u64, Instant), Error> {
                    let mut bufs = buffers();
                    let first = f(&mut bufs);
                    // Every thread reaches the line, failed or not, so that the others are not left waiting.
                    start_line.wait();
                    first?;
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        f(&mut bufs)?;
                        n += 1;
                    }
                    Ok((n, Instant::now()))
                })
            })
            .collect();
        start_line.wait();
        let start = Instant::now();
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
        let done: Vec<_> = handles.into_iter().map(|h| h.join().expect("a bench thread panicked")).collect();
        (start, done)
    });
    let (mut runs, mut end) = (0u64, start);
    for d in done {
        let (n, e) = d?;
        runs += n;
        end = end.max(e);
    }
    // Every counted run finished by the time the last thread stopped: runs over the time until then.
    Ok(runs as f64 / (end - start).as_secs_f64())
}

/// Linear interpolation between order statistics (NumPy's default, as `tessera bench` computes it).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}
