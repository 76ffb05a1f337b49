//! Mutators: byte-level (flips, interesting values, inserts, deletes, splices) and structural (ONNX
//! models and artifact bodies: fields dropped, dimensions negative/huge/zero, attribute types wrong,
//! initializer sizes wrong, ops renamed, edges rewired into cycles, external data escaping the folder).

use crate::rng::Rng;
use tessera_kernels::artifact::{Body, Buf};
use tessera_stages::onnx::proto::{
    attribute_proto::AttributeType, tensor_shape_proto::dimension::Value as Dim, type_proto, AttributeProto, ModelProto, NodeProto,
    StringStringEntryProto, TensorProto,
};

/// Applies 1 to 8 byte mutations; `splice` are other inputs to splice from.
pub fn mutate_bytes(rng: &mut Rng, b: &mut Vec<u8>, splice: &[Vec<u8>]) {
    for _ in 0..1 + rng.below(8) {
        let len = b.len();
        match rng.below(9) {
            0 if len > 0 => {
                let i = rng.below(len);
                b[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                b[i] = *rng.pick(&[0u8, 0xff, 0x7f, 0x80, 1, b'-', b'9', b'"', b'[']);
            }
            2 if len >= 8 => {
                let i = rng.below(len - 7);
                let v = rng.interesting_i64().to_le_bytes();
                let n = *rng.pick(&[1usize, 2, 4, 8]);
                b[i..i + n].copy_from_slice(&v[..n]);
            }
            3 => {
                let i = rng.below(len + 1);
                let n = 1 + rng.below(16);
                let ins: Vec<u8> = (0..n).map(|_| rng.bits() as u8).collect();
                b.splice(i..i, ins);
            }
            4 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(64));
                b.drain(i..i + n);
            }
            5 if len > 0 => b.truncate(rng.below(len)),
            6 if len > 0 => {
                // Duplicate a range (repeated fields, nested messages).
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(128));
                let chunk = b[i..i + n].to_vec();
                let at = rng.below(len + 1);
                b.splice(at..at, chunk);
            }
            7 if !splice.is_empty() => {
                let other = rng.pick(splice);
                if !other.is_empty() {
                    let i = rng.below(other.len());
                    let n = 1 + rng.below((other.len() - i).min(256));
                    let at = rng.below(len + 1);
                    let end = (at + n).min(len);
                    b.splice(at..end, other[i..i + n].iter().copied());
                }
            }
            _ if len > 0 => {
                // A protobuf varint of an interesting value (lengths, dims).
                let i = rng.below(len);
                let mut v = rng.interesting_i64() as u64;
                let mut enc = Vec::new();
                loop {
                    let byte = (v & 0x7f) as u8;
                    v >>= 7;
                    if v == 0 {
                        enc.push(byte);
                        break;
                    }
                    enc.push(byte | 0x80);
                }
                let end = (i + enc.len()).min(len);
                b.splice(i..end, enc);
            }
            _ => b.push(rng.bits() as u8),
        }
    }
}

const OPS: [&str; 24] = [
    "Relu", "Add", "MatMul", "Gemm", "Conv", "Reshape", "Transpose", "Concat", "Gather", "Slice", "Softmax", "LayerNormalization",
    "BatchNormalization", "Split", "Expand", "ConstantOfShape", "Range", "Where", "Pad", "Resize", "Shape", "Constant", "Loop", "NotAnOp",
];

fn mutate_tensor(rng: &mut Rng, t: &mut TensorProto) {
    match rng.below(7) {
        0 if !t.dims.is_empty() => {
            let i = rng.below(t.dims.len());
            t.dims[i] = rng.interesting_i64();
        }
        1 => t.dims.push(*rng.pick(&[0, 1, 2, -1, 1 << 20, i64::MAX])),
        2 => {
            if let Some(r) = t.raw_data.as_mut() {
                let n = rng.below(r.len() + 1);
                r.truncate(n);
            } else {
                t.float_data.truncate(rng.below(t.float_data.len() + 1));
            }
        }
        3 => t.data_type = Some(*rng.pick(&[0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 16, 99, -1])),
        4 => {
            // External data, inside or outside the model's folder.
            t.data_location = Some(1);
            let loc = rng.pick(&["w.bin", "../outside/secret.bin", "sub/../../outside/secret.bin", "/etc/passwd", "", ".", "w.bin/.."]);
            t.external_data = vec![StringStringEntryProto { key: Some("location".into()), value: Some(loc.to_string()) }];
            if rng.one_in(2) {
                let off = rng.pick(&["0", "4", "-4", "18446744073709551615", "x"]).to_string();
                t.external_data.push(StringStringEntryProto { key: Some("offset".into()), value: Some(off) });
            }
            if rng.one_in(2) {
                let len = rng.pick(&["0", "16", "16384", "18446744073709551615", "99999999999"]).to_string();
                t.external_data.push(StringStringEntryProto { key: Some("length".into()), value: Some(len) });
            }
            t.raw_data = None;
        }
        5 => {
            t.raw_data = None;
            t.int64_data = vec![rng.interesting_i64(); rng.below(4)];
        }
        _ => t.name = if rng.one_in(2) { None } else { Some("dup".into()) },
    }
}

fn mutate_attr(rng: &mut Rng, a: &mut AttributeProto) {
    match rng.below(6) {
        0 => a.r#type = Some(*rng.pick(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 77])),
        1 => {
            a.i = Some(rng.interesting_i64());
            a.r#type = Some(AttributeType::Int as i32);
        }
        2 => {
            a.ints = (0..rng.below(6)).map(|_| rng.interesting_i64()).collect();
            a.r#type = Some(AttributeType::Ints as i32);
        }
        3 => {
            a.f = Some(*rng.pick(&[f32::NAN, f32::INFINITY, -1.0, 0.0, 1e30]));
        }
        4 => a.s = Some(rng.pick(&[&b""[..], b"NOTSET", b"SAME_UPPER", b"VALID", b"wrap", b"\xff\xfe"]).to_vec()),
        _ => a.name = Some(rng.pick(&["axis", "perm", "to", "pads", "value", "", "alpha", "group", "kernel_shape"]).to_string()),
    }
}

/// Applies one structural mutation to a model.
pub fn mutate_model(rng: &mut Rng, m: &mut ModelProto) {
    if rng.one_in(30) {
        m.opset_import.iter_mut().for_each(|o| o.version = Some(*rng.pick(&[0, 5, 6, 12, 22, -1, i64::MAX])));
        return;
    }
    let Some(g) = m.graph.as_mut() else { return };
    let names: Vec<String> = g.node.iter().flat_map(|n| n.output.iter().cloned()).chain(g.input.iter().filter_map(|i| i.name.clone())).collect();
    let nn = g.node.len();
    match rng.below(14) {
        // Fields dropped.
        0 if nn > 0 => {
            g.node.remove(rng.below(nn));
        }
        1 if nn > 0 => {
            let n = &mut g.node[rng.below(nn)];
            if !n.input.is_empty() {
                n.input.remove(rng.below(n.input.len()));
            } else {
                n.output.clear();
            }
        }
        2 if nn > 0 => {
            let n = &mut g.node[rng.below(nn)];
            if !n.attribute.is_empty() {
                n.attribute.remove(rng.below(n.attribute.len()));
            }
        }
        3 if !g.initializer.is_empty() => {
            let i = rng.below(g.initializer.len());
            if rng.one_in(2) {
                g.initializer.remove(i);
            } else {
                mutate_tensor(rng, &mut g.initializer[i]);
            }
        }
        // Dimensions of inputs.
        4 if !g.input.is_empty() => {
            let i = rng.below(g.input.len());
            if let Some(type_proto::Value::TensorType(tt)) = g.input[i].r#type.as_mut().and_then(|t| t.value.as_mut()) {
                match tt.shape.as_mut() {
                    Some(s) if !s.dim.is_empty() && !rng.one_in(5) => {
                        let d = rng.below(s.dim.len());
                        s.dim[d].value = Some(if rng.one_in(6) { Dim::DimParam("N".into()) } else { Dim::DimValue(rng.interesting_i64()) });
                    }
                    _ => tt.shape = None,
                }
                if rng.one_in(4) {
                    tt.elem_type = Some(*rng.pick(&[0, 2, 8, 11, 13, 16, 99]));
                }
            } else {
                g.input[i].r#type = None;
            }
        }
        // Attributes of the wrong type or value.
        5 | 6 if nn > 0 => {
            let n = &mut g.node[rng.below(nn)];
            if n.attribute.is_empty() || rng.one_in(4) {
                let mut a = AttributeProto { name: Some("axis".into()), r#type: Some(AttributeType::Int as i32), i: Some(1), ..Default::default() };
                mutate_attr(rng, &mut a);
                n.attribute.push(a);
            } else {
                let k = rng.below(n.attribute.len());
                mutate_attr(rng, &mut n.attribute[k]);
            }
        }
        // Ops renamed, domains changed.
        7 if nn > 0 => {
            let n = &mut g.node[rng.below(nn)];
            if rng.one_in(6) {
                n.domain = Some(rng.pick(&["com.microsoft", "ai.onnx", "ai.onnx.ml", ""]).to_string());
            } else {
                n.op_type = Some(rng.pick(&OPS).to_string());
            }
        }
        // Edges rewired: to a later node's output (a cycle or use before definition), to a missing name,
        // outputs made to collide.
        8 | 9 if nn > 0 && !names.is_empty() => {
            let i = rng.below(nn);
            let n = &mut g.node[i];
            let name = if rng.one_in(6) { "nowhere".to_string() } else { rng.pick(&names).clone() };
            if rng.one_in(3) && !n.output.is_empty() {
                let k = rng.below(n.output.len());
                n.output[k] = name;
            } else if !n.input.is_empty() {
                let k = rng.below(n.input.len());
                n.input[k] = name;
            } else {
                n.input.push(name);
            }
        }
        10 if nn > 1 => {
            let (a, b) = (rng.below(nn), rng.below(nn));
            g.node.swap(a, b);
        }
        // Graph outputs and inputs listed twice or dropped.
        11 => {
            if !g.output.is_empty() && rng.one_in(2) {
                let o = g.output[rng.below(g.output.len())].clone();
                g.output.push(o);
            } else if !g.input.is_empty() {
                let i = g.input[rng.below(g.input.len())].clone();
                g.input.push(i);
            } else {
                g.output.clear();
            }
        }
        // A Constant node with a hostile tensor.
        12 => {
            let mut t = TensorProto { dims: vec![2, 2], data_type: Some(1), float_data: vec![1.0; 4], ..Default::default() };
            mutate_tensor(rng, &mut t);
            let out = format!("c{}", rng.below(100));
            let a = AttributeProto { name: Some("value".into()), r#type: Some(AttributeType::Tensor as i32), t: Some(t), ..Default::default() };
            let at = rng.below(nn + 1);
            g.node.insert(
                at,
                NodeProto { op_type: Some("Constant".into()), output: vec![out.clone()], attribute: vec![a], ..Default::default() },
            );
            if let Some(n) = g.node.get_mut(rng.below(nn + 1)) {
                if !n.input.is_empty() {
                    let k = rng.below(n.input.len());
                    n.input[k] = out;
                }
            }
        }
        _ => {
            // ConstantOfShape / Expand / Reshape fed a hostile shape.
            let dims: Vec<i64> = (0..1 + rng.below(4)).map(|_| rng.interesting_i64()).collect();
            let t = TensorProto { dims: vec![dims.len() as i64], data_type: Some(7), int64_data: dims, name: Some("hs".into()), ..Default::default() };
            g.initializer.push(t);
            let op = rng.pick(&["ConstantOfShape", "Expand", "Reshape", "Tile", "Range"]);
            let inp = names.first().cloned().unwrap_or_default();
            let inputs = if *op == "ConstantOfShape" { vec!["hs".to_string()] } else { vec![inp, "hs".to_string()] };
            let out = "hostile_out".to_string();
            g.node.push(NodeProto { op_type: Some(op.to_string()), input: inputs, output: vec![out.clone()], ..Default::default() });
            if let Some(o) = g.output.first_mut() {
                o.name = Some(out);
            }
        }
    }
}

fn mutate_buf(rng: &mut Rng, b: &mut Buf) {
    let i = *rng.pick(&[0u32, 1, 2, 7, 1000, u32::MAX]);
    *b = match rng.below(4) {
        0 => Buf::Input(i),
        1 => Buf::Value(i),
        2 => Buf::Const(i),
        _ => Buf::Scratch,
    };
}

fn big(rng: &mut Rng) -> u64 {
    *rng.pick(&[0u64, 1, 63, 64, 4096, 1 << 32, 1 << 40, u64::MAX, u64::MAX - 63])
}

fn mutate_shape(rng: &mut Rng, s: &mut Vec<usize>) {
    match rng.below(3) {
        0 if !s.is_empty() => {
            let i = rng.below(s.len());
            s[i] = big(rng) as usize;
        }
        1 => s.push(big(rng) as usize),
        _ => s.clear(),
    }
}

/// Applies one structural mutation to an artifact body.
pub fn mutate_body(rng: &mut Rng, b: &mut Body) {
    match rng.below(12) {
        0 => b.arena_bytes = big(rng),
        1 => b.scratch_bytes = big(rng),
        2 if !b.inputs.is_empty() => {
            let i = rng.below(b.inputs.len());
            let d = &mut b.inputs[i];
            match rng.below(4) {
                0 => d.offset = big(rng),
                1 => mutate_shape(rng, &mut d.ty.shape),
                2 => d.int_bound = rng.interesting_i64(),
                _ => d.name = if rng.one_in(2) { String::new() } else { b.outputs.first().map(|o| o.name.clone()).unwrap_or_default() },
            }
        }
        3 if !b.values.is_empty() => {
            let i = rng.below(b.values.len());
            if rng.one_in(2) {
                b.values[i].offset = big(rng);
            } else {
                mutate_shape(rng, &mut b.values[i].ty.shape);
            }
        }
        4 if !b.constants.is_empty() => {
            let i = rng.below(b.constants.len());
            if rng.one_in(2) {
                b.constants[i].offset = big(rng);
            } else {
                mutate_shape(rng, &mut b.constants[i].ty.shape);
            }
        }
        5 if !b.steps.is_empty() => {
            let i = rng.below(b.steps.len());
            let s = &mut b.steps[i];
            match rng.below(4) {
                0 => s.module = *rng.pick(&[0, 1, 2, u32::MAX]),
                1 => s.function = *rng.pick(&[0, 1, 5, u32::MAX]),
                2 if !s.args.is_empty() => {
                    let k = rng.below(s.args.len());
                    mutate_buf(rng, &mut s.args[k]);
                }
                _ => {
                    if rng.one_in(2) {
                        s.args.pop();
                    } else {
                        s.args.push(Buf::Scratch);
                    }
                }
            }
        }
        6 if b.steps.len() > 1 => {
            let (x, y) = (rng.below(b.steps.len()), rng.below(b.steps.len()));
            b.steps.swap(x, y);
        }
        7 if !b.outputs.is_empty() => {
            let i = rng.below(b.outputs.len());
            if rng.one_in(2) {
                mutate_buf(rng, &mut b.outputs[i].source);
            } else {
                mutate_shape(rng, &mut b.outputs[i].ty.shape);
            }
        }
        8 if !b.modules.is_empty() => {
            let i = rng.below(b.modules.len());
            let m = &mut b.modules[i];
            match rng.below(4) {
                0 if !m.functions.is_empty() => {
                    let f = rng.below(m.functions.len());
                    m.functions[f].scratch_bytes = big(rng);
                }
                1 if !m.functions.is_empty() => {
                    let f = rng.below(m.functions.len());
                    m.functions[f].symbol = rng.pick(&["", "x", "main"]).to_string();
                }
                2 => m.bytes.truncate(rng.below(m.bytes.len() + 1)),
                _ => m.backend = rng.pick(&["c", "gemm", "cuda", ""]).to_string(),
            }
        }
        9 if !b.steps.is_empty() => {
            b.steps.remove(rng.below(b.steps.len()));
        }
        10 if !b.values.is_empty() => {
            b.values.pop();
        }
        _ => {
            if !b.constants.is_empty() {
                b.constants.remove(rng.below(b.constants.len()));
            } else {
                b.modules.clear();
            }
        }
    }
}
