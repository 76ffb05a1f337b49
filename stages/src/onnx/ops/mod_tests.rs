use super::*;

#[test]
fn every_listed_op_has_a_converter_and_the_required_ones_are_listed() {
    for op in supported_ops() {
        assert!(converter(op).is_some(), "{op} listed without converter");
    }
    let required = "Conv ConvTranspose BatchNormalization Relu Clip LeakyRelu Sigmoid Tanh Erf Gelu HardSigmoid \
        HardSwish MaxPool AveragePool GlobalAveragePool Flatten Gemm MatMul Add Sub Mul Div Pow Sqrt Exp Log Neg \
        Reciprocal Min Max Where Equal Less Greater LessOrEqual GreaterOrEqual Not IsNaN Mod Cast ReduceMean \
        ReduceSum ReduceMax Softmax LogSoftmax LayerNormalization Reshape Transpose Concat Split Slice Squeeze \
        Unsqueeze Gather GatherElements Expand Pad Shape ConstantOfShape Constant Identity Range Tile CumSum GatherND \
        ScatterND";
    for op in required.split_whitespace() {
        assert!(supported_ops().contains(&op), "{op} is required but not supported");
    }
    assert!(converter("NoSuchOp").is_none());
}
