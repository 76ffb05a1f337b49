//! CUTLASS 3.x's Hopper GEMMs: TMA loads and stores, wgmma on a pipeline of shared-memory stages, a
//! producer warpgroup and two consumer warpgroups (`KernelTmaWarpSpecializedPingpong`, or `...Cooperative`),
//! persistent over the output tiles, with the epilogue as an epilogue visitor tree (`LinCombEltAct`,
//! `LinCombPerColBiasEltAct`: act(acc + C) or act(acc + bias), stored by TMA).
//!
//! These kernels take their parameters as one structure (`GemmKernel::Params`) that CUTLASS's host code
//! builds, `to_underlying_arguments`, and it holds TMA tensor maps that only the driver encodes. tessera
//! builds it at compile time, on any machine: a small host program (the *probe*) instantiates the same types,
//! builds each launch's `Params` from placeholder addresses, with `cuTensorMapEncodeTiled` replaced by a
//! function that records its arguments and leaves a marker where the map lands, and prints the bytes, the
//! recorded maps, the grid, block and shared memory. [`read_probe`] turns that into a
//! [`ParamBlock`]: the placeholder words become pointer patches, the markers tensor-map patches, and the
//! loader fills both with the launch's device addresses (`runtime::cuda::module`). The probe runs its launches
//! twice, the stack scribbled with a different byte before each launch: bytes that differ are padding or
//! fields no one wrote, and are zeroed, so a module's bytes are the same on every machine (and a field left
//! unwritten cannot hold an earlier launch's placeholder, which would read as a pointer).
//!
//! The grid is the persistent scheduler's for [`SMS`] SMs (an H100 SXM's or an H200's); on a GPU with
//! another count every tile is still computed (the scheduler strides over the tiles by the grid's size).

use super::instance::{Activation, Element};
use crate::backend::ToolError;
use serde::{Deserialize, Serialize};
use std::fmt::Write;
use tessera_kernels::runtime::cuda::format::{LaunchArg, ParamBlock, PointerPatch, TensorMapPatch, TENSOR_MAP_BYTES};

/// SMs the persistent grid is sized for.
pub const SMS: u32 = 132;

/// The kernel schedule: how the consumer warpgroups share the tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Schedule {
    /// Two consumer warpgroups on alternate tiles, one's epilogue overlapping the other's mainloop.
    Pingpong,
    /// Two consumer warpgroups on halves of one tile (M of 128 or more).
    Cooperative,
}

/// A Hopper configuration: the schedule and the threadblock tile (M, N, K); CUTLASS picks the stages that
/// fit beside the epilogue's shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperTile {
    pub schedule: Schedule,
    pub threadblock: [u32; 3],
}

const fn tile(schedule: Schedule, threadblock: [u32; 3]) -> HopperTile {
    HopperTile { schedule, threadblock }
}

/// The Hopper configurations of the 16-bit types, the shapes CUTLASS's profiler favours for them.
pub const HOPPER_TILES: &[HopperTile] = &[
    tile(Schedule::Pingpong, [128, 128, 64]),
    tile(Schedule::Cooperative, [128, 256, 64]),
    tile(Schedule::Pingpong, [64, 128, 64]),
    tile(Schedule::Cooperative, [256, 128, 64]),
];

/// Threads of both schedules: a producer warpgroup and two consumers.
pub const THREADS: u32 = 384;

impl HopperTile {
    /// `sm90_pingpong_128x128x64`.
    pub fn name(&self) -> String {
        let [m, n, k] = self.threadblock;
        let s = match self.schedule {
            Schedule::Pingpong => "pingpong",
            Schedule::Cooperative => "cooperative",
        };
        format!("sm90_{s}_{m}x{n}x{k}")
    }
}

/// What the epilogue reads besides the accumulators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    None,
    /// A bias of N values, the same for every row.
    Bias,
    /// C of D's shape.
    Residual,
}

/// One instantiation: element, tile, epilogue source and activation (operands 16-byte aligned).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperGemm {
    pub element: Element,
    pub tile: HopperTile,
    pub source: Source,
    pub activation: Activation,
}

impl HopperGemm {
    pub fn type_name(&self) -> String {
        let src = match self.source {
            Source::None => "none",
            Source::Bias => "bias",
            Source::Residual => "res",
        };
        format!("{}_{}_{src}_{}", self.tile.name(), self.element.short(), self.activation.short())
    }

    /// The C++ declarations of the instantiation: the epilogue (an epilogue visitor tree), the mainloop
    /// with the stages that fit beside it, and the kernel type.
    pub fn declaration(&self) -> String {
        let e = self.element.cpp();
        let [m, n, k] = self.tile.threadblock;
        let name = self.type_name();
        let act = self.activation.cpp();
        let (kernel_schedule, epilogue_schedule) = match self.tile.schedule {
            Schedule::Pingpong => ("cutlass::gemm::KernelTmaWarpSpecializedPingpong", "cutlass::epilogue::TmaWarpSpecialized"),
            Schedule::Cooperative => ("cutlass::gemm::KernelTmaWarpSpecializedCooperative", "cutlass::epilogue::TmaWarpSpecializedCooperative"),
        };
        let (element_c, fusion) = match self.source {
            Source::None => ("void".to_string(), format!("cutlass::epilogue::fusion::LinCombEltAct<{act}, {e}, float>")),
            Source::Bias => ("void".to_string(), format!("cutlass::epilogue::fusion::LinCombPerColBiasEltAct<{act}, {e}, float, {e}>")),
            Source::Residual => (e.to_string(), format!("cutlass::epilogue::fusion::LinCombEltAct<{act}, {e}, float>")),
        };
        format!(
            "using {name}_epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<\n    \
             cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cute::Shape<cute::Int<{m}>, cute::Int<{n}>, cute::Int<{k}>>, cute::Shape<cute::_1, cute::_1, cute::_1>,\n    \
             cutlass::epilogue::collective::EpilogueTileAuto, float, float, {element_c}, cutlass::layout::RowMajor, 8, {e}, cutlass::layout::RowMajor, 8,\n    \
             {epilogue_schedule}, {fusion}>::CollectiveOp;\n\
             using {name}_mainloop = typename cutlass::gemm::collective::CollectiveBuilder<\n    \
             cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, {e}, cutlass::layout::RowMajor, 8, {e}, cutlass::layout::RowMajor, 8, float,\n    \
             cute::Shape<cute::Int<{m}>, cute::Int<{n}>, cute::Int<{k}>>, cute::Shape<cute::_1, cute::_1, cute::_1>,\n    \
             cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename {name}_epilogue::SharedStorage))>,\n    \
             {kernel_schedule}>::CollectiveOp;\n\
             using {name} = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, {name}_mainloop, {name}_epilogue>;\n\
             static_assert({name}::MaxThreadsPerBlock == {THREADS}, \"{name}: thread count\");\n"
        )
    }
}

/// A launch's problem, for the probe: `D[b] = act(A[b] B[b] + C)`, row-major, with batch strides in
/// elements (D's and a residual's are M x N).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    pub type_name: String,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
    pub a_stride: u64,
    pub b_stride: u64,
    pub source: Source,
}

/// The kernel's entry: the whole `Params` by value, in the parameter space (`__grid_constant__`: TMA reads
/// the tensor maps where they are).
pub fn entry_source(entry: &str, type_name: &str) -> String {
    format!(
        "extern \"C\" __global__ void __launch_bounds__({THREADS}, 1) {entry}(typename {type_name}::Params const __grid_constant__ params) {{\n  \
         extern __shared__ char smem[];\n  \
         {type_name}{{}}(params, smem);\n}}"
    )
}

/// The placeholder address of a launch's operand `j` (A, B, C or bias, D in the launch's argument order):
/// the high 16 bits mark it, bits 40..48 name the operand, the rest is an offset into it.
const PLACEHOLDER: u64 = 0x7e5e_0000_0000_0000;
const MARKER: &[u8; 8] = b"TSRTMAP!";

/// The probe's source (after the module's prelude and type declarations): the recording
/// `cuTensorMapEncodeTiled`, and a `main` that builds every launch's parameters twice.
pub fn probe_source(problems: &[Problem]) -> String {
    let mut s = String::new();
    s.push_str(PROBE_HEAD);
    s.push_str("static void probe_all(int byte) {\n");
    for (i, p) in problems.iter().enumerate() {
        let Problem { type_name: t, m, n, k, batch, a_stride, b_stride, source } = p;
        let d_stride = m * n;
        let (c_ptr, beta, bias) = match source {
            Source::None => ("nullptr".to_string(), "0.0f", ""),
            Source::Bias => ("nullptr".to_string(), "0.0f", "  args.epilogue.thread.bias_ptr = static_cast<E const*>(placeholder(2));\n"),
            Source::Residual => ("static_cast<E const*>(placeholder(2))".to_string(), "1.0f", ""),
        };
        let d = if *source == Source::None { 2 } else { 3 };
        let mode = if *batch > 1 { "kBatched" } else { "kGemm" };
        let _ = write!(
            s,
            "  {{\n  using K = {t};\n  using E = typename K::ElementD;\n  \
             typename K::Arguments args{{cutlass::gemm::GemmUniversalMode::{mode}, {{{m}, {n}, {k}, {batch}}},\n    \
             {{static_cast<E const*>(placeholder(0)), {{int64_t({k}), cute::Int<1>{{}}, int64_t({a_stride})}},\n     \
             static_cast<E const*>(placeholder(1)), {{cute::Int<1>{{}}, int64_t({n}), int64_t({b_stride})}}}},\n    \
             {{{{}}, {c_ptr}, {{int64_t({n}), cute::Int<1>{{}}, int64_t({d_stride})}}, static_cast<E*>(placeholder({d})), {{int64_t({n}), cute::Int<1>{{}}, int64_t({d_stride})}}}}}};\n  \
             args.epilogue.thread.alpha = 1.0f;\n  args.epilogue.thread.beta = {beta};\n{bias}  \
             args.hw_info.sm_count = {SMS};\n  args.hw_info.device_id = 0;\n  \
             scribble(byte);\n  emit<K>({i}, args);\n  }}\n"
        );
    }
    s.push_str("}\n\nint main() {\n  probe_all(0xA5);\n  probe_all(0x5A);\n  return 0;\n}\n");
    s
}

const PROBE_HEAD: &str = r#"
#include <cstdio>
#include <cstring>

// The probe's cuTensorMapEncodeTiled: records its arguments and leaves a marker where the map goes.
extern "C" CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* address,
                                           const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                           const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                           CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  static unsigned next = 0;
  unsigned char* bytes = reinterpret_cast<unsigned char*>(map);
  std::memset(bytes, 0, sizeof(CUtensorMap));
  std::memcpy(bytes, "TSRTMAP!", 8);
  std::memcpy(bytes + 8, &next, sizeof next);
  std::printf("map %u type %d address %llu interleave %d swizzle %d l2 %d oob %d dims", next, int(type),
              static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(address)), int(interleave), int(swizzle), int(l2), int(oob));
  for (cuuint32_t i = 0; i < rank; ++i) std::printf(" %llu", static_cast<unsigned long long>(dims[i]));
  std::printf(" strides");
  for (cuuint32_t i = 0; i + 1 < rank; ++i) std::printf(" %llu", static_cast<unsigned long long>(strides[i]));
  std::printf(" box");
  for (cuuint32_t i = 0; i < rank; ++i) std::printf(" %u", box[i]);
  std::printf(" element_strides");
  for (cuuint32_t i = 0; i < rank; ++i) std::printf(" %u", element_strides[i]);
  std::printf("\n");
  ++next;
  return CUDA_SUCCESS;
}

static void* placeholder(int operand) {
  return reinterpret_cast<void*>(0x7e5e000000000000ull + (static_cast<unsigned long long>(operand) << 40));
}

// Fills the stack below with `byte`: what the parameters leave unwritten shows as a difference between runs.
__attribute__((noinline)) static void scribble(int byte) {
  volatile unsigned char junk[1 << 16];
  for (unsigned i = 0; i < sizeof junk; ++i) junk[i] = static_cast<unsigned char>(byte);
}

template <typename K>
__attribute__((noinline)) static void emit(int launch, typename K::Arguments const& args) {
  if (K::get_workspace_size(args) != 0) { std::printf("error %d needs a workspace\n", launch); return; }
  if (!K::can_implement(args)) { std::printf("error %d CUTLASS cannot implement the problem\n", launch); return; }
  typename K::Params params = K::to_underlying_arguments(args, nullptr);
  dim3 grid = K::get_grid_shape(params), block = K::get_block_shape();
  std::printf("launch %d grid %u %u %u block %u %u %u shared %d bytes ", launch, grid.x, grid.y, grid.z, block.x, block.y, block.z, int(K::SharedStorageSize));
  unsigned char const* b = reinterpret_cast<unsigned char const*>(&params);
  for (size_t i = 0; i < sizeof params; ++i) std::printf("%02x", b[i]);
  std::printf("\n");
}
"#;

/// One launch as the probe built it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probed {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
    pub params: ParamBlock,
}

#[derive(Clone, Debug)]
struct Map {
    operand: u64,
    offset: u64,
    patch: TensorMapPatch,
}

fn numbers<T: std::str::FromStr>(words: &[&str], line: &str) -> Result<Vec<T>, ToolError> {
    words.iter().map(|w| w.parse().map_err(|_| ToolError::BadOutput(format!("probe: unreadable number '{w}' in: {line}")))).collect()
}

/// The field after `name` in a probe line's words.
fn field<'a>(words: &[&'a str], name: &str, line: &str) -> Result<&'a str, ToolError> {
    words.iter().position(|w| *w == name).and_then(|i| words.get(i + 1)).copied().ok_or_else(|| ToolError::BadOutput(format!("probe: no '{name}' in: {line}")))
}

fn parse_map(line: &str) -> Result<Map, ToolError> {
    let w: Vec<&str> = line.split_whitespace().collect();
    let num = |name: &str| -> Result<u64, ToolError> { field(&w, name, line)?.parse().map_err(|_| ToolError::BadOutput(format!("probe: unreadable {name} in: {line}"))) };
    let between = |from: &str, to: Option<&str>| -> &[&str] {
        let a = w.iter().position(|x| *x == from).map_or(w.len(), |i| i + 1);
        let b = to.and_then(|t| w.iter().position(|x| *x == t)).unwrap_or(w.len());
        &w[a.min(b)..b]
    };
    let address = num("address")?;
    if address >> 48 != PLACEHOLDER >> 48 {
        return Err(ToolError::BadOutput(format!("probe: a tensor map over an address that is no operand's: {line}")));
    }
    let patch = TensorMapPatch {
        at: 0,
        arg: LaunchArg { index: 0, offset: 0 },
        data_type: num("type")? as u32,
        dims: numbers(between("dims", Some("strides")), line)?,
        strides: numbers(between("strides", Some("box")), line)?,
        box_dims: numbers(between("box", Some("element_strides")), line)?,
        element_strides: numbers(between("element_strides", None), line)?,
        interleave: num("interleave")? as u32,
        swizzle: num("swizzle")? as u32,
        l2_promotion: num("l2")? as u32,
        oob_fill: num("oob")? as u32,
    };
    Ok(Map { operand: (address >> 40) & 0xff, offset: address & 0xff_ffff_ffff, patch })
}

fn hex(s: &str) -> Result<Vec<u8>, ToolError> {
    if s.len() % 2 != 0 {
        return Err(ToolError::BadOutput("probe: parameter bytes of odd length".into()));
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| ToolError::BadOutput("probe: unreadable parameter bytes".to_string()))).collect()
}

fn operand_arg(args: &[LaunchArg], operand: u64, offset: u64, what: &str) -> Result<LaunchArg, ToolError> {
    let a = args.get(operand as usize).ok_or_else(|| ToolError::BadOutput(format!("probe: {what} names operand {operand} of {}", args.len())))?;
    Ok(LaunchArg { index: a.index, offset: a.offset + offset })
}

/// The launches of a probe's output, each with its parameter block patched to the launch's arguments
/// (`args[i]`: launch `i`'s operands in placeholder order).
pub fn read_probe(output: &str, args: &[Vec<LaunchArg>]) -> Result<Vec<Probed>, ToolError> {
    // Two runs: the first's maps and launches, then the second's.
    let mut runs: Vec<(Vec<Map>, Vec<(u32, [u32; 3], [u32; 3], u32, Vec<u8>)>)> = vec![(Vec::new(), Vec::new())];
    let mut maps_seen = 0usize;
    for line in output.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.first().copied() {
            Some("error") => return Err(ToolError::BadOutput(format!("probe: launch {}", w[1..].join(" ")))),
            Some("map") => {
                let index: usize = field(&w, "map", line)?.parse().map_err(|_| ToolError::BadOutput(format!("probe: {line}")))?;
                if index != maps_seen {
                    return Err(ToolError::BadOutput(format!("probe: map {index} out of order")));
                }
                maps_seen += 1;
                if runs.last().is_some_and(|r| r.1.len() == args.len()) {
                    runs.push((Vec::new(), Vec::new()));
                }
                runs.last_mut().unwrap().0.push(parse_map(line)?);
            }
            Some("launch") => {
                if runs.last().is_some_and(|r| r.1.len() == args.len()) {
                    runs.push((Vec::new(), Vec::new()));
                }
                let n = |name: &str, i: usize| -> Result<u32, ToolError> {
                    let at = w.iter().position(|x| *x == name).ok_or_else(|| ToolError::BadOutput(format!("probe: no {name} in: {line}")))?;
                    w.get(at + 1 + i).and_then(|x| x.parse().ok()).ok_or_else(|| ToolError::BadOutput(format!("probe: unreadable {name} in: {line}")))
                };
                let launch = n("launch", 0)?;
                let bytes = hex(field(&w, "bytes", line)?)?;
                runs.last_mut().unwrap().1.push((launch, [n("grid", 0)?, n("grid", 1)?, n("grid", 2)?], [n("block", 0)?, n("block", 1)?, n("block", 2)?], n("shared", 0)?, bytes));
            }
            _ => {}
        }
    }
    if runs.len() != 2 || runs.iter().any(|r| r.1.len() != args.len()) || runs[0].0.len() != runs[1].0.len() {
        return Err(ToolError::BadOutput(format!("probe: expected two runs of {} launches, got {:?}", args.len(), runs.iter().map(|r| r.1.len()).collect::<Vec<_>>())));
    }
    let (maps, first) = &runs[0];
    let (_, second) = &runs[1];
    let mut out = Vec::with_capacity(args.len());
    for (i, ((launch, grid, block, shared, a), (_, _, _, _, b))) in first.iter().zip(second).enumerate() {
        if *launch as usize != i || a.len() != b.len() {
            return Err(ToolError::BadOutput(format!("probe: launch {launch} where {i} was expected")));
        }
        // Patches from the first run's bytes (the second's markers number its own maps); then bytes the two
        // runs disagree on, padding nobody wrote, are zeroed.
        let mut block_ = ParamBlock::default();
        let mut patched = vec![false; a.len()];
        let mut at = 0;
        while at + 8 <= a.len() {
            if &a[at..at + 8] == MARKER && at + TENSOR_MAP_BYTES <= a.len() {
                if &b[at..at + 8] != MARKER {
                    return Err(ToolError::BadOutput(format!("probe: launch {i}: the two runs put tensor maps in different places")));
                }
                let index = u32::from_le_bytes(a[at + 8..at + 12].try_into().unwrap()) as usize;
                let m = maps.get(index).ok_or_else(|| ToolError::BadOutput(format!("probe: marker of unknown map {index}")))?;
                let mut patch = m.patch.clone();
                patch.at = at as u32;
                patch.arg = operand_arg(&args[i], m.operand, m.offset, "a tensor map")?;
                block_.tensor_maps.push(patch);
                patched[at..at + TENSOR_MAP_BYTES].fill(true);
                at += TENSOR_MAP_BYTES;
                continue;
            }
            let word = u64::from_le_bytes(a[at..at + 8].try_into().unwrap());
            if word >> 48 == PLACEHOLDER >> 48 {
                block_.pointers.push(PointerPatch { at: at as u32, arg: operand_arg(&args[i], (word >> 40) & 0xff, word & 0xff_ffff_ffff, "a pointer")? });
                patched[at..at + 8].fill(true);
            }
            at += 8;
        }
        let bytes: Vec<u8> = a.iter().zip(b).zip(&patched).map(|((x, y), p)| if *p || x != y { 0 } else { *x }).collect();
        block_.bytes = bytes;
        out.push(Probed { grid: *grid, block: *block, shared_bytes: *shared, params: block_ });
    }
    Ok(out)
}

#[cfg(test)]
#[path = "hopper_tests.rs"]
mod tests;
