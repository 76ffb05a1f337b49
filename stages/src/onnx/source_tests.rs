use super::*;
use crate::onnx::proto::{tensor_proto::DataLocation, StringStringEntryProto};

fn ext(location: &str) -> TensorProto {
    TensorProto {
        data_location: Some(DataLocation::External as i32),
        external_data: vec![StringStringEntryProto { key: Some("location".into()), value: Some(location.into()) }],
        ..Default::default()
    }
}

#[test]
fn every_reachable_tensor_names_its_file() {
    let sub = GraphProto { initializer: vec![ext("sub.bin")], ..Default::default() };
    let node = NodeProto {
        attribute: vec![
            AttributeProto { t: Some(ext("attr.bin")), ..Default::default() },
            AttributeProto { g: Some(sub), ..Default::default() },
            AttributeProto { sparse_tensor: Some(SparseTensorProto { values: Some(ext("sparse.bin")), ..Default::default() }), ..Default::default() },
        ],
        ..Default::default()
    };
    let g = GraphProto { node: vec![node], initializer: vec![ext("w.bin"), ext("w.bin"), TensorProto::default()], ..Default::default() };
    let model = ModelProto { graph: Some(g), ..Default::default() };
    let got: Vec<String> = external_locations(&model).into_iter().collect();
    assert_eq!(got, ["attr.bin", "sparse.bin", "sub.bin", "w.bin"]);
    // The wire-format scan finds the same, in a model with functions and training graphs too.
    let mut model = model;
    model.functions.push(crate::onnx::proto::FunctionProto {
        node: vec![NodeProto { attribute: vec![AttributeProto { tensors: vec![ext("fn.bin")], ..Default::default() }], ..Default::default() }],
        ..Default::default()
    });
    model.training_info.push(crate::onnx::proto::TrainingInfoProto {
        algorithm: Some(GraphProto { initializer: vec![ext("train.bin")], ..Default::default() }),
        ..Default::default()
    });
    model.ir_version = Some(8);
    model.doc_string = Some("location".into());
    use prost::Message;
    let bytes = model.encode_to_vec();
    let scanned: Vec<String> = scan_external_locations(&bytes).unwrap().into_iter().collect();
    assert_eq!(scanned, external_locations(&model).into_iter().collect::<Vec<_>>());
    assert_eq!(scanned, ["attr.bin", "fn.bin", "sparse.bin", "sub.bin", "train.bin", "w.bin"]);
    // A real export (no external data), and bytes cut short.
    let bert = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/src/onnx/testdata/bert_tiny_opset17.onnx")).unwrap();
    assert!(scan_external_locations(&bert).unwrap().is_empty());
    assert!(scan_external_locations(&bert[..bert.len() / 2]).is_err());
    assert!(scan_external_locations(&bytes[..bytes.len() - 3]).is_err());
}

#[test]
fn the_recipe_follows_every_file_the_name_and_the_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.onnx");
    std::fs::write(&model, b"model").unwrap();
    std::fs::write(dir.path().join("w.bin"), b"weights").unwrap();
    let file = file_digest(&model).unwrap();
    let locs = vec!["w.bin".to_string()];
    let shapes = BTreeMap::new();
    let r = |name: &str, file: Digest, locs: &[String], shapes: &BTreeMap<String, Vec<usize>>| recipe(name, &model, file, locs, shapes).unwrap();
    let base = r("m", file, &locs, &shapes);
    assert_eq!(base, r("m", file, &locs, &shapes));
    assert_ne!(base, r("n", file, &locs, &shapes));
    assert_ne!(base, r("m", Digest([7; 32]), &locs, &shapes));
    assert_ne!(base, r("m", file, &[], &shapes));
    assert_ne!(base, r("m", file, &locs, &[("x".to_string(), vec![1, 2])].into()));
    // The external file's content, not its name or time, is in the recipe.
    std::fs::write(dir.path().join("w.bin"), b"weightz").unwrap();
    assert_ne!(base, r("m", file, &locs, &shapes));
    std::fs::write(dir.path().join("w.bin"), b"weights").unwrap();
    assert_eq!(base, r("m", file, &locs, &shapes));
    // A missing file and a location outside the folder are recorded as such.
    std::fs::remove_file(dir.path().join("w.bin")).unwrap();
    assert_ne!(base, r("m", file, &locs, &shapes));
    assert_ne!(r("m", file, &["../w.bin".to_string()], &shapes), base);
}
