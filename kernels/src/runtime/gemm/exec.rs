//! Execution of a validated plan function over the caller's buffers.
//!
//! Everything here relies on [`super::validate::validate`] having accepted the plan
//! against the function's signature when the module was loaded: every view below lies inside its buffer, no
//! step writes what it reads, inputs and constants are never written. Slices are made only for the exact
//! ranges a step touches, so a step's mutable output never overlaps a shared input slice.

use super::depthwise::{self, Geometry};
use super::depthwise_nhwc;
use super::gemv;
use super::small_k;
use super::epilogue::{self, Op};
use super::im2col::{self, Window};
use super::profile;
use super::schedule::{self, Part, Unit, FUSE_MIN_COLS};
use crate::runtime::gemm::plan::{Buf, Depthwise2d, EpOp, Epilogue, GeluKind, Im2col, Mat, PlanFunction, Sgemm, Step, View};

/// The buffers of one call: argument and scratch base pointers, and the plan's constants.
pub struct Mem<'a> {
    /// `[inputs.., outputs..]`, each pointing at f32 elements.
    pub args: &'a [*mut u8],
    pub scratch: *mut f32,
    pub consts: &'a [Vec<f32>],
}

// SAFETY: `Mem` is only base pointers. It is shared by the image lanes of one unit, whose writes the schedule
// proved disjoint from every other lane's reads and writes.
unsafe impl Sync for Mem<'_> {}

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

/// Runs every step of `f` in order, as `units` group them (from [`schedule::schedule`] for `f`'s steps).
///
/// # Safety
/// `f` was validated against the signature the buffers of `mem` follow, and those buffers are live.
pub unsafe fn run(f: &PlanFunction, units: &[Unit], mem: &Mem) {
    let steps = &f.steps;
    let one = |u: &Unit| match u {
        Unit::Step(i) => match &steps[*i] {
            Step::Sgemm(s) => sgemm(s, mem, 0..batches(s), threads()),
            Step::Im2col(s) => im2col(s, mem),
            Step::Depthwise2d(s) => depthwise(s, mem, 0..s.batch, true),
        },
        Unit::Conv(i) => conv(steps, *i, mem, threads()),
        Unit::Images { lanes, .. } => {
            use rayon::prelude::*;
            let each = schedule::lane_threads(lanes.len(), threads());
            lanes.par_iter().for_each(|lane| lane.iter().for_each(|&p| part(steps, p, mem, each)));
        }
    };
    if profile::enabled() {
        profile::timed(&f.symbol, steps, units, one);
    } else {
        units.iter().for_each(one);
    }
}

/// One image's share of a layer, on `threads` threads (1: the calling thread).
///
/// # Safety
/// As [`run`]; `p` comes from the schedule of these steps, so no other image's part touches what it writes.
unsafe fn part(steps: &[Step], p: Part, mem: &Mem, threads: usize) {
    match p {
        Part::Conv(i) => conv(steps, i, mem, threads),
        Part::Gemm { step, image } => {
            let Step::Sgemm(s) = &steps[step] else { unreachable!("the schedule splits GEMMs by batch") };
            let inner: u64 = s.batch[1..].iter().product();
            sgemm(s, mem, image * inner..(image + 1) * inner, threads)
        }
        Part::Depthwise { step, image } => {
            let Step::Depthwise2d(s) = &steps[step] else { unreachable!("the schedule splits depthwise steps by batch") };
            depthwise(s, mem, image..image + 1, threads > 1)
        }
    }
}

fn offset(m: &Mat, idx: &[u64]) -> usize {
    us(m.at.offset + idx.iter().zip(&m.batch_strides).map(|(i, s)| i * s).sum::<u64>())
}

/// The GEMM's threads: those of the rayon pool the run executes on (the runtime pool, sized to the cores the
/// process may use), so a GEMM never oversubscribes the cores the run's other loops share.
fn threads() -> usize {
    rayon::current_num_threads().max(1)
}

/// Outputs (m * n) up to which a GEMM is cut into one single-threaded part per thread here rather than
/// threaded inside the gemm crate. Measured on MobileNetV2 (2 threads, the 2-core EPYC build machine): the
/// crate's own threads gave its small deep GEMMs nothing (64x196x384 and 96x196x576: 0.88-0.97x their 1-thread
/// time); cut here they take 0.50-0.63x the crate-threaded time, and the model's GEMMs 5.7 -> 4.7 ms. With
/// the GEMMs channels-last (pixels x channels), 256K rather than 64K took MobileNetV2's 196x576x96
/// layers from 84-87 to 64 us and moved no other layer beyond noise; larger GEMMs keep the crate's threading,
/// which shares one packing of each operand. A part repeats the packing of the operand it does not cut.
const SPLIT_MAX_OUTPUTS: usize = 256 * 1024;

/// A GEMM whose shorter output side is at most this is cut here whatever its size: a part then repeats
/// only the packing of a thin operand (`short side x k`), while the crate's threads ran ResNet-50's 64-row
/// convolutions (64x3136x576, 64x12544x147) at 120-135 GFLOP/s on two Xeon cores against 165-205 for its
/// other GEMMs.
const SPLIT_MAX_SHORT_SIDE: usize = 128;

/// Where a GEMM's operands and result lie: `c[i, j] = sum_p a[i, p] * b[p, j]`; C row-major with row
/// stride `ldc`, A and B with (column, row) strides.
#[derive(Clone, Copy)]
struct Operands {
    c: *mut f32,
    ldc: isize,
    a: *const f32,
    a_strides: (isize, isize),
    b: *const f32,
    b_strides: (isize, isize),
}

// SAFETY: shared only by `gemm_on`'s parts, which write disjoint rows or columns of C and read A and B while
// the buffers they point into are alive (the step's run).
unsafe impl Send for Operands {}
unsafe impl Sync for Operands {}

impl Operands {
    /// The GEMM of C's rows from `i` on.
    fn from_row(self, i: usize) -> Operands {
        Operands { c: self.c.wrapping_offset(i as isize * self.ldc), a: self.a.wrapping_offset(i as isize * self.a_strides.1), ..self }
    }

    /// The GEMM of C's columns from `j` on.
    fn from_column(self, j: usize) -> Operands {
        Operands { c: self.c.wrapping_add(j), b: self.b.wrapping_offset(j as isize * self.b_strides.0), ..self }
    }
}

/// One gemm-crate call over `o`.
///
/// # Safety
/// `o` points at operands of these sizes and strides, C disjoint from A and B.
unsafe fn gemm_call(m: usize, n: usize, k: usize, o: Operands, par: gemm::Parallelism) {
    // `read_dst = false`: C is written without being read (scratch may hold anything).
    gemm::gemm(m, n, k, o.c, 1, o.ldc, false, o.a, o.a_strides.0, o.a_strides.1, o.b, o.b_strides.0, o.b_strides.1, 0.0, 1.0, false, false, false, par)
}

/// `C (m x n) = A B` on `threads` threads: small or thin outputs in one single-threaded part per thread (the
/// longer side cut into whole 16-element blocks, the micro-kernels' widths), others threaded by the gemm crate.
///
/// # Safety
/// As [`gemm_call`].
unsafe fn gemm_on(m: usize, n: usize, k: usize, o: Operands, threads: usize) {
    if m == 1 && k > 0 && (o.b_strides.0 == 1 || o.b_strides.1 == 1) {
        return gemv_on(n, k, o, threads);
    }
    if threads <= 1 {
        return gemm_call(m, n, k, o, gemm::Parallelism::None);
    }
    if m * n > SPLIT_MAX_OUTPUTS && m.min(n) > SPLIT_MAX_SHORT_SIDE {
        return gemm_call(m, n, k, o, gemm::Parallelism::Rayon(threads));
    }
    let cut_rows = m >= n;
    let long = if cut_rows { m } else { n };
    let part = long.div_ceil(threads).next_multiple_of(16).max(1);
    rayon::scope(|scope| {
        for start in (0..long).step_by(part) {
            let len = part.min(long - start);
            let (pm, pn, p) = if cut_rows { (len, n, o.from_row(start)) } else { (m, len, o.from_column(start)) };
            // SAFETY: part `p` is rows (or columns) start..start + len of the caller's C and A (or B).
            scope.spawn(move |_| unsafe { gemm_call(pm, pn, k, p, gemm::Parallelism::None) });
        }
    });
}

/// A one-row GEMM ([`gemv`]) on `threads` threads, each a block of C's columns (whole 16-element blocks).
///
/// # Safety
/// As [`gemm_call`].
unsafe fn gemv_on(n: usize, k: usize, o: Operands, threads: usize) {
    let part = n.div_ceil(threads.max(1)).next_multiple_of(16).max(1);
    let run = |p: Operands, len: usize| {
        // SAFETY: `p` is C's columns from its start, `len` of them, with A and B as the caller gave them.
        unsafe { gemv::gemv(std::slice::from_raw_parts_mut(p.c, len), k, p.a, p.a_strides.0, p.b, p.b_strides.1, p.b_strides.0) }
    };
    if part >= n {
        return run(o, n);
    }
    rayon::scope(|scope| {
        for start in (0..n).step_by(part) {
            let len = part.min(n - start);
            let p = o.from_column(start);
            scope.spawn(move |_| run(p, len));
        }
    });
}

fn batches(s: &Sgemm) -> u64 {
    s.batch.iter().product()
}

/// Batches `range` (flat, row-major) of the GEMM `s`, one after another, each on `threads` threads.
unsafe fn sgemm(s: &Sgemm, mem: &Mem, range: std::ops::Range<u64>, threads: usize) {
    let (m, n, k) = (us(s.m), us(s.n), us(s.k));
    if m == 0 || n == 0 || range.is_empty() {
        return;
    }
    let ops = mem.ops(&s.epilogue);
    // The first batch's index, row-major.
    let mut idx = vec![0u64; s.batch.len()];
    let mut rest = range.start;
    for d in (0..idx.len()).rev() {
        idx[d] = rest % s.batch[d];
        rest /= s.batch[d];
    }
    for bi in range {
        let c = mem.write(View { buf: s.c.buf, offset: s.c.offset + bi * s.m * s.n }, m * n);
        let base = s.epilogue.base + bi * s.m * s.n;
        if small_k::fits(m, n, k) {
            let (a, b) = (mem.base(s.a.at.buf).add(offset(&s.a, &idx)), mem.base(s.b.at.buf).add(offset(&s.b, &idx)));
            // SAFETY: as below; the epilogue runs inside, tile by tile.
            small_k::gemm(c, m, n, k, a, s.a.rs as isize, s.a.cs as isize, b, s.b.rs as isize, s.b.cs as isize, &ops, base, threads > 1);
        } else if k == 0 {
            c.fill(0.0);
        } else {
            let o = Operands {
                c: c.as_mut_ptr(),
                ldc: n as isize,
                a: mem.base(s.a.at.buf).add(offset(&s.a, &idx)),
                a_strides: (s.a.cs as isize, s.a.rs as isize),
                b: mem.base(s.b.at.buf).add(offset(&s.b, &idx)),
                b_strides: (s.b.cs as isize, s.b.rs as isize),
            };
            // SAFETY: validation bounds A, B and C inside their buffers for every batch index, C disjoint from
            // A and B.
            gemm_on(m, n, k, o, threads);
        }
        if !small_k::fits(m, n, k) {
            epilogue::apply_on(&ops, c, base, threads > 1);
        }
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

/// Elements of one task's column block, about: 1 MiB, within the L2 of current x86 server cores.
const COLS_BLOCK_ELEMS: usize = 256 * 1024;
/// Columns (output positions) of a block at least: narrower GEMMs lose more to the micro-kernels' edges
/// than the block saves (ResNet-50's 7x7 layers in blocks of 14 columns took 1.7x the unfused time).
const COLS_BLOCK_MIN_N: usize = 256;

thread_local! {
    /// Each pool thread's column block, grown to the largest one it has built and then reused.
    static COLS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The im2col at step `i` fused with its GEMM at `i + 1` ([`Unit::Conv`], [`Part::Conv`]) on `threads`
/// threads, in blocks of whole output rows, a block per task: its columns into the thread's buffer, then one
/// single-threaded GEMM writing the block's columns of C. Then the epilogue over all of C. A column matrix
/// small enough to stay in the caches is one block.
unsafe fn conv(steps: &[Step], i: usize, mem: &Mem, threads: usize) {
    let (Step::Im2col(c), Step::Sgemm(g)) = (&steps[i], &steps[i + 1]) else { unreachable!("the schedule fuses an im2col with a GEMM") };
    let (input, kernel, output) = (usv(&c.input), usv(&c.kernel), usv(&c.output));
    let (strides, pads, dil) = (usv(&c.strides), usv(&c.pads_begin), usv(&c.dilations));
    let (m, n, k, channels) = (us(g.m), us(g.n), us(g.k), us(c.channels));
    let [oh, ow] = [output[0], output[1]];
    let out = mem.write(g.c, m * n);
    if m != 0 && n != 0 {
        let w = Window { input: &input, kernel: &kernel, output: &output, strides: &strides, pads_begin: &pads, dilations: &dil };
        let x = mem.read(c.x, channels * input[0] * input[1]);
        // Rows per block: the buffer's budget, but at least one block per thread while rows allow.
        let rows = if g.k * g.n <= FUSE_MIN_COLS {
            // Whole, or one block per thread (an image lane of several threads).
            oh.div_ceil(threads.max(1))
        } else {
            (COLS_BLOCK_ELEMS / (k * ow).max(1)).max(COLS_BLOCK_MIN_N.div_ceil(ow.max(1))).clamp(1, oh).min(oh.div_ceil(threads).max(1))
        };
        let o = Operands {
            c: out.as_mut_ptr(),
            ldc: n as isize,
            a: mem.base(g.a.at.buf).add(offset(&g.a, &[])),
            a_strides: (g.a.cs as isize, g.a.rs as isize),
            b: std::ptr::null(),
            b_strides: (1, 0),
        };
        let blocks = oh.div_ceil(rows);
        let block = |bi: usize| {
            let r = bi * rows..((bi + 1) * rows).min(oh);
            let nb = r.len() * ow;
            // Taken out of the thread's slot while in use, so nothing that runs meanwhile on this thread can
            // borrow it twice.
            let mut cols = COLS.take();
            if cols.len() < k * nb {
                cols.resize(k * nb, 0.0);
            }
            im2col::im2col_rows(x, channels, &w, r.clone(), &mut cols[..k * nb]);
            let p = Operands { b: cols.as_ptr(), b_strides: (1, nb as isize), ..o.from_column(r.start * ow) };
            // SAFETY: block `bi` writes columns r.start * ow .. + nb of C (disjoint from other blocks), reads A
            // and the thread's own column buffer.
            unsafe { gemm_call(m, nb, k, p, gemm::Parallelism::None) };
            COLS.set(cols);
        };
        if threads <= 1 || blocks == 1 {
            (0..blocks).for_each(block);
        } else {
            use rayon::prelude::*;
            (0..blocks).into_par_iter().for_each(block);
        }
    }
    epilogue::apply_on(&mem.ops(&g.epilogue), out, g.epilogue.base, threads > 1);
}

/// Images `images` of the depthwise step `s`, over the pool's threads if `parallel`.
unsafe fn depthwise(s: &Depthwise2d, mem: &Mem, images: std::ops::Range<u64>, parallel: bool) {
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
    let (isz, osz, taps) = super::schedule::depthwise_sizes(s);
    let (count, planes) = (images.end - images.start, s.channels * s.multiplier);
    let x = mem.read(s.x.at(images.start * s.channels * isz), us(count * s.channels * isz));
    let w = mem.read(s.w, us(planes * taps));
    let first = images.start * planes * osz;
    let out = mem.write(s.out.at(first), us(count * planes * osz));
    let ops = mem.ops(&s.epilogue);
    if s.channels_last {
        depthwise_nhwc::depthwise_nhwc(x, w, out, &g, &ops, s.epilogue.base + first, parallel);
    } else {
        depthwise::depthwise(x, w, out, &g, &ops, s.epilogue.base + first, parallel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GEMM cut into parts per thread (rows or columns, odd sizes, strided and transposed operands) gives
    /// the one-call result.
    #[test]
    fn parts_per_thread_match_one_call() {
        for (m, n, k, a_t, b_t) in [(37, 200, 19, false, false), (200, 37, 5, true, false), (64, 196, 384, false, true), (1, 1000, 33, false, false), (64, 3000, 20, false, true)] {
            let val = |i: usize| ((i * 7919) % 23) as f32 * 0.25 - 2.5;
            let (a, b): (Vec<f32>, Vec<f32>) = ((0..m * k).map(val).collect(), (0..k * n).map(|i| val(i + 5)).collect());
            // A row-major m x k (or stored transposed, k x m), B likewise.
            let a_strides = if a_t { (m as isize, 1) } else { (1, k as isize) };
            let b_strides = if b_t { (k as isize, 1) } else { (1, n as isize) };
            let run = |threads: usize| {
                let mut c = vec![f32::NAN; m * n];
                let o = Operands { c: c.as_mut_ptr(), ldc: n as isize, a: a.as_ptr(), a_strides, b: b.as_ptr(), b_strides };
                // SAFETY: operands of these sizes and strides, C its own buffer.
                unsafe { gemm_on(m, n, k, o, threads) };
                c
            };
            let (one, parts) = (run(1), run(3));
            assert!(m * n <= SPLIT_MAX_OUTPUTS || m.min(n) <= SPLIT_MAX_SHORT_SIDE);
            // Small multiples of 0.25 and few terms: every sum is exact, whatever the blocking.
            assert_eq!(one, parts, "{m}x{n}x{k}");
            let want: f32 = (0..k).map(|p| a[if a_t { p * m } else { p }] * b[if b_t { p } else { p * n }]).sum();
            assert_eq!(one[0], want);
        }
    }
}
