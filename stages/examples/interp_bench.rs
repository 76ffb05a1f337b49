//! Times the reference interpreter on a BERT-base-sized encoder (12 layers, hidden 768, 12 heads,
//! FFN 3072, one 128-token sequence) and a ResNet-50-sized conv stack (224x224, bottlenecks 3-4-6-3),
//! both built here with the IR builder and deterministic random weights.
//!
//! `cargo run -p tessera-stages --example interp_bench [-- bert|resnet|all [runs] [--profile]]`

use std::time::Instant;
use tessera_stages::interp::{eval_op, random_inputs, random_tensor, run_graph};
use tessera_stages::ir::*;

type R<T> = Result<T, BuildError>;

/// Builds graphs with weights drawn from seeded streams (one stream per parameter, in creation order).
struct B {
    g: Graph,
    stream: u64,
}

impl B {
    fn param(&mut self, name: &str, shape: &[usize], scale: f32) -> ValueId {
        self.stream += 1;
        let t = random_tensor(&TensorType::f32(shape.to_vec()), 42, self.stream, 0);
        let v: Vec<f32> = t.to_f32_vec().iter().map(|x| x * scale).collect();
        self.g.add_const(name, Tensor::from_f32(shape.to_vec(), &v))
    }

    fn op(&mut self, name: &str, op: Op, inputs: &[ValueId]) -> R<ValueId> {
        self.g.add(name, op, inputs)
    }

    fn bin(&mut self, name: &str, b: BinaryOp, x: ValueId, y: ValueId) -> R<ValueId> {
        self.g.add(name, Op::Binary(b), &[x, y])
    }

    fn linear(&mut self, name: &str, x: ValueId, k: usize, n: usize) -> R<ValueId> {
        let w = self.param(&format!("{name}.w"), &[k, n], 1.0 / (k as f32).sqrt());
        let b = self.param(&format!("{name}.b"), &[n], 0.02);
        let y = self.op(&format!("{name}.mm"), Op::MatMul, &[x, w])?;
        self.bin(&format!("{name}.add"), BinaryOp::Add, y, b)
    }

    fn layer_norm(&mut self, name: &str, x: ValueId, n: usize) -> R<ValueId> {
        let s = self.g.add_const(format!("{name}.s"), Tensor::from_f32(vec![n], &vec![1.0; n]));
        let b = self.param(&format!("{name}.b"), &[n], 0.02);
        let axis = self.g.ty(x).rank() - 1;
        self.op(name, Op::LayerNorm { axis, epsilon: 1e-12 }, &[x, s, b])
    }
}

fn bert_base(seq: usize) -> R<Graph> {
    let (hidden, heads, layers, ffn, vocab) = (768, 12, 12, 3072, 30522);
    let dh = hidden / heads;
    let mut b = B { g: Graph::new("bert-base"), stream: 0 };
    let ids = b.g.add_input("input_ids", TensorType::new(DType::I64, [1, seq]));
    let mask = b.g.add_input("attention_mask", TensorType::new(DType::I64, [1, seq]));
    let tt = b.g.add_input("token_type_ids", TensorType::new(DType::I64, [1, seq]));
    let we = b.param("word_emb", &[vocab, hidden], 0.02);
    let pe = b.param("pos_emb", &[1, seq, hidden], 0.02);
    let te = b.param("type_emb", &[2, hidden], 0.02);
    let e = b.op("emb.words", Op::Gather { axis: 0 }, &[we, ids])?;
    let t = b.op("emb.types", Op::Gather { axis: 0 }, &[te, tt])?;
    let e = b.bin("emb.add1", BinaryOp::Add, e, t)?;
    let e = b.bin("emb.add2", BinaryOp::Add, e, pe)?;
    let mut x = b.layer_norm("emb.ln", e, hidden)?;
    // (1 - mask) * -10000, shaped [1, 1, 1, seq] to broadcast over heads and queries.
    let mf = b.op("mask.cast", Op::Cast { to: DType::F32 }, &[mask])?;
    let one = b.g.add_const("one", Tensor::scalar_f32(1.0));
    let neg = b.g.add_const("neg", Tensor::scalar_f32(-10000.0));
    let inv = b.bin("mask.inv", BinaryOp::Sub, one, mf)?;
    let bias = b.bin("mask.scale", BinaryOp::Mul, inv, neg)?;
    let bias = b.op("mask.reshape", Op::Reshape { shape: vec![1, 1, 1, seq] }, &[bias])?;
    let scale = b.g.add_const("inv_sqrt_dh", Tensor::scalar_f32(1.0 / (dh as f32).sqrt()));
    for l in 0..layers {
        let p = format!("l{l}");
        let split = |b: &mut B, name: &str, v: ValueId, perm: Vec<usize>| -> R<ValueId> {
            let r = b.op(&format!("{name}.r"), Op::Reshape { shape: vec![1, seq, heads, dh] }, &[v])?;
            b.op(&format!("{name}.t"), Op::Transpose { perm }, &[r])
        };
        let q = b.linear(&format!("{p}.q"), x, hidden, hidden)?;
        let k = b.linear(&format!("{p}.k"), x, hidden, hidden)?;
        let v = b.linear(&format!("{p}.v"), x, hidden, hidden)?;
        let q = split(&mut b, &format!("{p}.qh"), q, vec![0, 2, 1, 3])?;
        let k = split(&mut b, &format!("{p}.kh"), k, vec![0, 2, 3, 1])?;
        let v = split(&mut b, &format!("{p}.vh"), v, vec![0, 2, 1, 3])?;
        let s = b.op(&format!("{p}.scores"), Op::MatMul, &[q, k])?;
        let s = b.bin(&format!("{p}.scaled"), BinaryOp::Mul, s, scale)?;
        let s = b.bin(&format!("{p}.masked"), BinaryOp::Add, s, bias)?;
        let pr = b.op(&format!("{p}.softmax"), Op::Softmax { axis: 3 }, &[s])?;
        let c = b.op(&format!("{p}.ctx"), Op::MatMul, &[pr, v])?;
        let c = b.op(&format!("{p}.ctx.t"), Op::Transpose { perm: vec![0, 2, 1, 3] }, &[c])?;
        let c = b.op(&format!("{p}.ctx.r"), Op::Reshape { shape: vec![1, seq, hidden] }, &[c])?;
        let o = b.linear(&format!("{p}.o"), c, hidden, hidden)?;
        let o = b.bin(&format!("{p}.res1"), BinaryOp::Add, o, x)?;
        let h = b.layer_norm(&format!("{p}.ln1"), o, hidden)?;
        let f = b.linear(&format!("{p}.ff1"), h, hidden, ffn)?;
        let f = b.op(&format!("{p}.gelu"), Op::Gelu { approximate: GeluApprox::Erf }, &[f])?;
        let f = b.linear(&format!("{p}.ff2"), f, ffn, hidden)?;
        let f = b.bin(&format!("{p}.res2"), BinaryOp::Add, f, h)?;
        x = b.layer_norm(&format!("{p}.ln2"), f, hidden)?;
    }
    let cls = b.op("pool.first", Op::Slice { axes: vec![1], starts: vec![0], ends: vec![1], steps: vec![1] }, &[x])?;
    let cls = b.op("pool.r", Op::Reshape { shape: vec![1, hidden] }, &[cls])?;
    let pooled = b.linear("pool.dense", cls, hidden, hidden)?;
    let pooled = b.op("pooler_output", Op::Unary(UnaryOp::Tanh), &[pooled])?;
    b.g.outputs.extend([x, pooled]);
    Ok(b.g)
}

fn conv(b: &mut B, name: &str, x: ValueId, out: usize, k: usize, stride: usize, relu: bool) -> R<ValueId> {
    let c = b.g.ty(x).shape[1];
    let w = b.param(&format!("{name}.w"), &[out, c, k, k], (2.0 / (c * k * k) as f32).sqrt());
    let bias = b.param(&format!("{name}.b"), &[out], 0.02);
    let p = k / 2;
    let a = ConvAttrs { strides: vec![stride; 2], pads: vec![p; 4], dilations: vec![1, 1], group: 1 };
    let y = b.op(name, Op::Conv(a), &[x, w, bias])?;
    if relu {
        b.op(&format!("{name}.relu"), Op::Unary(UnaryOp::Relu), &[y])
    } else {
        Ok(y)
    }
}

fn resnet50(batch: usize) -> R<Graph> {
    let mut b = B { g: Graph::new("resnet-50"), stream: 0 };
    let x = b.g.add_input("input", TensorType::f32([batch, 3, 224, 224]));
    let mut x = conv(&mut b, "stem", x, 64, 7, 2, true)?;
    let p = PoolAttrs { kernel: vec![3, 3], strides: vec![2, 2], pads: vec![1; 4], dilations: vec![1, 1], ceil_mode: false };
    x = b.op("maxpool", Op::MaxPool(p), &[x])?;
    for (s, (&blocks, &width)) in [3usize, 4, 6, 3].iter().zip(&[64usize, 128, 256, 512]).enumerate() {
        for blk in 0..blocks {
            let n = format!("s{s}b{blk}");
            let stride = if blk == 0 && s > 0 { 2 } else { 1 };
            let y = conv(&mut b, &format!("{n}.c1"), x, width, 1, 1, true)?;
            let y = conv(&mut b, &format!("{n}.c2"), y, width, 3, stride, true)?;
            let y = conv(&mut b, &format!("{n}.c3"), y, width * 4, 1, 1, false)?;
            let sc = if blk == 0 { conv(&mut b, &format!("{n}.down"), x, width * 4, 1, stride, false)? } else { x };
            let y = b.bin(&format!("{n}.add"), BinaryOp::Add, y, sc)?;
            x = b.op(&format!("{n}.relu"), Op::Unary(UnaryOp::Relu), &[y])?;
        }
    }
    let x = b.op("gap", Op::GlobalAveragePool, &[x])?;
    let x = b.op("flatten", Op::Reshape { shape: vec![batch, 2048] }, &[x])?;
    let logits = b.linear("fc", x, 2048, 1000)?;
    b.g.outputs.push(logits);
    Ok(b.g)
}

fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn bench(g: &Graph, runs: usize) {
    let inputs = random_inputs(g, 0);
    let weights_mib = g.constant_bytes() as f64 / (1 << 20) as f64;
    println!("{}: {} nodes, {:.0} MiB of weights", g.name, g.nodes.len(), weights_mib);
    let mut first = None;
    for r in 0..runs {
        let t = Instant::now();
        let out = run_graph(g, &inputs).unwrap_or_else(|e| panic!("{e}"));
        let dt = t.elapsed().as_secs_f64();
        let o = out[out.len() - 1].to_f32_vec();
        assert!(o.iter().all(|v| v.is_finite()), "non-finite output");
        // Same inputs, same outputs, bit for bit, on every run.
        match &first {
            None => first = Some(out),
            Some(f) => assert_eq!(f, &out, "run {r} differs from run 0"),
        }
        println!("  run {r}: {dt:.3} s");
    }
    if let Some(m) = peak_rss_mib() {
        println!("  peak RSS so far: {m:.0} MiB");
    }
}

/// Time per op kind over one run (every value kept alive: for profiling only).
fn profile(g: &Graph) {
    let inputs = random_inputs(g, 0);
    let mut env: Vec<Option<Tensor>> = vec![None; g.values.len()];
    for (&v, t) in g.inputs.iter().zip(inputs) {
        env[v.index()] = Some(t);
    }
    let mut per_op: std::collections::BTreeMap<&str, (usize, f64)> = Default::default();
    for n in &g.nodes {
        let args: Vec<&Tensor> = n.inputs.iter().map(|&v| g.constant(v).or(env[v.index()].as_ref()).expect("computed")).collect();
        let t = Instant::now();
        let out = eval_op(&n.op, &args).unwrap_or_else(|e| panic!("{}: {e}", n.name));
        let e = per_op.entry(n.op.name()).or_default();
        e.0 += 1;
        e.1 += t.elapsed().as_secs_f64();
        for (&o, t) in n.outputs.iter().zip(out) {
            env[o.index()] = Some(t);
        }
    }
    let mut rows: Vec<_> = per_op.into_iter().collect();
    rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
    for (op, (count, secs)) in rows {
        println!("  {op:<20} {count:>4} nodes {secs:>8.3} s");
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map(String::as_str).unwrap_or("all");
    let runs: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(3);
    if args.iter().any(|a| a == "--profile") {
        profile(&if which == "resnet" { resnet50(1) } else { bert_base(128) }.expect("builds"));
        return;
    }
    if which == "all" || which == "bert" {
        let t = Instant::now();
        let g = bert_base(128).expect("BERT-base builds");
        println!("built in {:.2} s", t.elapsed().as_secs_f64());
        bench(&g, runs);
    }
    if which == "all" || which == "resnet" {
        let t = Instant::now();
        let g = resnet50(1).expect("ResNet-50 builds");
        println!("built in {:.2} s", t.elapsed().as_secs_f64());
        bench(&g, runs);
    }
}
