//! The `gemm` backend's plan format: what a [`gemm::FORMAT`](crate::runtime::gemm::FORMAT) module's
//! bytes hold, as postcard.
//!
//! A plan is a list of functions (one per partition, in the module's function order); a function is a list of
//! steps over three kinds of buffers: its arguments (`[inputs.., outputs..]` of the calling convention), its
//! scratch buffer, and small constants the lowering inlined into the plan. Every shape, stride and offset is
//! static and counted in f32 elements, so the runtime validates a whole plan once at load time (every read
//! and write in bounds, no write to an input or a constant, no step writing what it reads) and then runs it
//! with no further checks and no allocation.
//!
//! The format is versioned by [`PLAN_VERSION`], the first field of [`Plan`]: bump it on any change to these
//! types, and the runtime refuses a plan of another version with an error instead of misreading it.

use serde::{Deserialize, Serialize};

/// Version of the encoded form; a loader accepts exactly this one.
pub const PLAN_VERSION: u32 = 2;

/// One module's plan: its functions in the order of the module's `functions`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub version: u32,
    pub functions: Vec<PlanFunction>,
}

/// One partition's function.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanFunction {
    /// Must equal the symbol of the function's `FunctionInfo`.
    pub symbol: String,
    /// Small constants inlined by the lowering (each at most `INLINE_CONST_MAX` elements): biases, tiny weights.
    pub consts: Vec<Vec<f32>>,
    /// Scratch size in f32 elements; the function's `FunctionInfo::scratch_bytes` is exactly 4 times this.
    pub scratch_len: u64,
    pub steps: Vec<Step>,
}

/// A buffer a step reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Buf {
    /// Argument `i` of the calling convention: inputs first (read-only), then outputs.
    Arg(u32),
    /// The function's scratch buffer.
    Scratch,
    /// Inlined constant `i` of [`PlanFunction::consts`] (read-only).
    Const(u32),
}

/// A position in a buffer, in f32 elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    pub buf: Buf,
    pub offset: u64,
}

impl View {
    /// The same buffer, `extra` elements further on.
    pub fn at(self, extra: u64) -> View {
        View { buf: self.buf, offset: self.offset + extra }
    }
}

/// A strided matrix operand, repeated over the GEMM's batch dimensions: element `(batch index b, row i,
/// column j)` is at `offset + sum(b[d] * batch_strides[d]) + i * rs + j * cs` (a stride of 0 broadcasts).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mat {
    pub at: View,
    pub rs: u64,
    pub cs: u64,
    pub batch_strides: Vec<u64>,
}

/// One step of a function, run in order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Step {
    Sgemm(Sgemm),
    Im2col(Im2col),
    Depthwise2d(Depthwise2d),
}

/// `C[b] = A[b] (m x k) · B[b] (k x n)` for every index `b` of `batch` (row-major order), then the epilogue.
/// `C` is dense: batch `b` (flattened) starts at `c.offset + b * m * n`, rows of `n` elements.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sgemm {
    pub batch: Vec<u64>,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub a: Mat,
    pub b: Mat,
    pub c: View,
    pub epilogue: Epilogue,
}

/// Lays out the receptive fields of `channels` consecutive channel planes of `x` (each of shape `input`) as
/// a dense `[channels * prod(kernel), prod(output)]` matrix at `dst`: row `(c, kernel tap)`, column (output
/// position); taps falling into the padding are 0.
///
/// When the next step is an unbatched GEMM whose B operand is exactly this matrix, the runtime may run the
/// two together without writing the matrix (in blocks of output rows): `dst` must be scratch that no later
/// step reads, and its contents after the pair are unspecified. The gemm lowering allocates it for that one
/// GEMM and frees it right after.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Im2col {
    pub x: View,
    pub channels: u64,
    pub input: Vec<u64>,
    pub kernel: Vec<u64>,
    pub output: Vec<u64>,
    pub strides: Vec<u64>,
    pub pads_begin: Vec<u64>,
    pub dilations: Vec<u64>,
    pub dst: View,
}

/// A direct 2-D depthwise convolution (one input channel per group, `multiplier` output channels per input
/// channel): `out[n, c*multiplier + j]` is input plane `x[n, c]` correlated with filter `w[c*multiplier + j, 0]`.
/// Layouts are dense OIHW for `w` (I = 1) and, for `x` and `out`, dense NCHW or, if `channels_last`, dense
/// NHWC (then `multiplier` is 1). Then the epilogue, over the whole output in its layout's order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Depthwise2d {
    pub channels_last: bool,
    pub x: View,
    pub w: View,
    pub out: View,
    pub batch: u64,
    pub channels: u64,
    pub multiplier: u64,
    pub input: [u64; 2],
    pub kernel: [u64; 2],
    pub output: [u64; 2],
    pub strides: [u64; 2],
    pub pads_begin: [u64; 2],
    pub dilations: [u64; 2],
    pub epilogue: Epilogue,
}

/// Elementwise operations applied, in order, to a step's output right after it is computed, in one pass while
/// the output is hot. `base` is the flat index, within the fused tensor, of the step's first output element:
/// an `Add` reads `src[((base + i) / inner) % count]` for output element `i`, which is how per-column biases
/// (`inner = 1`, `count = n`), per-channel biases (`inner = spatial size`, `count = channels`), scalars
/// (`count = 1`) and same-shaped residuals (`inner = 1`, `count = numel`) are all spelled.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Epilogue {
    pub base: u64,
    pub ops: Vec<EpOp>,
}

/// One epilogue operation; the semantics are those of the IR op it was fused from.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum EpOp {
    Add { src: View, inner: u64, count: u64 },
    Relu,
    Clip { min: f32, max: f32 },
    Gelu(GeluKind),
    Sigmoid,
    HardSwish,
}

/// The two GELU formulas (kept apart from the IR's enum so the plan format does not move with the IR).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GeluKind {
    Erf,
    Tanh,
}

/// Why a plan was refused; names the function (and step) at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PlanError(pub String);

impl Plan {
    /// The canonical bytes of the plan (postcard: a stable, documented wire format).
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a plan always encodes")
    }

    /// Decodes a module's bytes; refuses trailing bytes and any version but [`PLAN_VERSION`].
    pub fn decode(bytes: &[u8]) -> Result<Plan, PlanError> {
        // The version is the first field: read it alone first so an old plan gets a version error, not a
        // confusing decode error from a layout it does not have.
        let (version, _) = postcard::take_from_bytes::<u32>(bytes).map_err(|e| PlanError(format!("gemm plan: cannot read its version: {e}")))?;
        if version != PLAN_VERSION {
            return Err(PlanError(format!("gemm plan: format version {version}, this runtime reads version {PLAN_VERSION}")));
        }
        let (plan, rest) = postcard::take_from_bytes::<Plan>(bytes).map_err(|e| PlanError(format!("gemm plan: corrupt: {e}")))?;
        if !rest.is_empty() {
            return Err(PlanError(format!("gemm plan: {} trailing bytes after the plan", rest.len())));
        }
        Ok(plan)
    }
}

impl PlanFunction {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a plan function always encodes")
    }

    pub fn decode(bytes: &[u8]) -> Result<PlanFunction, PlanError> {
        match postcard::take_from_bytes::<PlanFunction>(bytes) {
            Ok((f, [])) => Ok(f),
            Ok((_, rest)) => Err(PlanError(format!("gemm plan function: {} trailing bytes", rest.len()))),
            Err(e) => Err(PlanError(format!("gemm plan function: corrupt: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Plan {
        let v = |buf, offset| View { buf, offset };
        Plan {
            version: PLAN_VERSION,
            functions: vec![PlanFunction {
                symbol: "f".into(),
                consts: vec![vec![1.0, 2.0]],
                scratch_len: 16,
                steps: vec![Step::Sgemm(Sgemm {
                    batch: vec![],
                    m: 2,
                    n: 2,
                    k: 2,
                    a: Mat { at: v(Buf::Arg(0), 0), rs: 2, cs: 1, batch_strides: vec![] },
                    b: Mat { at: v(Buf::Arg(1), 0), rs: 2, cs: 1, batch_strides: vec![] },
                    c: v(Buf::Arg(2), 0),
                    epilogue: Epilogue {
                        base: 0,
                        ops: vec![EpOp::Add { src: v(Buf::Const(0), 0), inner: 1, count: 2 }, EpOp::Gelu(GeluKind::Tanh)],
                    },
                })],
            }],
        }
    }

    #[test]
    fn round_trips_and_is_deterministic() {
        let p = sample();
        let bytes = p.encode();
        assert_eq!(bytes, sample().encode());
        assert_eq!(Plan::decode(&bytes).unwrap(), p);
        let f = &p.functions[0];
        assert_eq!(&PlanFunction::decode(&f.encode()).unwrap(), f);
    }

    #[test]
    fn refuses_other_versions_truncation_and_trailing_bytes() {
        let mut p = sample();
        p.version = PLAN_VERSION + 1;
        let e = Plan::decode(&p.encode()).unwrap_err().0;
        assert!(e.contains("version"), "{e}");
        let bytes = sample().encode();
        assert!(Plan::decode(&bytes[..bytes.len() - 1]).is_err());
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Plan::decode(&longer).unwrap_err().0.contains("trailing"));
        assert!(Plan::decode(&[]).is_err());
    }
}
