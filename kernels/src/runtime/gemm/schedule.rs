//! What runs as one, and on which threads: a plan function's steps grouped into units, worked out once per
//! function and thread count and then reused by every call.
//!
//! Most units are one step, cut over all threads inside. Two groupings change that:
//! - An im2col and the GEMM that reads its column matrix run fused ([`Unit::Conv`]), in blocks of output rows.
//! - A batch's images run side by side through consecutive layers ([`Unit::Images`]): image `b` of each layer
//!   runs whole on one thread, and that thread goes on to image `b` of the next layer while the image's
//!   activations are still in its core's caches. Before, each layer ran its images one after another, each
//!   cut over all threads, and a batch-8 activation (38 MB in MobileNetV2's first layers) went through memory
//!   between layers. A layer splits by image where it is the lowering's per-image convolutions, a GEMM
//!   batched over images (split by its first batch dimension), or a depthwise convolution (split by its
//!   batch). Layers join a chain only while no image writes what another image reads or writes (checked on
//!   the plan's views, with each epilogue source's exact range), so any order of the images' work gives
//!   the bytes the steps give one after another.

use super::plan::{Buf, Depthwise2d, EpOp, Epilogue, Im2col, Mat, Sgemm, Step};

/// What runs as one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Unit {
    /// Step `i`, on all threads.
    Step(usize),
    /// The im2col at step `i` fused with the GEMM at `i + 1`, in blocks of output rows over all threads.
    Conv(usize),
    /// Steps `steps` as image lanes: `lanes[b]` is image `b`'s work, in order, on one thread; lanes run side
    /// by side.
    Images { steps: std::ops::Range<usize>, lanes: Vec<Vec<Part>> },
}

/// One image's share of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Part {
    /// The im2col at step `i` fused with the GEMM at `i + 1` (one image's convolution), on one thread.
    Conv(usize),
    /// The batches of the GEMM at `step` whose first batch index is `image`.
    Gemm { step: usize, image: u64 },
    /// Image `image` of the depthwise convolution at `step`.
    Depthwise { step: usize, image: u64 },
}

/// Column matrices up to this many elements are laid out whole when fused (4 MiB): they stay in the caches
/// anyway, and one GEMM over all columns runs at the crate's best rate. Larger ones go in blocks of rows.
/// Measured on the 2-core EPYC, one thread: ResNet-50's stem (147 x 12544) in blocks took 0.65-0.8x, its
/// 64-channel 3x3 layers (576 x 3136) 0.78-1.0x, the 14x14 and 7x7 layers 1.0-1.7x the unfused time; so
/// outside image lanes only the larger ones fuse.
pub(super) const FUSE_MIN_COLS: u64 = 1024 * 1024;

/// Layers in one chain at most: bounds the independence checks (quadratic in the chain's parts).
const CHAIN_MAX_LAYERS: usize = 64;

/// An im2col can run fused with the next step if that is an unbatched GEMM whose B operand is exactly the
/// dense column matrix it writes: the lowering allocates that matrix for this one GEMM and frees it after, so
/// no other step reads it (the plan format says the matrix is unspecified after a fused pair). The GEMM's
/// output must not overlap the im2col's input, which the fused pair reads while writing it (validation allows
/// that overlap between two separate steps; the lowering never makes it).
fn pairs(c: &Im2col, g: &Sgemm) -> bool {
    let (taps, ps): (u64, u64) = (c.kernel.iter().product(), c.output.iter().product());
    let x_len = c.channels * c.input.iter().product::<u64>();
    let overlaps = c.x.buf == g.c.buf && c.x.offset < g.c.offset + g.m * g.n && g.c.offset < c.x.offset + x_len;
    !overlaps
        && c.input.len() == 2
        && g.batch.is_empty()
        && g.b.at == c.dst
        && g.b.batch_strides.is_empty()
        && (g.b.rs, g.b.cs) == (ps, 1)
        && (g.k, g.n) == (c.channels * taps, ps)
}

/// Whether the pair fuses outside image lanes: only column matrices too large to stay in the caches.
pub(super) fn fuses(c: &Im2col, g: &Sgemm) -> bool {
    pairs(c, g) && g.k * g.n > FUSE_MIN_COLS
}

/// `count` images keep `threads` threads equally busy: each thread takes the same number of whole images, or
/// each image the same number of threads ([`lane_threads`]).
fn shares_evenly(count: u64, threads: usize) -> bool {
    let t = threads as u64;
    threads > 1 && count > 1 && (count % t == 0 || t % count == 0)
}

/// The threads each of `lanes` image lanes runs on, when they share `threads` evenly: 1 where there are at
/// least as many images as threads, else `threads / lanes` (8 images on 16 threads: 2 each).
pub(super) fn lane_threads(lanes: usize, threads: usize) -> usize {
    (threads / lanes.max(1)).max(1)
}

/// The units of `steps` on `threads` threads.
pub(super) fn schedule(steps: &[Step], threads: usize) -> Vec<Unit> {
    let mut units = Vec::with_capacity(steps.len());
    let mut i = 0;
    // Steps before this index run one after another: a layer that did not split by image (a chain may only
    // start at a layer's first image).
    let mut whole_until = 0;
    while i < steps.len() {
        if i >= whole_until {
            if let Some((end, lanes)) = chain(steps, i, threads) {
                units.push(Unit::Images { steps: i..end, lanes });
                i = end;
                continue;
            }
            whole_until = layer(steps, i).map_or(i, |(end, _)| end);
        }
        match (&steps[i], steps.get(i + 1)) {
            (Step::Im2col(c), Some(Step::Sgemm(g))) if fuses(c, g) => {
                units.push(Unit::Conv(i));
                i += 2;
            }
            _ => {
                units.push(Unit::Step(i));
                i += 1;
            }
        }
    }
    units
}

/// The layer starting at step `i`, split by image: the index after it and each image's part.
fn layer(steps: &[Step], i: usize) -> Option<(usize, Vec<Part>)> {
    match &steps[i] {
        Step::Im2col(first) => {
            // The lowering's per-image convolutions: consecutive fusable pairs of one geometry and weight.
            let Some(Step::Sgemm(g0)) = steps.get(i + 1) else { return None };
            let same = |c: &Im2col, g: &Sgemm| {
                pairs(c, g) && (&c.input, &c.kernel, &c.output, &c.strides, &c.pads_begin, &c.dilations, c.channels, c.dst) == (&first.input, &first.kernel, &first.output, &first.strides, &first.pads_begin, &first.dilations, first.channels, first.dst) && g.a == g0.a && (g.m, g.n, g.k) == (g0.m, g0.n, g0.k)
            };
            let mut parts = Vec::new();
            let mut j = i;
            while let (Some(Step::Im2col(c)), Some(Step::Sgemm(g))) = (steps.get(j), steps.get(j + 1)) {
                if !same(c, g) {
                    break;
                }
                parts.push(Part::Conv(j));
                j += 2;
            }
            (parts.len() > 1).then_some((j, parts))
        }
        Step::Sgemm(g) => {
            let images = *g.batch.first()?;
            (images > 1).then(|| (i + 1, (0..images).map(|image| Part::Gemm { step: i, image }).collect()))
        }
        Step::Depthwise2d(d) => (d.batch > 1).then(|| (i + 1, (0..d.batch).map(|image| Part::Depthwise { step: i, image }).collect())),
    }
}

/// The longest chain of layers from step `i` whose images share `threads` evenly and stay independent: its
/// end and its lanes.
fn chain(steps: &[Step], i: usize, threads: usize) -> Option<(usize, Vec<Vec<Part>>)> {
    let (mut end, first) = layer(steps, i)?;
    if !shares_evenly(first.len() as u64, threads) {
        return None;
    }
    let mut lanes: Vec<Vec<Part>> = first.iter().map(|&p| vec![p]).collect();
    let mut seen: Vec<Access> = first.iter().map(|&p| access(steps, p)).collect();
    if !independent(&seen, &vec![Access::default(); seen.len()]) {
        return None;
    }
    let mut layers = 1;
    while end < steps.len() && layers < CHAIN_MAX_LAYERS {
        let Some((next_end, parts)) = layer(steps, end) else { break };
        if parts.len() != lanes.len() {
            break;
        }
        let new: Vec<Access> = parts.iter().map(|&p| access(steps, p)).collect();
        if !independent(&new, &seen) {
            break;
        }
        for ((lane, s), (p, a)) in lanes.iter_mut().zip(&mut seen).zip(parts.into_iter().zip(new)) {
            lane.push(p);
            s.reads.extend(a.reads);
            s.writes.extend(a.writes);
        }
        end = next_end;
        layers += 1;
    }
    Some((end, lanes))
}

/// A range of one buffer, in f32 elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    buf: Buf,
    start: u64,
    end: u64,
}

impl Span {
    fn overlaps(&self, o: &Span) -> bool {
        self.buf == o.buf && self.start < o.end && o.start < self.end
    }
}

/// What a part reads and writes (each range covering at least every element it touches).
#[derive(Clone, Debug, Default)]
struct Access {
    reads: Vec<Span>,
    writes: Vec<Span>,
}

fn any_overlap(a: &[Span], b: &[Span]) -> bool {
    a.iter().any(|x| b.iter().any(|y| x.overlaps(y)))
}

/// Whether the new parts (one per image) conflict neither with each other nor with the other images'
/// earlier parts `seen`: no image writes what another reads or writes.
fn independent(new: &[Access], seen: &[Access]) -> bool {
    for (b, a) in new.iter().enumerate() {
        for (o, (other_new, other_seen)) in new.iter().zip(seen).enumerate() {
            if o == b {
                continue;
            }
            let writes_over = |x: &Access| any_overlap(&a.writes, &x.writes) || any_overlap(&a.writes, &x.reads) || any_overlap(&a.reads, &x.writes);
            if writes_over(other_new) || writes_over(other_seen) {
                return false;
            }
        }
    }
    true
}

fn span(buf: Buf, start: u64, len: u64) -> Span {
    Span { buf, start, end: start + len }
}

/// The range of a matrix operand over the batches whose first index is `image` (all batches if the GEMM is
/// not batched), `rows x cols` each.
fn mat_span(m: &Mat, batch: &[u64], image: Option<u64>, rows: u64, cols: u64) -> Span {
    if rows == 0 || cols == 0 || batch.contains(&0) {
        return span(m.at.buf, m.at.offset, 0);
    }
    let (first, rest) = match image {
        Some(b) => (b * m.batch_strides[0], 1),
        None => (0, 0),
    };
    let reach: u64 = batch.iter().zip(&m.batch_strides).skip(rest).map(|(n, s)| (n - 1) * s).sum::<u64>() + (rows - 1) * m.rs + (cols - 1) * m.cs;
    span(m.at.buf, m.at.offset + first, reach + 1)
}

/// The sources an epilogue reads for output elements `base .. base + len` of its tensor: an `Add` reads
/// `src[((base + i) / inner) % count]`, so a residual (`inner = 1`, `count = numel`) is read exactly over
/// the image's own range, and a broadcast bias whole.
fn epilogue_reads(e: &Epilogue, base: u64, len: u64, out: &mut Vec<Span>) {
    if len == 0 {
        return;
    }
    for op in &e.ops {
        if let EpOp::Add { src, inner, count } = *op {
            let (first, last) = ((base / inner.max(1)), (base + len - 1) / inner.max(1));
            let (lo, hi) = (first % count.max(1), last % count.max(1));
            if last - first + 1 >= count || lo > hi {
                out.push(span(src.buf, src.offset, count));
            } else {
                out.push(span(src.buf, src.offset + lo, hi - lo + 1));
            }
        }
    }
}

fn access(steps: &[Step], p: Part) -> Access {
    let mut a = Access::default();
    match p {
        Part::Conv(i) => {
            let (Step::Im2col(c), Step::Sgemm(g)) = (&steps[i], &steps[i + 1]) else { unreachable!("layer() pairs an im2col with a GEMM") };
            // The fused pair lays the column matrix out in its thread's own buffer: `c.dst` is never written.
            a.reads.push(span(c.x.buf, c.x.offset, c.channels * c.input.iter().product::<u64>()));
            a.reads.push(mat_span(&g.a, &[], None, g.m, g.k));
            epilogue_reads(&g.epilogue, g.epilogue.base, g.m * g.n, &mut a.reads);
            a.writes.push(span(g.c.buf, g.c.offset, g.m * g.n));
        }
        Part::Gemm { step, image } => {
            let Step::Sgemm(g) = &steps[step] else { unreachable!("layer() splits GEMMs by batch") };
            let inner: u64 = g.batch[1..].iter().product();
            a.reads.push(mat_span(&g.a, &g.batch, Some(image), g.m, g.k));
            a.reads.push(mat_span(&g.b, &g.batch, Some(image), g.k, g.n));
            let (first, len) = (image * inner * g.m * g.n, inner * g.m * g.n);
            epilogue_reads(&g.epilogue, g.epilogue.base + first, len, &mut a.reads);
            a.writes.push(span(g.c.buf, g.c.offset + first, len));
        }
        Part::Depthwise { step, image } => {
            let Step::Depthwise2d(d) = &steps[step] else { unreachable!("layer() splits depthwise steps by batch") };
            let (isz, osz, taps) = depthwise_sizes(d);
            let planes = d.channels * d.multiplier;
            a.reads.push(span(d.x.buf, d.x.offset + image * d.channels * isz, d.channels * isz));
            a.reads.push(span(d.w.buf, d.w.offset, planes * taps));
            let (first, len) = (image * planes * osz, planes * osz);
            epilogue_reads(&d.epilogue, d.epilogue.base + first, len, &mut a.reads);
            a.writes.push(span(d.out.buf, d.out.offset + first, len));
        }
    }
    a
}

/// A depthwise step's input plane, output plane and filter sizes.
pub(super) fn depthwise_sizes(d: &Depthwise2d) -> (u64, u64, u64) {
    (d.input[0] * d.input[1], d.output[0] * d.output[1], d.kernel[0] * d.kernel[1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::gemm::plan::View;

    fn v(buf: Buf, offset: u64) -> View {
        View { buf, offset }
    }

    /// Image `b`'s 3x3 convolution of `ch` channels on `side x side` planes, from `x` to `out` (NCHW).
    fn conv_pair(b: u64, ch: u64, side: u64, x: View, out: View, cols: View) -> [Step; 2] {
        let (k, n) = (ch * 9, side * side);
        [
            Step::Im2col(Im2col {
                x: x.at(b * ch * n),
                channels: ch,
                input: vec![side; 2],
                kernel: vec![3; 2],
                output: vec![side; 2],
                strides: vec![1; 2],
                pads_begin: vec![1; 2],
                dilations: vec![1; 2],
                dst: cols,
            }),
            Step::Sgemm(Sgemm {
                batch: vec![],
                m: ch,
                n,
                k,
                a: Mat { at: v(Buf::Arg(1), 0), rs: k, cs: 1, batch_strides: vec![] },
                b: Mat { at: cols, rs: n, cs: 1, batch_strides: vec![] },
                c: out.at(b * ch * n),
                epilogue: Epilogue { base: b * ch * n, ops: vec![EpOp::Relu] },
            }),
        ]
    }

    /// A 1x1 convolution of `ch` channels batched over `images` (NCHW, one weight for all images), from `x` to
    /// `out`.
    fn pointwise(images: u64, ch: u64, side: u64, x: View, out: View, ops: Vec<EpOp>) -> Step {
        Step::Sgemm(Sgemm {
            batch: vec![images],
            m: ch,
            n: side * side,
            k: ch,
            a: Mat { at: v(Buf::Arg(1), 0), rs: ch, cs: 1, batch_strides: vec![0] },
            b: Mat { at: x, rs: side * side, cs: 1, batch_strides: vec![ch * side * side] },
            c: out,
            epilogue: Epilogue { base: 0, ops },
        })
    }

    fn depthwise(images: u64, ch: u64, side: u64, x: View, out: View, ops: Vec<EpOp>) -> Step {
        Step::Depthwise2d(Depthwise2d {
            channels_last: false,
            x,
            w: v(Buf::Arg(2), 0),
            out,
            batch: images,
            channels: ch,
            multiplier: 1,
            input: [side; 2],
            kernel: [3; 2],
            output: [side; 2],
            strides: [1; 2],
            pads_begin: [1; 2],
            dilations: [1; 2],
            epilogue: Epilogue { base: 0, ops },
        })
    }

    /// A per-image convolution, then a depthwise convolution and a pointwise GEMM over the batch: one chain
    /// on 2, 4 or 8 threads (4 images: one or two per thread, or two threads per image), none on 1, 3 or 6.
    #[test]
    fn layers_split_by_image_form_one_chain_when_threads_share_the_images() {
        let (images, ch, side) = (4u64, 8u64, 6u64);
        let img = ch * side * side;
        let (x, act, act2, out, cols) = (v(Buf::Arg(0), 0), v(Buf::Scratch, 0), v(Buf::Scratch, images * img), v(Buf::Arg(3), 0), v(Buf::Scratch, 2 * images * img));
        let mut steps: Vec<Step> = (0..images).flat_map(|b| conv_pair(b, ch, side, x, act, cols)).collect();
        steps.push(depthwise(images, ch, side, act, act2, vec![EpOp::Clip { min: 0.0, max: 6.0 }]));
        steps.push(pointwise(images, ch, side, act2, out, vec![EpOp::Add { src: act, inner: 1, count: images * img }]));
        let n = steps.len();
        for threads in [2, 4, 8] {
            let units = schedule(&steps, threads);
            let [Unit::Images { steps: r, lanes }] = units.as_slice() else { panic!("{units:?}") };
            assert_eq!(*r, 0..n);
            assert_eq!(lanes.len(), 4);
            assert_eq!(lanes[1], [Part::Conv(2), Part::Depthwise { step: 8, image: 1 }, Part::Gemm { step: 9, image: 1 }]);
        }
        for threads in [1, 3, 6] {
            assert_eq!(schedule(&steps, threads), (0..n).map(Unit::Step).collect::<Vec<_>>(), "{threads} threads");
        }
    }

    /// A layer whose image reads another image's range ends the chain: here the residual of the last GEMM is
    /// shifted by one image, and a depthwise step writes where the other images' inputs lie.
    #[test]
    fn a_layer_that_crosses_images_ends_the_chain() {
        let (images, ch, side) = (2u64, 4u64, 5u64);
        let img = ch * side * side;
        let (x, act, act2, cols) = (v(Buf::Scratch, 0), v(Buf::Scratch, 2 * img), v(Buf::Scratch, 4 * img), v(Buf::Scratch, 6 * img));
        let mut steps: Vec<Step> = (0..images).flat_map(|b| conv_pair(b, ch, side, x, act, cols)).collect();
        let gemm = |ops| pointwise(images, ch, side, act, act2, ops);
        // Residual over the image's own range: chains.
        steps.push(gemm(vec![EpOp::Add { src: v(Buf::Arg(0), 0), inner: 1, count: images * img }]));
        assert!(matches!(schedule(&steps, 2).as_slice(), [Unit::Images { steps, .. }] if *steps == (0..5)));
        // Residual shifted by one image (image 0 reads image 1's output range of the convolution): splits.
        steps[4] = gemm(vec![EpOp::Add { src: act.at(img), inner: 1, count: img }]);
        let units = schedule(&steps, 2);
        assert!(matches!(units.as_slice(), [Unit::Images { steps: a, .. }, Unit::Images { steps: b, .. }] if *a == (0..4) && *b == (4..5)), "{units:?}");
        // A per-channel bias (the whole source, read-only) keeps the chain.
        steps[4] = gemm(vec![EpOp::Add { src: v(Buf::Const(0), 0), inner: side * side, count: ch }]);
        assert_eq!(schedule(&steps, 2).len(), 1);
        // A depthwise layer whose image 0 writes over image 1's input of the convolutions: the chain stops
        // before it. (Each image writing over its own input would chain.)
        steps.push(depthwise(images, ch, side, act2, v(Buf::Scratch, img / 2), vec![]));
        let units = schedule(&steps, 2);
        assert!(matches!(units.as_slice(), [Unit::Images { steps: a, .. }, Unit::Images { steps: b, .. }] if *a == (0..5) && *b == (5..6)), "{units:?}");
    }

    /// A per-image convolution whose output overlaps another image's input (in place) does not split.
    #[test]
    fn images_of_one_layer_must_not_overlap() {
        let (ch, side) = (4u64, 5u64);
        let img = ch * side * side;
        let x = v(Buf::Scratch, 0);
        // Image 0 writes where image 1 reads.
        let mut steps: Vec<Step> = conv_pair(0, ch, side, x, x.at(img), v(Buf::Scratch, 4 * img)).into();
        steps.extend(conv_pair(1, ch, side, x, x.at(2 * img), v(Buf::Scratch, 4 * img)));
        assert!(schedule(&steps, 2).iter().all(|u| !matches!(u, Unit::Images { .. })));
    }

    /// Only an unbatched GEMM reading exactly the column matrix, large enough, and not writing over the
    /// im2col's input fuses with it.
    #[test]
    fn fusion_needs_the_column_matrix_and_no_overlap_with_the_input() {
        let (ch, side) = (64u64, 56u64);
        let (k, n) = (ch * 9, side * side);
        let [Step::Im2col(c), Step::Sgemm(g)] = conv_pair(0, ch, side, v(Buf::Arg(0), 0), v(Buf::Arg(2), 0), v(Buf::Scratch, 0)) else { unreachable!() };
        assert!(k * n > FUSE_MIN_COLS && fuses(&c, &g));
        let x_in_scratch = Im2col { x: v(Buf::Scratch, k * n), ..c.clone() };
        assert!(!fuses(&x_in_scratch, &Sgemm { c: v(Buf::Scratch, k * n + ch * n - 1), ..g.clone() }), "output over the input's end");
        assert!(fuses(&x_in_scratch, &Sgemm { c: v(Buf::Scratch, k * n + ch * n), ..g.clone() }), "output right after the input");
        assert!(!fuses(&c, &Sgemm { b: Mat { rs: n + 1, ..g.b.clone() }, ..g.clone() }), "not the dense column matrix");
        assert!(!fuses(&c, &Sgemm { batch: vec![2], ..g.clone() }), "batched");
        let small = Im2col { input: vec![14; 2], output: vec![14; 2], ..c.clone() };
        assert!(!fuses(&small, &Sgemm { n: 196, b: Mat { rs: 196, ..g.b.clone() }, ..g.clone() }), "small enough to lay out whole");
    }

    #[test]
    fn epilogue_reads_are_exact_for_residuals_and_whole_for_broadcasts() {
        let e = |inner, count| Epilogue { base: 0, ops: vec![EpOp::Add { src: v(Buf::Arg(5), 100), inner, count }] };
        let reads = |e: &Epilogue, base, len| {
            let mut out = vec![];
            epilogue_reads(e, base, len, &mut out);
            out
        };
        assert_eq!(reads(&e(1, 1000), 200, 100), [span(Buf::Arg(5), 300, 100)]);
        assert_eq!(reads(&e(10, 8), 20, 30), [span(Buf::Arg(5), 102, 3)]);
        assert_eq!(reads(&e(10, 8), 70, 20), [span(Buf::Arg(5), 100, 8)], "wraps around");
        assert_eq!(reads(&e(1, 16), 0, 64), [span(Buf::Arg(5), 100, 16)]);
    }
}
