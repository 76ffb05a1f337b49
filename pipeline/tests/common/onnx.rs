// Each test binary that includes this module uses part of it.
#![allow(dead_code)]
//! Small ONNX models for the pipeline's end-to-end tests, written with the importer's own prost types.

use prost::Message;
use tessera_stages::onnx::proto::{tensor_shape_proto, type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto};

/// An f32 graph input or output of a fixed shape.
pub fn f32_value(name: &str, dims: &[i64]) -> ValueInfoProto {
    let dim = dims.iter().map(|&d| tensor_shape_proto::Dimension { value: Some(tensor_shape_proto::dimension::Value::DimValue(d)), ..Default::default() }).collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto { value: Some(type_proto::Value::TensorType(type_proto::Tensor { elem_type: Some(1), shape: Some(TensorShapeProto { dim }) })), ..Default::default() }),
        ..Default::default()
    }
}

/// A graph output known by name only.
pub fn untyped_value(name: &str) -> ValueInfoProto {
    ValueInfoProto { name: Some(name.into()), ..Default::default() }
}

/// A default-domain node with one output.
pub fn node(op: &str, name: &str, inputs: &[&str], output: &str) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(name.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    }
}

/// An f32 initializer.
pub fn f32_initializer(name: &str, dims: &[i64], data: Vec<f32>) -> TensorProto {
    TensorProto { name: Some(name.into()), dims: dims.to_vec(), data_type: Some(1), float_data: data, ..Default::default() }
}

/// Writes an opset-17 model of these nodes, inputs, outputs and initializers to `path`.
pub fn write(path: &std::path::Path, nodes: Vec<NodeProto>, inputs: Vec<ValueInfoProto>, outputs: Vec<ValueInfoProto>, initializer: Vec<TensorProto>) {
    let model = ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(GraphProto { name: Some("g".into()), node: nodes, input: inputs, output: outputs, initializer, ..Default::default() }),
        ..Default::default()
    };
    std::fs::write(path, model.encode_to_vec()).unwrap();
}
