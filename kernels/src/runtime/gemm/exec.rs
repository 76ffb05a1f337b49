//! Execution of a validated plan function over the caller's buffers.
//!
//! Everything here relies on [`super::validate::validate`] having accepted the plan
//! against the function's signature when the module was loaded: every view below lies inside its buffer, no
//! step writes what it reads, inputs and constants are never written. Slices are made only for the exact
//! ranges a step touches, so a step's mutable output never overlaps a shared input slice.

use super::depthwise::{self, Geometry};
use super::epilogue::{self, Op};
use super::im2col::{self, Window};
use super::profile;
use crate::runtime::gemm::plan::{Buf, Depthwise2d, EpOp, Epilogue, GeluKind, Im2col, Mat, PlanFunction, Sgemm, Step, View};

/// The buffers of one call: argument and scratch base pointers, and the plan's constants.
pub struct Mem<'a> {
    /// `[inputs.., outputs..]`, each pointing at f32 elements.
    pub args: &'a [*mut u8],
    pub scratch: *mut f32,
    pub consts: &'a [Vec<f32>],
}

fn us(x: u64) -> usize {
    // Validation bounded every size by a buffer length, which fits in usize.
    x as usize
}

impl Mem<'_> {
    fn base(&self, b: Buf) -> *const f32 {
        match b {
            Buf::Arg(i) => self.args[i as usize] as *const f32,
            Buf::Scratch => self.scratch,
            Buf::Const(i) => self.consts[i as usize].as_ptr(),
        }
    }

    /// # Safety
    /// `len` elements at `v` lie in a live buffer nobody writes while the slice lives.
    unsafe fn read(&self, v: View, len: usize) -> &[f32] {
        if len == 0 {
            return &[];
        }
        std::slice::from_raw_parts(self.base(v.buf).add(us(v.offset)), len)
    }

    /// # Safety
    /// `len` elements at `v` lie in a live, writable buffer no other live slice overlaps.
    #[allow(clippy::mut_from_ref)] // the buffers are the caller's, not borrowed from `self`
    unsafe fn write(&self, v: View, len: usize) -> &mut [f32] {
        if len == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut((self.base(v.buf) as *mut f32).add(us(v.offset)), len)
    }

    /// The epilogue's ops with their sources resolved.
    unsafe fn ops(&self, e: &Epilogue) -> Vec<Op<'_>> {
        e.ops
            .iter()
            .map(|op| match *op {
                EpOp::Add { src, inner, count } => Op::Add { src: self.read(src, us(count)), inner },
                EpOp::Relu => Op::Relu,
                EpOp::Clip { min, max } => Op::Clip { min, max },
                EpOp::Gelu(GeluKind::Erf) => Op::GeluErf,
                EpOp::Gelu(GeluKind::Tanh) => Op::GeluTanh,
                EpOp::Sigmoid => Op::Sigmoid,
                EpOp::HardSwish => Op::HardSwish,
            })
            .collect()
    }
}

/// Runs every step of `f` in order.
///
/// # Safety
/// `f` was validated against the signature the buffers of `mem` follow, and those buffers are live.
pub unsafe fn run(f: &PlanFunction, mem: &Mem) {
    let one = |step: &Step| match step {
        Step::Sgemm(s) => sgemm(s, mem),
        Step::Im2col(s) => im2col(s, mem),
        Step::Depthwise2d(s) => depthwise(s, mem),
    };
    if profile::enabled() {
        profile::timed(&f.symbol, &f.steps, one);
    } else {
        f.steps.iter().for_each(one);
    }
}

fn offset(m: &Mat, idx: &[u64]) -> usize {
    us(m.at.offset + idx.iter().zip(&m.batch_strides).map(|(i, s)| i * s).sum::<u64>())
}

/// The GEMM's threads: those of the rayon pool the run executes on (the runtime pool, sized to the cores the
/// process may use), so a GEMM never oversubscribes the cores the run's other loops share.
fn parallelism() -> gemm::Parallelism {
    match rayon::current_num_threads() {
        0 | 1 => gemm::Parallelism::None,
        n => gemm::Parallelism::Rayon(n),
    }
}

unsafe fn sgemm(s: &Sgemm, mem: &Mem) {
    let (m, n, k) = (us(s.m), us(s.n), us(s.k));
    let batches: u64 = s.batch.iter().product();
    if m == 0 || n == 0 || batches == 0 {
        return;
    }
    let ops = mem.ops(&s.epilogue);
    let par = parallelism();
    let mut idx = vec![0u64; s.batch.len()];
    for bi in 0..us(batches) {
        let c = mem.write(View { buf: s.c.buf, offset: s.c.offset + (bi * m * n) as u64 }, m * n);
        if k == 0 {
            c.fill(0.0);
        } else {
            // SAFETY: validation bounds A, B and C inside their buffers for every batch index, C disjoint from
            // A and B; `read_dst = false` means C is written without being read (scratch may hold anything).
            gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                1,
                n as isize,
                false,
                mem.base(s.a.at.buf).add(offset(&s.a, &idx)),
                s.a.cs as isize,
                s.a.rs as isize,
                mem.base(s.b.at.buf).add(offset(&s.b, &idx)),
                s.b.cs as isize,
                s.b.rs as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                par,
            );
        }
        epilogue::apply(&ops, c, s.epilogue.base + (bi * m * n) as u64);
        // Next batch index, row-major.
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < s.batch[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

fn usv(v: &[u64]) -> Vec<usize> {
    v.iter().map(|&x| us(x)).collect()
}

unsafe fn im2col(s: &Im2col, mem: &Mem) {
    let (input, kernel, output) = (usv(&s.input), usv(&s.kernel), usv(&s.output));
    let (strides, pads, dil) = (usv(&s.strides), usv(&s.pads_begin), usv(&s.dilations));
    let c = us(s.channels);
    let isz: usize = input.iter().product();
    let len = c * kernel.iter().product::<usize>() * output.iter().product::<usize>();
    let w = Window { input: &input, kernel: &kernel, output: &output, strides: &strides, pads_begin: &pads, dilations: &dil };
    im2col::im2col(mem.read(s.x, c * isz), c, &w, mem.write(s.dst, len));
}

unsafe fn depthwise(s: &Depthwise2d, mem: &Mem) {
    let pair = |v: [u64; 2]| [us(v[0]), us(v[1])];
    let g = Geometry {
        channels: us(s.channels),
        multiplier: us(s.multiplier),
        input: pair(s.input),
        kernel: pair(s.kernel),
        output: pair(s.output),
        strides: pair(s.strides),
        pads_begin: pair(s.pads_begin),
        dilations: pair(s.dilations),
    };
    let (b, planes_in, planes_out) = (us(s.batch), g.channels, g.channels * g.multiplier);
    let x = mem.read(s.x, b * planes_in * g.input[0] * g.input[1]);
    let w = mem.read(s.w, planes_out * g.kernel[0] * g.kernel[1]);
    let out = mem.write(s.out, b * planes_out * g.output[0] * g.output[1]);
    let ops = mem.ops(&s.epilogue);
    depthwise::depthwise(x, w, out, &g, &ops, s.epilogue.base);
}
