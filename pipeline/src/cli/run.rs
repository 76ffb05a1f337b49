//! `tessera run`: run a model and write its outputs as NumPy files.
//!
//! Two branches, chosen by the model file's extension:
//! - `MODEL.onnx --reference`: import with the ONNX importer (input shapes fixed by `--shape`), run the
//!   reference interpreter, the correctness oracle every backend is compared against;
//! - `MODEL.tsr`: a compiled artifact, run by its runtime (run_artifact.rs; a GPU artifact on GPU `--gpu N`,
//!   default 0).
//!
//! Every graph output is written as `OUT/<output name>.npy`. Inputs come from `--input NAME=FILE.npy`;
//! every input not given is drawn by [`tessera_stages::interp::random_inputs`] from `--seed` (default 0):
//! floats uniform in [-1, 1) (never exactly 0), integers uniform in [0, 100) or in [0, axis size) when
//! the input indexes a Gather, bools a fair coin, each input from its own ChaCha20 stream. Drawn inputs
//! are saved as `OUT/<input name>.npy`, so `--input NAME=OUT/NAME.npy` reproduces a run exactly.
//!
//! File names: a tensor name becomes a file stem by replacing every character other than ASCII letters,
//! digits, `-`, `_` and `.` with `_`, prefixing `_` to an empty name or one starting with `.`, and cutting
//! it to 120 bytes; when two tensors end up with the same stem (compared case-insensitively, for
//! case-insensitive file systems), the later one (outputs first, then inputs, each in graph order) gets
//! `_2`, `_3`, ... The mapping is printed, one line per file; with `--json`, as one JSON object (the model, the
//! runner, the seconds, and each input and output with its type and file, drawn inputs with their seed).

use super::run_report::{bind_input_names, RunReport, RunTensor, Stems};
use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tessera_stages::interp::{random_inputs, run_graph};
use tessera_stages::ir::{Graph, Tensor, ValueId};
use tessera_stages::npy;
use tessera_stages::onnx::{import_file, ImportOptions};

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The model (.onnx) or artifact (.tsr) to run.
    pub model: PathBuf,
    /// Run an ONNX model with the reference interpreter (CPU, the correctness oracle).
    #[arg(long)]
    pub reference: bool,
    /// A graph input from a NumPy file, NAME=FILE.npy (repeatable); inputs not given are drawn from --seed.
    #[arg(long = "input", value_name = "NAME=FILE.npy")]
    pub inputs: Vec<String>,
    /// Fix a graph input's shape for import, NAME=DIMS such as input_ids=1x128 (repeatable).
    #[arg(long = "shape", value_name = "NAME=DIMS")]
    pub shapes: Vec<String>,
    /// Directory for the outputs (and the drawn inputs); created if missing.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Seed for the inputs not given with --input.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// A batched artifact (compiled with --batch): the batch size of the inputs drawn from --seed (default: the
    /// batch of the inputs given, else the smallest plan's). Any size up to the largest plan runs.
    #[arg(long, value_name = "N")]
    pub batch: Option<usize>,
    /// Threads of the CPU kernels (GEMMs, convolutions, epilogues); default: the cores this process may run
    /// on, or $TESSERA_THREADS.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// A GPU artifact: the GPU to load and run it on, a CUDA device index (as CUDA_VISIBLE_DEVICES numbers
    /// them); default 0. An error for a host artifact or an ONNX model.
    #[arg(long, value_name = "N")]
    pub gpu: Option<usize>,
}

/// What kind of file `tessera run` was given.
#[derive(Debug, PartialEq, Eq)]
enum ModelKind {
    Onnx,
    Artifact,
}

fn model_kind(path: &Path) -> anyhow::Result<ModelKind> {
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("onnx") => Ok(ModelKind::Onnx),
        Some("tsr") => Ok(ModelKind::Artifact),
        _ => bail!("{}: expected an ONNX model (.onnx) or a compiled artifact (.tsr)", path.display()),
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    if let Some(n) = args.threads {
        tessera_kernels::runtime::set_threads(n).map_err(|e| anyhow::anyhow!("--threads {n}: {e}"))?;
    }
    match model_kind(&args.model)? {
        ModelKind::Onnx => {
            if !args.reference {
                bail!(
                    "{}: an ONNX model runs with --reference (the reference interpreter); to run it on a backend, compile it to a .tsr artifact",
                    args.model.display()
                );
            }
            if let Some(g) = args.gpu {
                bail!("{}: --gpu {g}: the reference interpreter runs on the CPU; --gpu places a GPU artifact (.tsr)", args.model.display());
            }
            run_reference(&args)
        }
        ModelKind::Artifact => {
            if args.reference {
                bail!("{}: --reference runs an ONNX model; an artifact always runs its compiled code", args.model.display());
            }
            let report = super::run_artifact::run_artifact_at(&args.model, &args.inputs, args.seed, args.batch, args.gpu, &args.out)?;
            print_report(&args, "artifact", &report, &format!("ran the compiled artifact in {:.4} s", report.seconds))
        }
    }
}

fn run_reference(args: &RunArgs) -> anyhow::Result<()> {
    let opts = ImportOptions { shapes: super::build_options::parse_shapes(&args.shapes)? };
    let g = import_file(&args.model, &opts)?;
    let given = bind_inputs(&g, &args.inputs)?;
    let report = reference_run(&g, &given, args.seed, &args.out)?;
    print_report(args, "reference", &report, &format!("ran with the reference interpreter in {:.2} s", report.seconds))
}

/// What `--json` prints.
#[derive(Serialize)]
struct JsonReport<'a> {
    model: &'a Path,
    /// `reference` (the interpreter) or `artifact` (the compiled code).
    runner: &'a str,
    #[serde(flatten)]
    report: &'a RunReport,
}

fn print_report(args: &RunArgs, runner: &str, report: &RunReport, headline: &str) -> anyhow::Result<()> {
    if args.json {
        println!("{}", serde_json::to_string_pretty(&JsonReport { model: &args.model, runner, report })?);
        return Ok(());
    }
    println!("{}: {headline}", args.model.display());
    for line in report.lines() {
        println!("  {line}");
    }
    Ok(())
}

/// Matches `--input NAME=FILE` arguments to graph inputs. The name is the longest graph input name that
/// the argument starts with followed by `=`, so names and paths may both contain `=`.
fn bind_inputs(g: &Graph, args: &[String]) -> anyhow::Result<BTreeMap<String, PathBuf>> {
    let names: Vec<&str> = g.inputs.iter().map(|&v| g.value(v).name.as_str()).collect();
    bind_input_names(&names, args)
}

/// Runs `g` with the reference interpreter: inputs from `given` (name -> .npy file), the rest drawn
/// from `seed`; writes outputs and drawn inputs into `out_dir`.
pub fn reference_run(g: &Graph, given: &BTreeMap<String, PathBuf>, seed: u64, out_dir: &Path) -> anyhow::Result<RunReport> {
    let drawn = random_inputs(g, seed);
    let mut inputs: Vec<Tensor> = Vec::with_capacity(g.inputs.len());
    // Per input, in model order: its row once its file is known (given now, drawn after the outputs).
    let mut rows: Vec<Option<RunTensor>> = Vec::with_capacity(g.inputs.len());
    let mut from_seed: Vec<(usize, ValueId, &Tensor)> = Vec::new();
    for (i, (&v, random)) in g.inputs.iter().zip(&drawn).enumerate() {
        let val = g.value(v);
        match given.get(&val.name) {
            Some(path) => {
                let t = npy::read_as(path, val.ty.dtype).with_context(|| format!("input '{}'", val.name))?;
                if t.shape() != val.ty.shape.as_slice() {
                    bail!(
                        "input '{}': {} holds shape {:?}, the model expects {} (fix symbolic dimensions with --shape {}=...)",
                        val.name,
                        path.display(),
                        t.shape(),
                        val.ty,
                        val.name
                    );
                }
                rows.push(Some(RunTensor { name: val.name.clone(), ty: val.ty.to_string(), file: path.clone(), seed: None }));
                inputs.push(t);
            }
            None => {
                from_seed.push((i, v, random));
                rows.push(None);
                inputs.push(random.clone());
            }
        }
    }
    let start = std::time::Instant::now();
    let results = run_graph(g, &inputs)?;
    let seconds = start.elapsed().as_secs_f64();

    std::fs::create_dir_all(out_dir).with_context(|| format!("cannot create output directory {}", out_dir.display()))?;
    let mut stems = Stems::default();
    let mut written: BTreeMap<ValueId, PathBuf> = BTreeMap::new();
    let mut files = Vec::new();
    let mut outputs = Vec::with_capacity(g.outputs.len());
    for (&o, t) in g.outputs.iter().zip(&results) {
        let name = &g.value(o).name;
        let path = out_dir.join(format!("{}.npy", stems.claim(name)));
        npy::write(&path, t)?;
        outputs.push(RunTensor { name: name.clone(), ty: t.ty.to_string(), file: path.clone(), seed: None });
        written.insert(o, path.clone());
        files.push(path);
    }
    for (i, v, t) in from_seed {
        let name = &g.value(v).name;
        // An input that is also an output was just written under its own name.
        let path = match written.get(&v) {
            Some(p) => p.clone(),
            None => {
                let p = out_dir.join(format!("{}.npy", stems.claim(name)));
                npy::write(&p, t)?;
                files.push(p.clone());
                p
            }
        };
        rows[i] = Some(RunTensor { name: name.clone(), ty: t.ty.to_string(), file: path, seed: Some(seed) });
    }
    Ok(RunReport { seconds, inputs: rows.into_iter().map(|r| r.expect("every input has a row")).collect(), outputs, files })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_stages::ir::{BinaryOp, DType, Op, TensorType};

    /// y = x + w; ids gather a 3-row table; both outputs have names that need sanitizing.
    fn graph() -> Graph {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::f32([2]));
        let ids = g.add_input("ids:0", TensorType::new(DType::I64, [4]));
        let w = g.add_const("w", Tensor::from_f32(vec![2], &[10., 20.]));
        let table = g.add_const("table", Tensor::from_f32(vec![3, 1], &[1., 2., 3.]));
        let y = g.add_node_named("add", Op::Binary(BinaryOp::Add), &[x, w], vec!["out/y".into()]).unwrap()[0];
        let e = g.add_node_named("emb", Op::Gather { axis: 0 }, &[table, ids], vec!["OUT:Y".into()]).unwrap()[0];
        g.outputs.extend([y, e]);
        g
    }

    #[test]
    fn kinds_by_extension() {
        assert_eq!(model_kind(Path::new("m.onnx")).unwrap(), ModelKind::Onnx);
        assert_eq!(model_kind(Path::new("m.TSR")).unwrap(), ModelKind::Artifact);
        assert!(model_kind(Path::new("m.pt")).unwrap_err().to_string().contains("m.pt"));
        let args = RunArgs {
            model: "m.tsr".into(),
            reference: false,
            inputs: vec![],
            shapes: vec![],
            out: "o".into(),
            seed: 0,
            json: false,
            batch: None,
            threads: None,
            gpu: None,
        };
        // A missing artifact is an error naming the file, not a panic.
        let e = format!("{:#}", run(args).unwrap_err());
        assert!(e.contains("m.tsr"), "{e}");
    }

    #[test]
    fn draws_missing_inputs_saves_them_and_reproduces() {
        let g = graph();
        let d = tempfile::tempdir().unwrap();
        let out1 = d.path().join("run1");
        let r = reference_run(&g, &BTreeMap::new(), 5, &out1).unwrap();
        let names: Vec<String> = r.files.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["out_y.npy", "OUT_Y_2.npy", "x.npy", "ids_0.npy"]);
        let x = npy::read(&out1.join("x.npy")).unwrap();
        let ids = npy::read(&out1.join("ids_0.npy")).unwrap();
        assert!(ids.to_i64_vec().iter().all(|&i| (0..3).contains(&i)), "ids index a 3-row table");
        let y = npy::read(&out1.join("out_y.npy")).unwrap();
        let xv = x.to_f32_vec();
        assert_eq!(y.to_f32_vec(), vec![xv[0] + 10., xv[1] + 20.]);
        // Feeding the saved inputs back reproduces the outputs bit for bit, with another seed.
        let given: BTreeMap<String, PathBuf> =
            [("x".to_string(), out1.join("x.npy")), ("ids:0".to_string(), out1.join("ids_0.npy"))].into();
        let out2 = d.path().join("run2");
        let r2 = reference_run(&g, &given, 99, &out2).unwrap();
        assert_eq!(r2.files.len(), 2, "no input was drawn");
        for f in ["out_y.npy", "OUT_Y_2.npy"] {
            assert_eq!(std::fs::read(out1.join(f)).unwrap(), std::fs::read(out2.join(f)).unwrap(), "{f}");
        }
    }

    #[test]
    fn input_errors_name_the_input_and_file() {
        let g = graph();
        let d = tempfile::tempdir().unwrap();
        let bad = d.path().join("bad.npy");
        npy::write(&bad, &Tensor::from_f32(vec![3], &[1., 2., 3.])).unwrap();
        let given: BTreeMap<String, PathBuf> = [("x".to_string(), bad.clone())].into();
        let e = format!("{:#}", reference_run(&g, &given, 0, d.path()).err().unwrap());
        assert!(e.contains("input 'x'") && e.contains("bad.npy") && e.contains("f32[2]"), "{e}");
        let given: BTreeMap<String, PathBuf> = [("ids:0".to_string(), bad.clone())].into();
        let e = format!("{:#}", reference_run(&g, &given, 0, d.path()).err().unwrap());
        assert!(e.contains("input 'ids:0'") && e.contains("holds f32 data, the value needs i64"), "{e}");
        // Binding: names may contain '=' and ':', unknown names list the real ones.
        let b = bind_inputs(&g, &["ids:0=a=b.npy".into()]).unwrap();
        assert_eq!(b["ids:0"], PathBuf::from("a=b.npy"));
        let e = bind_inputs(&g, &["nope=f.npy".into()]).unwrap_err().to_string();
        assert!(e.contains("no input 'nope'") && e.contains("x, ids:0"), "{e}");
        assert!(bind_inputs(&g, &["x=a.npy".into(), "x=b.npy".into()]).unwrap_err().to_string().contains("twice"));
    }

    /// The whole command on an ONNX file: y = relu(x + w) with a symbolic batch fixed by --shape.
    mod onnx_file {
        use super::*;
        use prost::Message;
        use tessera_stages::onnx::proto::{
            tensor_shape_proto::{dimension::Value as Dim, Dimension},
            type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorShapeProto, TypeProto, ValueInfoProto,
        };
        use tessera_stages::onnx::tensor_to_proto;

        fn write_model(path: &Path) {
            let dims = vec![
                Dimension { value: Some(Dim::DimParam("batch".into())), ..Default::default() },
                Dimension { value: Some(Dim::DimValue(3)), ..Default::default() },
            ];
            let x = ValueInfoProto {
                name: Some("x".into()),
                r#type: Some(TypeProto {
                    value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                        elem_type: Some(1),
                        shape: Some(TensorShapeProto { dim: dims }),
                    })),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let node = |op: &str, ins: &[&str], out: &str| NodeProto {
                op_type: Some(op.into()),
                name: Some(out.into()),
                input: ins.iter().map(|s| s.to_string()).collect(),
                output: vec![out.into()],
                ..Default::default()
            };
            let m = ModelProto {
                ir_version: Some(8),
                opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
                graph: Some(GraphProto {
                    name: Some("g".into()),
                    node: vec![node("Add", &["x", "w"], "sum"), node("Relu", &["sum"], "y/relu")],
                    input: vec![x],
                    output: vec![ValueInfoProto { name: Some("y/relu".into()), ..Default::default() }],
                    initializer: vec![tensor_to_proto("w", &Tensor::from_f32(vec![3], &[0.5, -0.5, 2.0]))],
                    ..Default::default()
                }),
                ..Default::default()
            };
            std::fs::write(path, m.encode_to_vec()).unwrap();
        }

        fn args(model: &Path, out: &Path, inputs: Vec<String>) -> RunArgs {
            RunArgs { model: model.into(), reference: true, inputs, shapes: vec!["x=4x3".into()], out: out.into(), seed: 3, json: false, batch: None, threads: None, gpu: None }
        }

        #[test]
        fn runs_writes_and_reproduces() {
            let d = tempfile::tempdir().unwrap();
            let model = d.path().join("m.onnx");
            write_model(&model);
            let out1 = d.path().join("o1");
            run(args(&model, &out1, vec![])).unwrap();
            let x = npy::read(&out1.join("x.npy")).unwrap();
            let y = npy::read(&out1.join("y_relu.npy")).unwrap();
            assert_eq!(y.shape(), &[4, 3]);
            let want: Vec<f32> = x.to_f32_vec().iter().zip([0.5, -0.5, 2.0].iter().cycle()).map(|(a, b)| (a + b).max(0.0)).collect();
            assert_eq!(y.to_f32_vec(), want);
            let out2 = d.path().join("o2");
            run(args(&model, &out2, vec![format!("x={}", out1.join("x.npy").display())])).unwrap();
            assert_eq!(std::fs::read(out1.join("y_relu.npy")).unwrap(), std::fs::read(out2.join("y_relu.npy")).unwrap());
            assert!(!out2.join("x.npy").exists(), "given inputs are not copied");
            // Without --shape the symbolic batch cannot be fixed: the importer's error comes through.
            let mut a = args(&model, &out2, vec![]);
            a.shapes.clear();
            let e = format!("{:#}", run(a).unwrap_err());
            assert!(e.contains("m.onnx") && e.contains("--shape"), "{e}");
            let mut a = args(&model, &out2, vec![]);
            a.reference = false;
            assert!(run(a).unwrap_err().to_string().contains("--reference"));
            let mut a = args(&model, &out2, vec![]);
            a.gpu = Some(0);
            assert!(run(a).unwrap_err().to_string().contains("--gpu 0: the reference interpreter runs on the CPU"));
        }
    }
}
