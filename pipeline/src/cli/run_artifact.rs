//! `tessera run ARTIFACT.tsr`: run a compiled artifact with the runtime (no compiler, no tuning) and write
//! its outputs as NumPy files, named and drawn exactly as a reference run of the model names and draws them
//! (see [`super::run`]): outputs as `OUT/<output name>.npy` with the same file-stem rule, inputs not given
//! drawn from `--seed` with the same generator and bounds (recorded in the artifact), and saved as
//! `OUT/<input name>.npy`, so the two runs' directories compare file by file. A GPU artifact loads and runs
//! on GPU 0, or on the GPU `--gpu N` names ([`check_gpu`] refuses it for a host artifact).

use super::run_report::{bind_input_names, RunReport, RunTensor, Stems};
use anyhow::{bail, Context};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tessera_kernels::artifact::{Artifact, Buf};
use tessera_kernels::batch::BatchedExecutable;
use tessera_kernels::runtime::cuda::device;
use tessera_stages::ir::Tensor;
use tessera_stages::npy;

/// Runs the artifact at `path`: inputs from `--input NAME=FILE.npy` arguments, the rest drawn from `seed`;
/// writes outputs (and drawn inputs) into `out_dir`. `seconds` in the report is the run alone, not loading.
pub fn run_artifact(path: &Path, input_args: &[String], seed: u64, out_dir: &Path) -> anyhow::Result<RunReport> {
    run_artifact_at(path, input_args, seed, None, None, out_dir)
}

/// The checks of an explicit `--gpu N` before anything loads: the artifact at `path` runs on the GPU (a host
/// artifact on a GPU is an error naming both), and GPU `gpu` exists (else the driver's view: how many GPUs
/// it sees).
pub fn check_gpu(a: &Artifact, path: &Path, gpu: usize) -> anyhow::Result<()> {
    if !a.runs_on_gpu() {
        bail!("{}: --gpu {gpu}: model '{}' runs on the host; it cannot be placed on GPU {gpu} (leave out --gpu)", path.display(), a.body.model);
    }
    device::context_of(gpu).map_err(|e| anyhow::anyhow!("{}: --gpu {gpu}: {e}", path.display()))?;
    Ok(())
}

/// [`run_artifact`]; for a batched artifact, inputs of any batch up to its largest plan's: `batch` (else the
/// leading dimension of the first input given, else the smallest plan's) is the batch of the drawn inputs.
/// A GPU artifact loads and runs on GPU `gpu` (default 0); `Some` for a host artifact is an error.
pub fn run_artifact_at(path: &Path, input_args: &[String], seed: u64, batch: Option<usize>, gpu: Option<usize>, out_dir: &Path) -> anyhow::Result<RunReport> {
    let artifact = Artifact::open(path)?;
    if let Some(g) = gpu {
        check_gpu(&artifact, path, g)?;
    }
    let body = &artifact.body;
    let names: Vec<&str> = body.inputs.iter().map(|d| d.name.as_str()).collect();
    let given = bind_input_names(&names, input_args)?;
    let batched = !artifact.batches().is_empty();
    let drawn = if batched {
        let first_given = body.inputs.iter().find_map(|d| given.get(&d.name).map(|f| (d, f)));
        let batch = match (batch, first_given) {
            (Some(b), _) => b,
            (None, Some((d, file))) => *npy::read_as(file, d.ty.dtype).with_context(|| format!("input '{}'", d.name))?.shape().first().unwrap_or(&0),
            (None, None) => artifact.batches()[0] as usize,
        };
        artifact.random_inputs_at(batch, seed).map_err(anyhow::Error::msg).with_context(|| format!("{}: --batch", path.display()))?
    } else {
        if let Some(b) = batch {
            bail!("{}: --batch {b}: model '{}' holds one plan (compiled without --batch), its inputs have fixed shapes", path.display(), body.model);
        }
        artifact.random_inputs(seed)
    };
    let mut inputs: Vec<Tensor> = Vec::with_capacity(drawn.len());
    // Per input, in model order: its row once its file is known (given now, drawn after the outputs).
    let mut rows: Vec<Option<RunTensor>> = Vec::with_capacity(drawn.len());
    let mut from_seed: Vec<usize> = Vec::new();
    for (i, (d, random)) in body.inputs.iter().zip(drawn).enumerate() {
        match given.get(&d.name) {
            Some(file) => {
                let t = npy::read_as(file, d.ty.dtype).with_context(|| format!("input '{}'", d.name))?;
                // A batched artifact takes any batch up to its largest plan's: the runtime checks the shapes.
                if t.ty != d.ty && !batched {
                    bail!("input '{}': {} holds shape {:?}, the model expects {}", d.name, file.display(), t.shape(), d.ty);
                }
                rows.push(Some(RunTensor { name: d.name.clone(), ty: t.ty.to_string(), file: file.clone(), seed: None }));
                inputs.push(t);
            }
            None => {
                from_seed.push(i);
                rows.push(None);
                inputs.push(random);
            }
        }
    }

    // A GPU artifact's modules, memory and graphs are made on (and keep) the current GPU's context.
    let (outputs, seconds) = device::on(gpu.unwrap_or(0), || -> anyhow::Result<_> {
        let mut exe = BatchedExecutable::load(&artifact).with_context(|| format!("loading {}", path.display()))?;
        let start = std::time::Instant::now();
        let outputs = exe.run(&inputs)?;
        Ok((outputs, start.elapsed().as_secs_f64()))
    })?;

    std::fs::create_dir_all(out_dir).with_context(|| format!("cannot create output directory {}", out_dir.display()))?;
    let mut stems = Stems::default();
    let mut files = Vec::new();
    // An input that is also an output is written once, under the output's file (as the reference run does).
    let mut input_files: BTreeMap<usize, PathBuf> = BTreeMap::new();
    let mut output_rows = Vec::with_capacity(outputs.len());
    for (o, t) in body.outputs.iter().zip(&outputs) {
        let file = out_dir.join(format!("{}.npy", stems.claim(&o.name)));
        npy::write(&file, t)?;
        output_rows.push(RunTensor { name: o.name.clone(), ty: t.ty.to_string(), file: file.clone(), seed: None });
        if let Buf::Input(i) = o.source {
            input_files.entry(i as usize).or_insert_with(|| file.clone());
        }
        files.push(file);
    }
    for i in from_seed {
        let d = &body.inputs[i];
        let file = match input_files.get(&i) {
            Some(f) => f.clone(),
            None => {
                let f = out_dir.join(format!("{}.npy", stems.claim(&d.name)));
                npy::write(&f, &inputs[i])?;
                files.push(f.clone());
                f
            }
        };
        rows[i] = Some(RunTensor { name: d.name.clone(), ty: inputs[i].ty.to_string(), file, seed: Some(seed) });
    }
    Ok(RunReport { seconds, inputs: rows.into_iter().map(|r| r.expect("every input has a row")).collect(), outputs: output_rows, files })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_stages::stages::link::{link, LinkInput, LinkStep, ValueRef};
    use tessera_stages::backend::{FunctionInfo, Module};
    use tessera_stages::interp::random_inputs;
    use tessera_stages::ir::{BinaryOp, DType, Graph, Op, TensorType};

    /// A one-step artifact computing `y = x + x` through a shared object compiled here, with an integer input
    /// `ids:0` (passed through as an output) whose random values must stay below 3.
    fn artifact(dir: &Path) -> PathBuf {
        let c = dir.join("k.c");
        let so = dir.join("k.so");
        std::fs::write(&c, "void dbl(void* const* a) { const float* x = a[0]; float* y = a[1]; for (int i = 0; i < 4; i++) y[i] = x[i] + x[i]; }\n").unwrap();
        let status = std::process::Command::new("cc").args(["-shared", "-fPIC", "-O1", "-o"]).arg(&so).arg(&c).status().expect("cc runs");
        assert!(status.success());
        let x = TensorType::f32([4]);
        let ids = TensorType::new(DType::I64, [5]);
        let input = LinkInput {
            model: "dbl".into(),
            inputs: vec![("x".into(), x.clone()), ("ids:0".into(), ids)],
            input_int_bounds: vec![100, 3],
            outputs: vec![("out/y".into(), ValueRef::Value(0)), ("ids:0".into(), ValueRef::Input(1))],
            values: vec![x.clone()],
            modules: vec![Module {
                backend: "c".into(),
                target: "llvm".into(),
                format: tessera_kernels::runtime::c::FORMAT,
                functions: vec![FunctionInfo { symbol: "dbl".into(), inputs: vec![x.clone()], outputs: vec![x], scratch_bytes: 0 }],
                bytes: std::fs::read(&so).unwrap(),
            }],
            steps: vec![LinkStep { module: 0, function: 0, args: vec![ValueRef::Input(0), ValueRef::Value(0)] }],
            ..Default::default()
        };
        let path = dir.join("dbl.tsr");
        std::fs::write(&path, link(&input).unwrap()).unwrap();
        path
    }

    #[test]
    fn writes_outputs_and_drawn_inputs_like_the_reference_run() {
        let d = tempfile::tempdir().unwrap();
        let tsr = artifact(d.path());
        let out = d.path().join("run1");
        let r = run_artifact(&tsr, &[], 11, &out).unwrap();
        let names: Vec<String> = r.files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["out_y.npy", "ids_0.npy", "x.npy"]);
        let x = npy::read(&out.join("x.npy")).unwrap();
        let y = npy::read(&out.join("out_y.npy")).unwrap();
        assert_eq!(y.to_f32_vec(), x.to_f32_vec().iter().map(|v| v + v).collect::<Vec<_>>());
        let ids = npy::read(&out.join("ids_0.npy")).unwrap();
        assert!(ids.to_i64_vec().iter().all(|&i| (0..3).contains(&i)));

        // The drawn values are the reference interpreter's for a graph of the same inputs (ids indexing a
        // 3-row table) and seed.
        let mut g = Graph::new("dbl");
        let gx = g.add_input("x", TensorType::f32([4]));
        let gi = g.add_input("ids:0", TensorType::new(DType::I64, [5]));
        let table = g.add_const("table", Tensor::from_f32(vec![3, 1], &[1., 2., 3.]));
        let y = g.add("y", Op::Binary(BinaryOp::Add), &[gx, gx]).unwrap();
        let e = g.add("emb", Op::Gather { axis: 0 }, &[table, gi]).unwrap();
        g.outputs.extend([y, e]);
        assert_eq!(random_inputs(&g, 11), vec![x.clone(), ids]);

        // Feeding one input back reproduces the run; the other is drawn again from the same seed.
        let out2 = d.path().join("run2");
        let r2 = run_artifact(&tsr, &[format!("x={}", out.join("x.npy").display())], 11, &out2).unwrap();
        assert_eq!(r2.files.len(), 2);
        for f in ["out_y.npy", "ids_0.npy"] {
            assert_eq!(std::fs::read(out.join(f)).unwrap(), std::fs::read(out2.join(f)).unwrap(), "{f}");
        }
    }

    #[test]
    fn gpu_index_of_a_host_artifact_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let tsr = artifact(d.path());
        assert!(!Artifact::open(&tsr).unwrap().runs_on_gpu());
        let e = format!("{:#}", run_artifact_at(&tsr, &[], 0, None, Some(1), &d.path().join("o")).err().unwrap());
        assert!(e.contains("dbl.tsr") && e.contains("--gpu 1: model 'dbl' runs on the host; it cannot be placed on GPU 1"), "{e}");
        assert!(!d.path().join("o").exists(), "refused before running");
    }

    #[test]
    fn errors_name_the_input_or_file() {
        let d = tempfile::tempdir().unwrap();
        let tsr = artifact(d.path());
        let bad = d.path().join("bad.npy");
        npy::write(&bad, &Tensor::from_f32(vec![3], &[1., 2., 3.])).unwrap();
        let e = format!("{:#}", run_artifact(&tsr, &[format!("x={}", bad.display())], 0, d.path()).err().unwrap());
        assert!(e.contains("input 'x'") && e.contains("bad.npy") && e.contains("f32[4]"), "{e}");
        let e = format!("{:#}", run_artifact(&tsr, &["nope=f.npy".into()], 0, d.path()).err().unwrap());
        assert!(e.contains("no input 'nope'") && e.contains("x, ids:0"), "{e}");
        let b = super::super::run_report::bind_input_names(&["ids", "ids=2"], &["ids=2=a.npy".into()]).unwrap();
        assert_eq!(b["ids=2"], PathBuf::from("a.npy"));
        std::fs::write(&tsr, b"TESSERA\x1a garbage").unwrap();
        let e = format!("{:#}", run_artifact(&tsr, &[], 0, d.path()).err().unwrap());
        assert!(e.contains("dbl.tsr") && e.contains("truncated"), "{e}");
    }
}
