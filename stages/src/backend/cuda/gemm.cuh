/* tessera cuda backend: the GEMM main loops (MatMul, and convolution as an implicit GEMM), one template each.
 *
 * A kernel computes C = A B for one batch item (or convolution group) of an M x N x K problem: block (x, y) a
 * BM x BN tile of C, over slice `slice` (SLICE elements deep) of K, so a split-K schedule runs several blocks
 * per tile (gemm.rs chooses the tiles and the split, and keeps the history of each choice). What a partition
 * fuses arrives from the generated kernel as lambdas, inlined into the loop:
 *
 *   a(m, k)          A's element (m, k); with vector staging, the address of A's (m, k..k+8), 16-byte aligned;
 *   b_column(n)      for column n of B, a lambda k -> B's element (k, n): what depends on the column alone (a
 *                    convolution's image and input window) is computed once per thread, before the K loop;
 *   b(k, n)          with vector staging, the address of B's (k, n..n+8);
 *   index(m, n)      the flat output index of element (m, n);
 *   out(m, n, f, v)  the epilogue of output element (m, n), index f, accumulated value v (bias, activation,
 *                    residual, the store; or, K split, the partial sum's store).
 */
namespace tsr_gemm {

/* Calls f(j, e) for this thread's elements e = threadIdx.x + j * THREADS below TOTAL. Written over j, whose
 * trip count is a constant, so the loop unrolls and the iterations' global loads are in flight together.
 * (As `for (e = threadIdx.x; e < TOTAL; e += THREADS)` nothing unrolled and every iteration waited a whole
 * memory round trip: a GEMM epilogue adding a residual, 32 elements per thread, ran 140 us longer than the
 * same GEMM without it, ResNet-50 b32, H100 2026-11-25.) */
template <int TOTAL, int THREADS, class F>
__device__ __forceinline__ void each(F&& f) {
#pragma unroll
  for (int j = 0; j < (TOTAL + THREADS - 1) / THREADS; j++) {
    const int e = threadIdx.x + j * THREADS;
    if (TOTAL % THREADS != 0 && e >= TOTAL) break;
    f(j, e);
  }
}

/* The fp32 GEMM on the SIMT cores: BK-deep slices of A (transposed, As[k][m]) and B staged in shared memory,
 * each thread a TM x TN register tile. Every thread stages one column of B's tile (THREADS is a multiple of
 * BN), so a gathered B computes its column once. The slices go through registers: all of a step's global
 * loads are issued before any is stored, where loading and storing element by element let the compiler wait
 * for each load before issuing the next: BERT-base b1's fp32 GEMMs (32x32 tiles, two loads of each operand
 * per thread and step) ran 10-17% slower so (H200, 2026-11-27). */
template <int M, int N, int K, int SLICE, int BM, int BN, int BK, int TM, int TN, class A, class BColumn, class Index, class Out>
__device__ __forceinline__ void simt(unsigned slice, A&& a, BColumn&& b_column, Index&& index, Out&& out) {
  constexpr int COLS = BN / TN, THREADS = (BM / TM) * COLS, LDB = BN + 4;
  static_assert(THREADS % BN == 0, "every thread stages one column of B");
  __shared__ float As[BK][BM];
  __shared__ float Bs[BK * LDB];
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int tx = threadIdx.x % COLS, ty = threadIdx.x / COLS;
  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; i++)
#pragma unroll
    for (int c = 0; c < TN; c++) acc[i][c] = 0.0f;
  const int gnn = threadIdx.x % BN, gn = n0 + gnn;
  const auto b_at = b_column(gn);
  const int kbeg = slice * SLICE, kend = min(K, kbeg + SLICE);
  float ra[(BM * BK + THREADS - 1) / THREADS], rb[(BN * BK + THREADS - 1) / THREADS];
  auto fetch = [&](int k0) {
    each<BM * BK, THREADS>([&](int j, int e) {
      const int m = m0 + e / BK, k = k0 + e % BK;
      ra[j] = (m < M && k < kend) ? a(m, k) : 0.0f;
    });
    each<BN * BK, THREADS>([&](int j, int e) {
      const int k = k0 + e / BN;
      rb[j] = (gn < N && k < kend) ? b_at(k) : 0.0f;
    });
  };
  auto commit = [&]() {
    each<BM * BK, THREADS>([&](int j, int e) { As[e % BK][e / BK] = ra[j]; });
    each<BN * BK, THREADS>([&](int j, int e) { Bs[(e / BN) * LDB + gnn] = rb[j]; });
  };
  // The next step's loads go out before this step's barrier and FMAs, which hide their latency: ResNet-50 b1
  // fp32, whose gathered convolutions take 64x64 tiles, 1.38 -> 1.20 ms (H200 2026-11-27). (The kernels are
  // compiled for four blocks per SM, SIMT_MIN_BLOCKS in gemm.rs: squeezed into 32 registers, the 32x32 tile's
  // kernel had these loads sunk below the FMAs.)
  if (kbeg < kend) fetch(kbeg);
  for (int k0 = kbeg; k0 < kend; k0 += BK) {
    commit();
    // Unconditional: past the slice every load is masked off.
    fetch(k0 + BK);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; kk++) {
      float xa[TM], xb[TN];
#pragma unroll
      for (int i = 0; i < TM; i++) xa[i] = As[kk][ty * TM + i];
#pragma unroll
      for (int c = 0; c < TN; c++) xb[c] = Bs[kk * LDB + tx * TN + c];
#pragma unroll
      for (int i = 0; i < TM; i++)
#pragma unroll
        for (int c = 0; c < TN; c++) acc[i][c] = fmaf(xa[i], xb[c], acc[i][c]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; i++) {
#pragma unroll
    for (int c = 0; c < TN; c++) {
      const int m = m0 + ty * TM + i, n = n0 + tx * TN + c;
      if (m < M && n < N) out(m, n, index(m, n), acc[i][c]);
    }
  }
}

#ifdef TSR_HALF_TYPES

template <class T> __device__ __forceinline__ T zero();
template <> __device__ __forceinline__ __half zero<__half>() { return __ushort_as_half((unsigned short)0); }
template <> __device__ __forceinline__ __nv_bfloat16 zero<__nv_bfloat16>() { return __ushort_as_bfloat16((unsigned short)0); }

template <class T, int WM, int WN>
using Accumulators = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>[WM / 16][WN / 16];

/* One BK-deep step of the tensor cores: warp (wr, wc) accumulates its WM x WN piece of the tile, as 16x16x16
 * WMMA fragments, from A's rows in As (row-major, leading dimension LDA) and B's in Bs (row-major, LDB). */
template <class T, int BK, int WM, int WN, int LDA, int LDB>
__device__ __forceinline__ void mma_step(const T* As, const T* Bs, int wr, int wc, Accumulators<T, WM, WN>& acc) {
#pragma unroll
  for (int kk = 0; kk < BK; kk += 16) {
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, T, nvcuda::wmma::row_major> fa[WM / 16];
    nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, T, nvcuda::wmma::row_major> fb[WN / 16];
#pragma unroll
    for (int i = 0; i < WM / 16; i++) nvcuda::wmma::load_matrix_sync(fa[i], As + (wr * WM + i * 16) * LDA + kk, LDA);
#pragma unroll
    for (int c = 0; c < WN / 16; c++) nvcuda::wmma::load_matrix_sync(fb[c], Bs + kk * LDB + wc * WN + c * 16, LDB);
#pragma unroll
    for (int i = 0; i < WM / 16; i++)
#pragma unroll
      for (int c = 0; c < WN / 16; c++) nvcuda::wmma::mma_sync(acc[i][c], fa[i], fb[c], acc[i][c]);
  }
}

/* The accumulators leave through shared memory (fp32, Cs, leading dimension LDC), so the epilogue sees each
 * element with its coordinates. A thread takes eight rows of one column per trip (consecutive threads,
 * consecutive columns: each access of a warp stays contiguous), under one guard, the epilogue eight times
 * over, unrolled: its loads (a residual, say) are eight independent loads in flight. (Element by element,
 * one guard each, ResNet-50 b32's 1x1 expansion adding its residual took 213 us against 76 us without it,
 * H100 2026-11-25: the residual came in at 370 GB/s. Eight consecutive columns per thread fixed the loads,
 * 97 us, but scattered a warp's stores: the same GEMM without a residual went from 76 to 123 us.) Output
 * rows m and m + 1 are MSTRIDE apart in the output. */
template <int M, int N, int BM, int BN, int LDC, int THREADS, int MSTRIDE, class T, int WM, int WN, class Index, class Out>
__device__ __forceinline__ void tc_epilogue(float* Cs, int wr, int wc, Accumulators<T, WM, WN>& acc, Index&& index, Out&& out) {
#pragma unroll
  for (int i = 0; i < WM / 16; i++)
#pragma unroll
    for (int c = 0; c < WN / 16; c++)
      nvcuda::wmma::store_matrix_sync(Cs + (wr * WM + i * 16) * LDC + wc * WN + c * 16, acc[i][c], LDC, nvcuda::wmma::mem_row_major);
  __syncthreads();
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  constexpr int TOTAL = BM * BN / 8;
#pragma unroll 2
  for (int j = 0; j < (TOTAL + THREADS - 1) / THREADS; j++) {
    const int e = threadIdx.x + j * THREADS;
    if (TOTAL % THREADS != 0 && e >= TOTAL) break;
    const int nn = e % BN, mm = (e / BN) * 8;
    const int n = n0 + nn, mb = m0 + mm;
    // All eight rows are inside when the first is and M is a multiple of 8 (m0 is a multiple of BM).
    if (n < N && (M % 8 != 0 || mb < M)) {
      const unsigned fb = index(mb, n);
#pragma unroll
      for (int u = 0; u < 8; u++) {
        const int m = mb + u;
        if (M % 8 != 0 && m >= M) continue;
        out(m, n, fb + u * (unsigned)MSTRIDE, Cs[(mm + u) * LDC + nn]);
      }
    }
  }
}

/* The column lambda of B for a thread staging column gn one element at a time (nothing with vector staging). */
template <bool VEC, class B>
__device__ __forceinline__ auto column(B& b, int gn) {
  if constexpr (VEC) {
    return 0;
  } else {
    return b(gn);
  }
}

/* What a register holds of an operand in flight: 16 bytes (eight elements) with vector staging, else one. */
template <bool VEC, class T> struct Staged { using type = T; };
template <class T> struct Staged<true, T> { using type = uint4; };

/* The f16 or bf16 GEMM on tensor cores (WMMA 16x16x16, fp32 accumulators): warps of WM x WN pieces of the
 * tile, through BK-deep slices of A and B staged in shared memory in the operands' type. An operand stages
 * eight elements per 16-byte load where it allows (VEC_A, VEC_B: K, or N, a multiple of 8; slices start at
 * multiples of BK, so a group is wholly inside or outside), else one; through registers, so the next step's
 * loads are in flight during this step's MMAs (one shared buffer suffices: the commit comes after the barrier
 * that ends the previous step's reads). Without it every step of a gathered convolution waited a memory round
 * trip before its MMAs: ResNet-50's 3x3 convolutions ran at 8-19 TFLOP/s (H100, 2026-11-25). */
template <int M, int N, int K, int SLICE, int BM, int BN, int BK, int WM, int WN, int MSTRIDE, bool VEC_A, bool VEC_B, class T, class A, class B, class Index,
          class Out>
__device__ __forceinline__ void tc_staged(unsigned slice, A&& a, B&& b, Index&& index, Out&& out) {
  constexpr int THREADS = (BM / WM) * (BN / WN) * 32, LDA = BK + 8, LDB = BN + 8, LDC = BN + 4;
  constexpr int A_TOTAL = VEC_A ? BM * BK / 8 : BM * BK, B_TOTAL = VEC_B ? BN * BK / 8 : BN * BK;
  static_assert(VEC_B || THREADS % BN == 0, "every thread stages one column of B");
  // Leading dimensions padded (a multiple of 8 halves / 4 floats, as WMMA needs) against bank conflicts.
  __shared__ __align__(32) T As[BM * LDA];
  __shared__ __align__(32) T Bs[BK * LDB];
  __shared__ __align__(32) float Cs[BM * LDC];
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int warp = threadIdx.x / 32, wr = warp / (BN / WN), wc = warp % (BN / WN);
  Accumulators<T, WM, WN> acc;
#pragma unroll
  for (int i = 0; i < WM / 16; i++)
#pragma unroll
    for (int c = 0; c < WN / 16; c++) nvcuda::wmma::fill_fragment(acc[i][c], 0.0f);
  const int gnn = threadIdx.x % BN, gn = n0 + gnn;
  const auto b_at = column<VEC_B>(b, gn);
  const int kbeg = slice * SLICE, kend = min(K, kbeg + SLICE);
  typename Staged<VEC_A, T>::type ra[(A_TOTAL + THREADS - 1) / THREADS];
  typename Staged<VEC_B, T>::type rb[(B_TOTAL + THREADS - 1) / THREADS];
  auto fetch = [&](int k0) {
    each<A_TOTAL, THREADS>([&](int j, int e) {
      if constexpr (VEC_A) {
        const int kk = (e % (BK / 8)) * 8, m = m0 + e / (BK / 8), k = k0 + kk;
        ra[j] = (m < M && k < kend) ? *reinterpret_cast<const uint4*>(a(m, k)) : make_uint4(0u, 0u, 0u, 0u);
      } else {
        const int m = m0 + e / BK, k = k0 + e % BK;
        ra[j] = (m < M && k < kend) ? a(m, k) : zero<T>();
      }
    });
    each<B_TOTAL, THREADS>([&](int j, int e) {
      if constexpr (VEC_B) {
        const int n = n0 + (e % (BN / 8)) * 8, k = k0 + e / (BN / 8);
        rb[j] = (n < N && k < kend) ? *reinterpret_cast<const uint4*>(b(k, n)) : make_uint4(0u, 0u, 0u, 0u);
      } else {
        const int k = k0 + e / BN;
        rb[j] = (gn < N && k < kend) ? b_at(k) : zero<T>();
      }
    });
  };
  auto commit = [&]() {
    each<A_TOTAL, THREADS>([&](int j, int e) {
      if constexpr (VEC_A) {
        *reinterpret_cast<uint4*>(As + (e / (BK / 8)) * LDA + (e % (BK / 8)) * 8) = ra[j];
      } else {
        As[(e / BK) * LDA + e % BK] = ra[j];
      }
    });
    each<B_TOTAL, THREADS>([&](int j, int e) {
      if constexpr (VEC_B) {
        *reinterpret_cast<uint4*>(Bs + (e / (BN / 8)) * LDB + (e % (BN / 8)) * 8) = rb[j];
      } else {
        Bs[(e / BN) * LDB + gnn] = rb[j];
      }
    });
  };
  if (kbeg < kend) fetch(kbeg);
  for (int k0 = kbeg; k0 < kend; k0 += BK) {
    commit();
    __syncthreads();
    if (k0 + BK < kend) fetch(k0 + BK);
    mma_step<T, BK, WM, WN, LDA, LDB>(As, Bs, wr, wc, acc);
    __syncthreads();
  }
  tc_epilogue<M, N, BM, BN, LDC, THREADS, MSTRIDE, T, WM, WN>(Cs, wr, wc, acc, index, out);
}

/* The tensor-core GEMM when both operands stage 16 bytes at a time: STAGES shared-memory buffers filled by
 * asynchronous copies (cp.async, out-of-range groups zero-filled: 0 bytes read from the operand's first
 * element), so the loads of the next tiles are in flight while the tensor cores work on this one. Batch-1
 * GEMMs are latency-bound: without the pipeline each K step waited a whole global-memory round trip
 * (BERT-base's FFN-down projection ran at 17 TFLOP/s, 35 us, H100 2026-11-24). */
template <int M, int N, int K, int SLICE, int BM, int BN, int BK, int WM, int WN, int MSTRIDE, int STAGES, class T, class A, class B, class Index, class Out>
__device__ __forceinline__ void tc_pipelined(unsigned slice, A&& a, B&& b, Index&& index, Out&& out) {
  constexpr int THREADS = (BM / WM) * (BN / WN) * 32, LDA = BK + 8, LDB = BN + 8, LDC = BN + 4;
  constexpr int SA = BM * LDA, SB = BK * LDB;
  __shared__ __align__(128) T As[STAGES * SA];
  __shared__ __align__(128) T Bs[STAGES * SB];
  __shared__ __align__(32) float Cs[BM * LDC];
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int warp = threadIdx.x / 32, wr = warp / (BN / WN), wc = warp % (BN / WN);
  Accumulators<T, WM, WN> acc;
#pragma unroll
  for (int i = 0; i < WM / 16; i++)
#pragma unroll
    for (int c = 0; c < WN / 16; c++) nvcuda::wmma::fill_fragment(acc[i][c], 0.0f);
  const int kbeg = slice * SLICE, kend = min(K, kbeg + SLICE);
  const int ntiles = kend > kbeg ? (kend - kbeg + BK - 1) / BK : 0;
  const void* const a0 = a(0, 0);
  const void* const b0 = b(0, 0);
  auto load_stage = [&](int st, int k0) {
    each<BM * BK / 8, THREADS>([&](int, int e) {
      const int kk = (e % (BK / 8)) * 8, mm = e / (BK / 8);
      const int m = m0 + mm, k = k0 + kk;
      const bool ok = m < M && k < kend;
      tsr_cp16(As + st * SA + mm * LDA + kk, ok ? (const void*)a(m, k) : a0, ok ? 16u : 0u);
    });
    for (int e = threadIdx.x; e < BN * BK / 8; e += THREADS) {
      const int nn = (e % (BN / 8)) * 8, kk = e / (BN / 8);
      const int n = n0 + nn, k = k0 + kk;
      const bool ok = n < N && k < kend;
      tsr_cp16(Bs + st * SB + kk * LDB + nn, ok ? (const void*)b(k, n) : b0, ok ? 16u : 0u);
    }
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < ntiles) load_stage(s, kbeg + s * BK);
    tsr_cp_commit();
  }
  for (int t = 0; t < ntiles; t++) {
    tsr_cp_wait<STAGES - 2>();
    __syncthreads();
    {
      const int nt = t + STAGES - 1;
      if (nt < ntiles) load_stage(nt % STAGES, kbeg + nt * BK);
      tsr_cp_commit();
    }
    mma_step<T, BK, WM, WN, LDA, LDB>(As + (t % STAGES) * SA, Bs + (t % STAGES) * SB, wr, wc, acc);
  }
  tsr_cp_wait<0>();
  tc_epilogue<M, N, BM, BN, LDC, THREADS, MSTRIDE, T, WM, WN>(Cs, wr, wc, acc, index, out);
}

#endif  // TSR_HALF_TYPES

}  // namespace tsr_gemm
