//! The fuzz targets: how each generates an input (structure-aware generation, and mutation of real seeds)
//! and what one execution does with it. An execution returns whether the input was accepted; a wrong
//! answer that is not a panic (data read from outside the model folder, constants out of the data
//! section) is turned into a panic so the harness reports it.

use crate::mutate::{mutate_bytes, mutate_model};
use crate::rng::Rng;
use prost::Message;
use std::path::{Path, PathBuf};
use tessera_stages::ir::{DType, Tensor};
use tessera_stages::onnx::proto::ModelProto;
use tessera_stages::onnx::ImportOptions;

/// One target.
pub struct FuzzTarget {
    pub name: &'static str,
    pub generate: fn(&mut Rng, &Corpus) -> Vec<u8>,
    /// Runs one input; true when it was accepted.
    pub exec: fn(&[u8], &Corpus) -> bool,
    /// The largest single allocation an input of this many bytes justifies.
    pub alloc_limit: fn(usize) -> usize,
}

/// The float every element of `outside/secret.bin` holds: finding it in an imported constant means the
/// importer read a file outside the model's folder.
pub const SECRET: f32 = 1234.5678;

/// Real seeds, and a scratch folder for external data: `dir/model/w.bin` (inside the model's folder) and
/// `dir/outside/secret.bin` (outside it).
pub struct Corpus {
    pub models: Vec<Vec<u8>>,
    pub manifests: Vec<String>,
    pub npys: Vec<Vec<u8>>,
    pub artifacts: Vec<Vec<u8>>,
    pub targets: Vec<String>,
    _dir: tempfile::TempDir,
    pub model_dir: PathBuf,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// Replaces every symbolic dimension of the graph's inputs by a small number, so seeds import as they are.
fn fix_dims(m: &mut ModelProto) {
    use tessera_stages::onnx::proto::{tensor_shape_proto::dimension::Value, type_proto};
    if let Some(g) = m.graph.as_mut() {
        for vi in &mut g.input {
            if let Some(type_proto::Value::TensorType(tt)) = vi.r#type.as_mut().and_then(|t| t.value.as_mut()) {
                for d in tt.shape.iter_mut().flat_map(|s| s.dim.iter_mut()) {
                    if !matches!(d.value, Some(Value::DimValue(_))) {
                        d.value = Some(Value::DimValue(if d.denotation.is_some() { 1 } else { 4 }));
                    }
                }
            }
        }
    }
}

impl Corpus {
    /// Loads the seeds from the repository and builds artifacts from two of its ONNX models (analytical
    /// costs; needs a C compiler, as the pipeline does).
    pub fn load() -> Corpus {
        let root = repo();
        let testdata = root.join("stages/src/onnx/testdata");
        let mut models = Vec::new();
        let mut names: Vec<PathBuf> =
            std::fs::read_dir(&testdata).expect("onnx testdata").flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "onnx")).collect();
        names.sort();
        for p in &names {
            let mut m = ModelProto::decode(&std::fs::read(p).unwrap()[..]).expect("a seed model decodes");
            fix_dims(&mut m);
            models.push(m.encode_to_vec());
        }
        let manifests = ["fixtures/zoo.toml", "fixtures/zoo-full.toml"]
            .iter()
            .map(|p| std::fs::read_to_string(root.join(p)).unwrap())
            .chain([
                "[[entry]]\nonnx = \"models/bert.onnx\"\nshapes = { input_ids = [1, 128], attention_mask = [1, 128] }\nname = \"b\"\n".to_string(),
                "[[entry]]\nmodel = \"resnet18\"\nname = \"r\"\nimage = 64\nprecision = \"fp16\"\n".to_string(),
            ])
            .collect();
        let dir = tempfile::tempdir().expect("a scratch folder");
        let model_dir = dir.path().join("model");
        std::fs::create_dir_all(&model_dir).unwrap();
        std::fs::create_dir_all(dir.path().join("outside")).unwrap();
        let w: Vec<u8> = (0..4096u32).flat_map(|i| (i as f32 * 0.25).to_le_bytes()).collect();
        std::fs::write(model_dir.join("w.bin"), w).unwrap();
        let secret: Vec<u8> = (0..4096).flat_map(|_| SECRET.to_le_bytes()).collect();
        std::fs::write(dir.path().join("outside/secret.bin"), secret).unwrap();

        let mut npys = Vec::new();
        let tensors = [
            Tensor::from_f32(vec![2, 3], &[1.0, -2.0, 3.5, 0.0, 5.0, 6.0]),
            Tensor::from_i64(vec![4], &[1, 2, 3, 4]),
            Tensor::from_i32(vec![1, 1, 2], &[7, -7]),
            Tensor::from_bool(vec![3], &[true, false, true]),
            Tensor::from_f64_as(DType::F16, vec![2, 2], &[1.0, 2.0, 0.5, -1.0]),
            Tensor::from_f32(Vec::<usize>::new(), &[42.0]),
        ];
        for (i, t) in tensors.iter().enumerate() {
            let p = dir.path().join(format!("t{i}.npy"));
            tessera_stages::npy::write(&p, t).expect("writing a seed .npy");
            npys.push(std::fs::read(&p).unwrap());
        }

        let artifacts = build_artifacts(dir.path(), &[testdata.join("conv_bn_opset13.onnx"), testdata.join("mlp_erf_gelu_opset17.onnx")]);
        let targets = [
            "cpu",
            "cpu -compiler=gemm",
            "cpu -compiler=c",
            "cuda -arch=sm_90 -compiler=cublas",
            "cuda",
            "{\"kind\":\"cpu\",\"compiler\":\"gemm\"}",
            "{\"kind\":\"cuda\",\"arch\":\"sm_80\"}",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        Corpus { models, manifests, npys, artifacts, targets, _dir: dir, model_dir }
    }
}

fn build_artifacts(dir: &Path, models: &[PathBuf]) -> Vec<Vec<u8>> {
    use tessera::memo::Memo;
    use tessera_stages::context::CostMode;
    use tessera::zoo::{all_backends, compile_all, jobs_from_inputs, resolve_targets};
    let store = tessera_store::Store::open(&dir.join("store"), tessera_store::OpenOptions::writable()).expect("a scratch store");
    let backends = all_backends();
    let targets = resolve_targets(&[], &backends).expect("targets");
    let jobs = jobs_from_inputs(models, &Default::default()).expect("jobs");
    let out = dir.join("out");
    let memo = Memo::new(&store);
    let summary = compile_all(&memo, &targets, &backends, &jobs, &out, CostMode::Analytical, &|_| {}).expect("compiling seed artifacts");
    assert!(summary.failed.is_empty(), "seed artifacts failed: {:?}", summary.failed.iter().map(|f| &f.error).collect::<Vec<_>>());
    summary.artifacts.iter().map(|a| std::fs::read(&a.path).expect("a seed artifact")).collect()
}

// ---------------------------------------------------------------------------------------------- ONNX

fn import(bytes: &[u8], c: &Corpus) -> bool {
    let r = tessera_stages::onnx::import_bytes(bytes, Some(&c.model_dir), "fuzz/model.onnx", &ImportOptions::default());
    match r {
        Ok(g) => {
            for v in &g.values {
                if let tessera_stages::ir::ValueDef::Const(t) = &v.def {
                    if t.dtype() == DType::F32 && t.to_f32_vec().contains(&SECRET) {
                        panic!("imported constant '{}' holds data of a file outside the model's folder", v.name);
                    }
                }
            }
            true
        }
        Err(e) => {
            let s = e.to_string();
            assert!(s.starts_with("fuzz/model.onnx"), "an import error does not name the file: {s}");
            false
        }
    }
}

fn gen_onnx_bytes(rng: &mut Rng, c: &Corpus) -> Vec<u8> {
    if rng.one_in(10) {
        let n = rng.below(256);
        return (0..n).map(|_| rng.bits() as u8).collect();
    }
    let mut b = c.models[pick_model(rng, c)].clone();
    mutate_bytes(rng, &mut b, &c.models);
    b
}

/// Seed index, the two large BERTs rarely (they cost 10x the others to import).
fn pick_model(rng: &mut Rng, c: &Corpus) -> usize {
    loop {
        let i = rng.below(c.models.len());
        if c.models[i].len() < 50_000 || rng.one_in(8) {
            return i;
        }
    }
}

fn gen_onnx_model(rng: &mut Rng, c: &Corpus) -> Vec<u8> {
    let mut m = ModelProto::decode(&c.models[pick_model(rng, c)][..]).expect("seeds decode");
    for _ in 0..1 + rng.below(4) {
        mutate_model(rng, &mut m);
    }
    m.encode_to_vec()
}

// ---------------------------------------------------------------------------------------------- targets

fn gen_target(rng: &mut Rng, c: &Corpus) -> Vec<u8> {
    use tessera_stages::target::KINDS;
    match rng.below(3) {
        0 => {
            let mut b = rng.pick(&c.targets).clone().into_bytes();
            mutate_bytes(rng, &mut b, &[]);
            b
        }
        1 => {
            let kind = KINDS[rng.below(KINDS.len())].name;
            let mut s = if rng.one_in(8) { rng.pick(&["", "CPU", "cpu0", "-cpu", "{"]).to_string() } else { kind.to_string() };
            for _ in 0..rng.below(5) {
                let spec = &KINDS[rng.below(KINDS.len())];
                let name = if !spec.attrs.is_empty() && !rng.one_in(5) {
                    spec.attrs[rng.below(spec.attrs.len())].name.to_string()
                } else {
                    rng.pick(&["compiler", "x", "", "=", "-arch", "libs"]).to_string()
                };
                let dash = if rng.one_in(4) { "--" } else { "-" };
                match rng.below(4) {
                    0 => s += &format!(" {dash}{name}"),
                    1 => s += &format!(" {dash}{name}={}", rng.interesting_i64()),
                    2 => s += &format!(" {dash}{name}={}", rng.pick(&["gemm", "c", "sm_90", "true", "false", "", "=", "a,b", "\u{0}"])),
                    _ => s += &format!(" {name}"),
                }
            }
            s.into_bytes()
        }
        _ => {
            let mut obj = serde_json::Map::new();
            if !rng.one_in(8) {
                let kind = KINDS[rng.below(KINDS.len())].name;
                obj.insert("kind".into(), json_value(rng, Some(kind)));
            }
            for _ in 0..rng.below(4) {
                let spec = &KINDS[rng.below(KINDS.len())];
                let name = if spec.attrs.is_empty() { "compiler".to_string() } else { spec.attrs[rng.below(spec.attrs.len())].name.to_string() };
                obj.insert(name, json_value(rng, None));
            }
            let v = if rng.one_in(10) { json_value(rng, None) } else { serde_json::Value::Object(obj) };
            v.to_string().into_bytes()
        }
    }
}

fn json_value(rng: &mut Rng, s: Option<&str>) -> serde_json::Value {
    use serde_json::Value;
    match (s, rng.below(7)) {
        (Some(s), 0..=3) => Value::String(s.into()),
        (_, 0) => Value::String(rng.pick(&["gemm", "c", "sm_90", "", "cpu", "true"]).to_string()),
        (_, 1) => Value::from(rng.interesting_i64()),
        (_, 2) => Value::Bool(rng.one_in(2)),
        (_, 3) => Value::Null,
        (_, 4) => serde_json::json!(f64::from_bits(rng.bits()).to_string()),
        (_, 5) => Value::Array(vec![Value::from(1), Value::String("x".into())]),
        _ => serde_json::json!({"nested": rng.interesting_i64()}),
    }
}

fn exec_target(b: &[u8], _: &Corpus) -> bool {
    let Ok(s) = std::str::from_utf8(b) else { return false };
    let one = tessera_stages::target::Target::parse(s);
    if let Ok(t) = &one {
        // The canonical form parses back to the same target.
        let again = tessera_stages::target::Target::parse(&t.canonical()).expect("a canonical target parses");
        assert_eq!(again.canonical(), t.canonical(), "canonical form is not stable");
    }
    let lines: Vec<String> = s.lines().map(str::to_string).collect();
    let _ = tessera_stages::target::TargetSet::parse(&lines);
    one.is_ok()
}

// ---------------------------------------------------------------------------------------------- manifests

fn toml_value(rng: &mut Rng) -> String {
    match rng.below(9) {
        0 | 1 => rng.interesting_i64().to_string(),
        2 => format!("\"{}\"", rng.pick(&["mlp3", "bert-tiny", "resnet18", "fp16", "fp32", "gpt2", "", "../../x.onnx", "/etc/passwd", "a\\\"b"])),
        3 => rng.pick(&["true", "1.5", "-0.0", "inf", "nan", "1e400"]).to_string(),
        4 => format!("[{}, {}]", rng.interesting_i64(), rng.interesting_i64()),
        5 => format!("{{ input_ids = [{}, {}], x = [] }}", rng.interesting_i64(), rng.interesting_i64()),
        6 => "[]".into(),
        7 => format!("{{ a = {} }}", rng.interesting_i64()),
        _ => "\"mlp3\"".into(),
    }
}

fn gen_manifest(rng: &mut Rng, c: &Corpus) -> Vec<u8> {
    if rng.one_in(3) {
        let mut b = rng.pick(&c.manifests).clone().into_bytes();
        mutate_bytes(rng, &mut b, &[]);
        return b;
    }
    const KEYS: [&str; 10] = ["model", "batch", "seq", "image", "precision", "name", "onnx", "shapes", "junk", "entry"];
    let mut s = String::new();
    for _ in 0..rng.below(4) {
        s += if rng.one_in(10) { "[entry]\n" } else { "[[entry]]\n" };
        for _ in 0..rng.below(6) {
            let k = rng.pick(&KEYS);
            let v = match *k {
                "model" if !rng.one_in(3) => format!("\"{}\"", rng.pick(&["mlp3", "bert-tiny", "resnet18", "gpt2-2layer", "vit-tiny"])),
                "batch" | "seq" | "image" if !rng.one_in(3) => rng.interesting_i64().to_string(),
                _ => toml_value(rng),
            };
            s += &format!("{k} = {v}\n");
        }
        s += "\n";
    }
    s.into_bytes()
}

fn exec_manifest(b: &[u8], _: &Corpus) -> bool {
    let Ok(text) = std::str::from_utf8(b) else { return false };
    let path = Path::new("fuzz/zoo.toml");
    match tessera_fixtures::parse_manifest(text, path) {
        Ok(m) => {
            // What it writes back reads back to the same entries.
            let again = tessera_fixtures::parse_manifest(&m.to_toml(), path).expect("a written manifest parses");
            assert_eq!(again.to_toml(), m.to_toml(), "manifest does not round-trip");
            true
        }
        Err(e) => {
            assert!(e.to_string().contains("zoo.toml"), "a manifest error does not name the file: {e}");
            false
        }
    }
}

// ---------------------------------------------------------------------------------------------- npy

fn gen_npy(rng: &mut Rng, c: &Corpus) -> Vec<u8> {
    if rng.one_in(3) {
        let mut b = rng.pick(&c.npys).clone();
        mutate_bytes(rng, &mut b, &c.npys);
        return b;
    }
    let descr = rng.pick(&["<f4", ">f4", "<f8", ">f8", "<i8", "<i4", "|b1", "<f2", "<u1", "|O", "|V8", "<U4", "<c8", "[('a', '<f4')]", "<f16", "x"]);
    let fortran = rng.pick(&["True", "False", "1", "None"]);
    let ndim = rng.below(5);
    let dims: Vec<String> = (0..ndim)
        .map(|_| if rng.one_in(3) { rng.interesting_i64().to_string() } else { (rng.below(5) + 1).to_string() })
        .collect();
    let shape = if ndim == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape}, }}");
    if descr.starts_with('[') {
        header = format!("{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}");
    }
    let version = *rng.pick(&[1u8, 1, 2, 3, 0, 9]);
    let hlen_size = if version == 1 { 2 } else { 4 };
    let pre = 6 + 2 + hlen_size;
    let total = (pre + header.len() + 1).div_ceil(64) * 64;
    while pre + header.len() + 1 < total {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY".to_vec();
    b.extend([version, 0]);
    if hlen_size == 2 {
        b.extend((header.len() as u16).to_le_bytes());
    } else {
        b.extend((header.len() as u32).to_le_bytes());
    }
    b.extend(header.as_bytes());
    let n = match rng.below(4) {
        0 => 0,
        1 => rng.below(64),
        _ => rng.below(512),
    };
    b.extend((0..n).map(|_| rng.bits() as u8));
    b
}

fn exec_npy(b: &[u8], _: &Corpus) -> bool {
    let path = Path::new("fuzz/input.npy");
    let check = |r: Result<Tensor, tessera_stages::npy::NpyError>| match r {
        Ok(t) => {
            assert_eq!(t.bytes().len(), t.ty.size_bytes(), "a tensor read from .npy has the wrong byte count");
            true
        }
        Err(e) => {
            assert!(e.to_string().starts_with("fuzz/input.npy"), "an npy error does not name the file: {e}");
            false
        }
    };
    let mut ok = check(tessera_stages::npy::read_bytes(b, path));
    for d in [DType::F32, DType::BF16, DType::I64, DType::Bool] {
        ok |= check(tessera_stages::npy::read_bytes_as(b, path, d));
    }
    ok
}

// ---------------------------------------------------------------------------------------------- artifacts

const HEADER_LEN: usize = 64;

/// Frames a body's bytes and a data section as an artifact, with correct lengths and digest (the layout
/// of kernels/src/artifact: header, body, zero padding to 64, data), so a mutation reaches the decoder
/// and the validator instead of stopping at the digest check.
fn frame(body: &[u8], data: &[u8]) -> Vec<u8> {
    let data_start = (HEADER_LEN + body.len()).div_ceil(64) * 64;
    let mut out = Vec::with_capacity(data_start + data.len());
    out.extend_from_slice(b"TESSERA\x1a");
    // The version the reader reads (a stale number here would stop every framed case at the version check).
    out.extend_from_slice(&tessera_kernels::artifact::FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    out.extend_from_slice(&[0; 32]);
    out.extend_from_slice(body);
    out.resize(data_start, 0);
    out.extend_from_slice(data);
    let digest = blake3::hash(&out[HEADER_LEN..]);
    out[32..64].copy_from_slice(digest.as_bytes());
    out
}

/// (body bytes, data section, provenance section) of a well-formed artifact (seeds are written by the
/// pipeline, with provenance).
fn unframe(a: &[u8]) -> (&[u8], &[u8], &[u8]) {
    let body_len = u64::from_le_bytes(a[16..24].try_into().unwrap()) as usize;
    let data_len = u64::from_le_bytes(a[24..32].try_into().unwrap()) as usize;
    let data_start = (HEADER_LEN + body_len).div_ceil(64) * 64;
    (&a[HEADER_LEN..HEADER_LEN + body_len], &a[data_start..data_start + data_len], &a[data_start + data_len..])
}

/// A provenance section around `encoding` (the layout of kernels/src/artifact/provenance.rs), with a correct
/// length and digest.
fn provenance_section(encoding: &[u8]) -> Vec<u8> {
    let mut s = Vec::with_capacity(48 + encoding.len());
    s.extend_from_slice(&tessera_kernels::artifact::provenance::PROVENANCE_VERSION.to_le_bytes());
    s.extend_from_slice(&0u32.to_le_bytes());
    s.extend_from_slice(&(encoding.len() as u64).to_le_bytes());
    s.extend_from_slice(blake3::hash(encoding).as_bytes());
    s.extend_from_slice(encoding);
    s
}

fn gen_artifact(rng: &mut Rng, c: &Corpus) -> Vec<u8> {
    let seed = rng.pick(&c.artifacts);
    let (body, data, section) = unframe(seed);
    match rng.below(5) {
        // Raw damage: the digest check (or the length check) must catch it.
        0 => {
            let mut b = seed.clone();
            mutate_bytes(rng, &mut b, &[]);
            b
        }
        // Damaged body bytes behind a correct digest: the decoder and the validator see them.
        1 => {
            let mut b = body.to_vec();
            mutate_bytes(rng, &mut b, &[]);
            let mut d = data.to_vec();
            if rng.one_in(4) {
                mutate_bytes(rng, &mut d, &[]);
            }
            frame(&b, &d)
        }
        // A damaged provenance section behind a correct section digest (or not): its decoder sees it.
        4 => {
            let mut encoding = section.get(48..).unwrap_or_default().to_vec();
            mutate_bytes(rng, &mut encoding, &[]);
            let mut b = seed[..seed.len() - section.len()].to_vec();
            b.extend_from_slice(&provenance_section(&encoding));
            if rng.one_in(4) {
                mutate_bytes(rng, &mut b, &[]);
            }
            b
        }
        // A structurally hostile body (decoded, fields changed, re-encoded) behind a correct digest.
        _ => {
            let mut b: tessera_kernels::artifact::Body = postcard::from_bytes(body).expect("seed bodies decode");
            for _ in 0..1 + rng.below(3) {
                crate::mutate::mutate_body(rng, &mut b);
            }
            let mut d = data.to_vec();
            if rng.one_in(6) {
                d.truncate(rng.below(d.len() + 1));
            }
            frame(&postcard::to_stdvec(&b).expect("bodies encode"), &d)
        }
    }
}

fn exec_artifact(b: &[u8], _: &Corpus) -> bool {
    match tessera_kernels::artifact::Artifact::read_named(b, "fuzz/model.tsr") {
        Ok(a) => {
            // What the validator promises the runtime: every constant lies inside the data section.
            for i in 0..a.body.constants.len() {
                let _ = a.constant_bytes(i);
            }
            true
        }
        Err(e) => {
            assert!(e.to_string().contains("fuzz/model.tsr"), "an artifact error does not name the file: {e}");
            false
        }
    }
}

/// An allocation above max(64 MiB, 64x the input) is far beyond what these inputs justify: every size in
/// them is either checked against the bytes actually present, or bounded by the importer's own limits.
fn limit_small(len: usize) -> usize {
    (64 << 20usize).max(len.saturating_mul(64))
}

/// Imported models may legitimately compute (fold) constants larger than the file, up to the importer's
/// bound on constants computed at import: twice the model's own data (the file, plus at most the 16 KiB of
/// external data the corpus offers), at least MIN_FOLD_LIMIT. A fold may hold its inputs and its output at
/// once, hence twice that bound here.
fn limit_onnx(len: usize) -> usize {
    2 * tessera_stages::onnx::MIN_FOLD_LIMIT.max(len.saturating_add(64 << 10).saturating_mul(2)) + (1 << 20)
}

pub static TARGETS: [FuzzTarget; 6] = [
    FuzzTarget { name: "onnx-bytes", generate: gen_onnx_bytes, exec: import, alloc_limit: limit_onnx },
    FuzzTarget { name: "onnx-model", generate: gen_onnx_model, exec: import, alloc_limit: limit_onnx },
    FuzzTarget { name: "target", generate: gen_target, exec: exec_target, alloc_limit: limit_small },
    FuzzTarget { name: "manifest", generate: gen_manifest, exec: exec_manifest, alloc_limit: limit_small },
    FuzzTarget { name: "npy", generate: gen_npy, exec: exec_npy, alloc_limit: limit_small },
    FuzzTarget { name: "artifact", generate: gen_artifact, exec: exec_artifact, alloc_limit: limit_small },
];

pub fn target(name: &str) -> Option<&'static FuzzTarget> {
    TARGETS.iter().find(|t| t.name == name)
}
