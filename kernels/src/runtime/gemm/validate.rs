//! Validation of a plan function against its `FunctionInfo`: the one check that makes running a plan safe.
//!
//! The runtime hands a validated plan's pointers to `matrixmultiply::sgemm` and its own loops without further
//! bounds checks, so a corrupt or hostile plan must be refused here, with an error naming the function and
//! step, never reach undefined behaviour. What is checked, with overflow-checked arithmetic throughout:
//! - every argument is f32 and its size fits the address space; scratch bytes are exactly 4 × `scratch_len`;
//! - every buffer index exists; every read and write (the convex hull of its strided footprint) lies inside
//!   its buffer; strides never exceed the buffer they stride over, and matrix row and column strides are
//!   non-zero (so the work of a step is bounded by the sizes of its buffers: a corrupt plan cannot hang);
//! - nothing writes an input or a constant, and no step writes a range of a buffer it also reads (GEMM
//!   operands must not alias C; an epilogue source must not be the output it updates);
//! - geometry: ranks agree, strides and dilations are at least 1, every spatial parameter fits in `u32`, so the
//!   signed coordinate arithmetic of the sliding-window loops cannot overflow.

use super::plan::{Buf, Depthwise2d, EpOp, Epilogue, Im2col, Mat, PlanError, PlanFunction, Sgemm, Step, View};
use crate::module::FunctionInfo;
use crate::dtype::DType;

/// The lengths, in f32 elements, of every buffer a function may touch.
#[derive(Clone, Debug)]
pub struct BufferLens {
    /// `[inputs.., outputs..]`.
    pub args: Vec<u64>,
    pub n_inputs: usize,
    pub scratch: u64,
    pub consts: Vec<u64>,
}

impl BufferLens {
    fn len(&self, b: Buf) -> Option<u64> {
        match b {
            Buf::Arg(i) => self.args.get(i as usize).copied(),
            Buf::Scratch => Some(self.scratch),
            Buf::Const(i) => self.consts.get(i as usize).copied(),
        }
    }

    fn writable(&self, b: Buf) -> bool {
        match b {
            Buf::Arg(i) => (i as usize) >= self.n_inputs,
            Buf::Scratch => true,
            Buf::Const(_) => false,
        }
    }
}

/// A half-open range `[start, end)` of one buffer.
#[derive(Clone, Copy, Debug)]
struct Span {
    buf: Buf,
    start: u64,
    end: u64,
}

/// Largest value of any spatial parameter (sizes, strides, pads, dilations).
const MAX_SPATIAL: u64 = u32::MAX as u64;

struct Ctx<'a> {
    f: &'a PlanFunction,
    lens: &'a BufferLens,
    step: usize,
}

impl Ctx<'_> {
    fn err<T>(&self, msg: impl std::fmt::Display) -> Result<T, PlanError> {
        Err(PlanError(format!("gemm plan function '{}', step {}: {msg}", self.f.symbol, self.step)))
    }

    fn mul(&self, a: u64, b: u64) -> Result<u64, PlanError> {
        a.checked_mul(b).map_or_else(|| self.err("size overflows"), Ok)
    }

    fn add(&self, a: u64, b: u64) -> Result<u64, PlanError> {
        a.checked_add(b).map_or_else(|| self.err("size overflows"), Ok)
    }

    fn product(&self, dims: &[u64]) -> Result<u64, PlanError> {
        dims.iter().try_fold(1u64, |acc, &d| self.mul(acc, d))
    }

    fn buf_len(&self, b: Buf) -> Result<u64, PlanError> {
        match self.lens.len(b) {
            Some(l) => Ok(l),
            None => self.err(format!("buffer {b:?} does not exist")),
        }
    }

    /// The span of `len` dense elements at `v`, checked against its buffer (`None` when empty).
    fn dense(&self, v: View, len: u64) -> Result<Option<Span>, PlanError> {
        self.span(v.buf, v.offset, len)
    }

    fn span(&self, buf: Buf, start: u64, len: u64) -> Result<Option<Span>, PlanError> {
        let cap = self.buf_len(buf)?;
        if len == 0 {
            return Ok(None);
        }
        let end = self.add(start, len)?;
        if end > cap {
            return self.err(format!("reaches element {end} of {buf:?}, which has {cap}"));
        }
        Ok(Some(Span { buf, start, end }))
    }

    /// The hull of a strided matrix's footprint over all batches.
    fn mat(&self, m: &Mat, batch: &[u64], rows: u64, cols: u64) -> Result<Option<Span>, PlanError> {
        if m.batch_strides.len() != batch.len() {
            return self.err(format!("{} batch strides for {} batch dimensions", m.batch_strides.len(), batch.len()));
        }
        let cap = self.buf_len(m.at.buf)?;
        if rows == 0 || cols == 0 || batch.contains(&0) {
            // Nothing is read (the runtime skips empty products), so the strides are never used.
            return Ok(None);
        }
        for &s in m.batch_strides.iter().chain([&m.rs, &m.cs]) {
            if s > cap {
                return self.err(format!("stride {s} exceeds the {cap} elements of {:?}", m.at.buf));
            }
        }
        // Row and column strides of 0 would let a tiny buffer stand for an arbitrarily long product; only
        // batches broadcast. So the work of a step stays bounded by the sizes of its buffers.
        if m.rs == 0 || m.cs == 0 {
            return self.err("a matrix row or column stride of 0");
        }
        let mut last = self.add(self.mul(rows - 1, m.rs)?, self.mul(cols - 1, m.cs)?)?;
        for (&d, &s) in batch.iter().zip(&m.batch_strides) {
            last = self.add(last, self.mul(d - 1, s)?)?;
        }
        self.span(m.at.buf, m.at.offset, self.add(last, 1)?)
    }

    /// The span of a dense output of `len` elements at `v`, which must be writable.
    fn write(&self, v: View, len: u64, what: &str) -> Result<Option<Span>, PlanError> {
        self.buf_len(v.buf)?;
        if !self.lens.writable(v.buf) {
            return self.err(format!("{what} writes {:?}, which is read-only (an input or a constant)", v.buf));
        }
        self.dense(v, len)
    }

    fn disjoint(&self, w: Option<Span>, reads: &[Option<Span>]) -> Result<(), PlanError> {
        let Some(w) = w else { return Ok(()) };
        for r in reads.iter().flatten() {
            if r.buf == w.buf && r.start < w.end && w.start < r.end {
                return self.err(format!(
                    "writes {:?}[{}..{}] while reading {:?}[{}..{}]",
                    w.buf, w.start, w.end, r.buf, r.start, r.end
                ));
            }
        }
        Ok(())
    }

    fn spatial(&self, what: &str, v: &[u64], nd: usize, min: u64) -> Result<(), PlanError> {
        if v.len() != nd {
            return self.err(format!("{what} has {} entries for {nd} spatial dimensions", v.len()));
        }
        if let Some(&x) = v.iter().find(|&&x| x < min || x > MAX_SPATIAL) {
            return self.err(format!("{what} value {x} is outside {min}..={MAX_SPATIAL}"));
        }
        Ok(())
    }

    /// The reads of an epilogue applied to `total` output elements written at `out`.
    fn epilogue(&self, e: &Epilogue, total: u64, out: Option<Span>) -> Result<Vec<Option<Span>>, PlanError> {
        self.add(e.base, total)?;
        let mut reads = Vec::new();
        for op in &e.ops {
            match *op {
                EpOp::Add { src, inner, count } => {
                    if inner == 0 || count == 0 {
                        return self.err(format!("epilogue Add with inner {inner}, count {count} (both must be >= 1)"));
                    }
                    let r = self.dense(src, if total == 0 { 0 } else { count })?;
                    self.disjoint(out, &[r])?;
                    reads.push(r);
                }
                EpOp::Clip { min, max } if min.is_nan() || max.is_nan() => return self.err("epilogue Clip with a NaN bound"),
                EpOp::Relu | EpOp::Clip { .. } | EpOp::Gelu(_) | EpOp::Sigmoid | EpOp::HardSwish => {}
            }
        }
        Ok(reads)
    }

    fn sgemm(&self, s: &Sgemm) -> Result<(), PlanError> {
        let nb = self.product(&s.batch)?;
        let a = self.mat(&s.a, &s.batch, s.m, s.k)?;
        let b = self.mat(&s.b, &s.batch, s.k, s.n)?;
        let total = self.mul(nb, self.mul(s.m, s.n)?)?;
        let c = self.write(s.c, total, "Sgemm")?;
        self.disjoint(c, &[a, b])?;
        self.epilogue(&s.epilogue, total, c)?;
        Ok(())
    }

    fn im2col(&self, s: &Im2col) -> Result<(), PlanError> {
        let nd = s.input.len();
        if nd == 0 {
            return self.err("Im2col with no spatial dimensions");
        }
        self.spatial("input", &s.input, nd, 0)?;
        self.spatial("kernel", &s.kernel, nd, 0)?;
        self.spatial("output", &s.output, nd, 0)?;
        self.spatial("strides", &s.strides, nd, 1)?;
        self.spatial("pads_begin", &s.pads_begin, nd, 0)?;
        self.spatial("dilations", &s.dilations, nd, 1)?;
        if s.channels > MAX_SPATIAL {
            return self.err(format!("{} channels", s.channels));
        }
        let x = self.dense(s.x, self.mul(s.channels, self.product(&s.input)?)?)?;
        let rows = self.mul(s.channels, self.product(&s.kernel)?)?;
        let dst = self.write(s.dst, self.mul(rows, self.product(&s.output)?)?, "Im2col")?;
        self.disjoint(dst, &[x])
    }

    fn depthwise(&self, s: &Depthwise2d) -> Result<(), PlanError> {
        for (what, v, min) in [
            ("input", &s.input, 0),
            ("kernel", &s.kernel, 0),
            ("output", &s.output, 0),
            ("strides", &s.strides, 1),
            ("pads_begin", &s.pads_begin, 0),
            ("dilations", &s.dilations, 1),
        ] {
            self.spatial(what, v, 2, min)?;
        }
        for (what, v) in [("batch", s.batch), ("channels", s.channels), ("multiplier", s.multiplier)] {
            if v > MAX_SPATIAL {
                return self.err(format!("{what} {v} is too large"));
            }
        }
        if s.channels_last && s.multiplier != 1 {
            return self.err(format!("a channels-last depthwise step has multiplier 1, not {}", s.multiplier));
        }
        let planes_in = self.mul(s.batch, s.channels)?;
        let planes_out = self.mul(planes_in, s.multiplier)?;
        let x = self.dense(s.x, self.mul(planes_in, self.product(&s.input)?)?)?;
        let w = self.dense(s.w, self.mul(self.mul(s.channels, s.multiplier)?, self.product(&s.kernel)?)?)?;
        let total = self.mul(planes_out, self.product(&s.output)?)?;
        let out = self.write(s.out, total, "Depthwise2d")?;
        self.disjoint(out, &[x, w])?;
        self.epilogue(&s.epilogue, total, out)?;
        Ok(())
    }
}

/// The buffer lengths of a function with this signature and plan, or why they cannot be used.
pub fn buffer_lens(f: &PlanFunction, info: &FunctionInfo) -> Result<BufferLens, PlanError> {
    let fail = |msg: String| Err(PlanError(format!("gemm plan function '{}': {msg}", f.symbol)));
    if f.symbol != info.symbol {
        return fail(format!("its signature is for function '{}'", info.symbol));
    }
    // Every buffer's byte size must fit an isize, so element offsets and strides convert to isize losslessly.
    let max_elems = (isize::MAX as u64) / 4;
    let mut args = Vec::with_capacity(info.inputs.len() + info.outputs.len());
    for (k, t) in info.inputs.iter().chain(&info.outputs).enumerate() {
        if t.dtype != DType::F32 {
            return fail(format!("argument {k} is {t}; the gemm backend runs f32 only"));
        }
        let n = t.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64)).filter(|&n| n <= max_elems);
        match n {
            Some(n) => args.push(n),
            None => return fail(format!("argument {k} of type {t} is too large")),
        }
    }
    if f.scratch_len > max_elems || f.scratch_len.checked_mul(4) != Some(info.scratch_bytes) {
        return fail(format!("plan needs {} scratch floats, the signature declares {} bytes", f.scratch_len, info.scratch_bytes));
    }
    Ok(BufferLens {
        args,
        n_inputs: info.inputs.len(),
        scratch: f.scratch_len,
        consts: f.consts.iter().map(|c| c.len() as u64).collect(),
    })
}

/// Checks a plan function against its signature (see the module doc for what is checked).
pub fn validate(f: &PlanFunction, info: &FunctionInfo) -> Result<BufferLens, PlanError> {
    let lens = buffer_lens(f, info)?;
    for (step, s) in f.steps.iter().enumerate() {
        let cx = Ctx { f, lens: &lens, step };
        match s {
            Step::Sgemm(s) => cx.sgemm(s)?,
            Step::Im2col(s) => cx.im2col(s)?,
            Step::Depthwise2d(s) => cx.depthwise(s)?,
        }
    }
    Ok(lens)
}

#[cfg(test)]
mod tests {
    use super::super::plan::*;
    use super::*;
    use crate::tensor::TensorType;

    fn info(scratch_bytes: u64) -> FunctionInfo {
        FunctionInfo {
            symbol: "f".into(),
            inputs: vec![TensorType::f32([2, 3]), TensorType::f32([3, 4])],
            outputs: vec![TensorType::f32([2, 4])],
            scratch_bytes,
        }
    }

    fn mat(buf: Buf, rs: u64) -> Mat {
        Mat { at: View { buf, offset: 0 }, rs, cs: 1, batch_strides: vec![] }
    }

    fn gemm() -> Sgemm {
        Sgemm {
            batch: vec![],
            m: 2,
            n: 4,
            k: 3,
            a: mat(Buf::Arg(0), 3),
            b: mat(Buf::Arg(1), 4),
            c: View { buf: Buf::Arg(2), offset: 0 },
            epilogue: Epilogue::default(),
        }
    }

    fn func(steps: Vec<Step>) -> PlanFunction {
        PlanFunction { symbol: "f".into(), consts: vec![vec![0.0; 4]], scratch_len: 0, steps }
    }

    fn check(s: Sgemm) -> Result<BufferLens, PlanError> {
        validate(&func(vec![Step::Sgemm(s)]), &info(0))
    }

    #[test]
    fn accepts_a_well_formed_gemm() {
        let mut g = gemm();
        g.epilogue.ops = vec![EpOp::Add { src: View { buf: Buf::Const(0), offset: 0 }, inner: 1, count: 4 }, EpOp::Relu];
        let lens = check(g).unwrap();
        assert_eq!(lens.args, vec![6, 12, 8]);
    }

    #[test]
    fn refuses_out_of_bounds_and_bad_indices() {
        type Mutation = Box<dyn Fn(&mut Sgemm)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|g| g.m = 3), "reaches element"),
            (Box::new(|g| g.c.offset = 1), "reaches element"),
            (Box::new(|g| g.a.at.buf = Buf::Arg(7)), "does not exist"),
            (Box::new(|g| g.b.rs = 100), "stride"),
            (Box::new(|g| g.a.cs = 0), "stride of 0"),
            (Box::new(|g| g.c.buf = Buf::Arg(0)), "read-only"),
            (Box::new(|g| g.c.buf = Buf::Const(0)), "read-only"),
            (Box::new(|g| g.batch = vec![2]), "batch strides"),
            (Box::new(|g| g.m = u64::MAX), "overflow"),
            (
                Box::new(|g| g.epilogue.ops = vec![EpOp::Add { src: View { buf: Buf::Const(0), offset: 1 }, inner: 1, count: 4 }]),
                "reaches element",
            ),
            (Box::new(|g| g.epilogue.ops = vec![EpOp::Add { src: View { buf: Buf::Arg(0), offset: 0 }, inner: 0, count: 1 }]), "inner"),
            (Box::new(|g| g.epilogue.ops = vec![EpOp::Add { src: g.c, inner: 1, count: 8 }]), "while reading"),
            (Box::new(|g| g.epilogue.ops = vec![EpOp::Clip { min: f32::NAN, max: 1.0 }]), "NaN"),
        ];
        for (mutate, want) in cases {
            let mut g = gemm();
            mutate(&mut g);
            let e = check(g.clone()).expect_err(&format!("{g:?} should be refused")).0;
            assert!(e.contains(want) && e.contains("'f', step 0"), "{e} (wanted '{want}')");
        }
    }

    #[test]
    fn refuses_signature_mismatches() {
        let f = func(vec![]);
        let mut i = info(0);
        i.symbol = "g".into();
        assert!(validate(&f, &i).unwrap_err().0.contains("'g'"));
        assert!(validate(&f, &info(4)).unwrap_err().0.contains("scratch"));
        let mut i = info(0);
        i.inputs[0].dtype = DType::F16;
        assert!(validate(&f, &i).unwrap_err().0.contains("f32 only"));
    }

    #[test]
    fn refuses_aliasing_in_scratch() {
        let mut f = func(vec![Step::Im2col(Im2col {
            x: View { buf: Buf::Scratch, offset: 0 },
            channels: 1,
            input: vec![2, 2],
            kernel: vec![1, 1],
            output: vec![2, 2],
            strides: vec![1, 1],
            pads_begin: vec![0, 0],
            dilations: vec![1, 1],
            dst: View { buf: Buf::Scratch, offset: 2 },
        })]);
        f.scratch_len = 8;
        assert!(validate(&f, &info(32)).unwrap_err().0.contains("while reading"));
        if let Step::Im2col(s) = &mut f.steps[0] {
            s.dst.offset = 4;
        }
        validate(&f, &info(32)).unwrap();
        if let Step::Im2col(s) = &mut f.steps[0] {
            s.strides[1] = 0;
        }
        assert!(validate(&f, &info(32)).unwrap_err().0.contains("strides"));
    }
}
