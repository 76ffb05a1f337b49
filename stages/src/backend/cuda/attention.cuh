/* tessera cuda backend: the attention main loops (see attention.rs and attention_mma.rs).
 *
 * Each loop is written once here, its tile shape, head dims, sequence lengths and shared-memory layout
 * template parameters; the generated kernel computes what is specific to its partition (which batch matrix
 * and query rows its block owns, where the operands live) and passes it in as lambdas:
 *   q_at, k_at, v_at  where the elements of the block's batch matrix of Q, K, V are (see each template: the
 *                     SIMT kernel reads values, the tensor-core one offsets and tile elements, which it may
 *                     copy 16 bytes at a time). Where an index is a tile's first row or key plus an offset,
 *                     the lambda gets both and sums them where the generator's expression did: the
 *                     association of an unsigned sum changes the machine code NVRTC produces;
 *   mask(r, j, x)     the keep mask and the additive mask of query row r and key j applied to the scaled
 *                     score x (in place), called for r < Sq and j < Sk only;
 *   store(r, c, y)    the output element of row r, column c (y = acc / l in fp32; the lambda rounds).
 * The lambdas are defined inside the kernel and the functions are __forceinline__, so everything inlines
 * and the constants of the partition fold as if written in place. */

/* Dynamic shared memory (the launch sizes it from the Rust side's Layout). The templates name it rather than
 * take a pointer to it: through a pointer parameter, even once inlined, NVRTC no longer folds the tiles'
 * offsets into the shared-memory instructions the same way, and the machine code differs from the loop
 * written in the kernel (the SIMT kernel on the decode case: 48 registers instead of 64, another schedule).
 * The CPU emulation defines tsr_smem as its own array (emulate.cpp), hence the guard. */
#ifndef tsr_smem
extern __shared__ float4 tsr_smem[];
#endif

namespace tsr_attention {

/* ---- SIMT (fp32 arithmetic, any storage type) ------------------------------------------------------
 * A block owns one batch matrix (batch and head) and BQ query rows, which it stages in shared memory once.
 * It then walks the keys in tiles of BK: the tile's K (stored transposed, Ks[d][j], so a warp reads 32
 * consecutive keys) and V (Vs[j][c]) are staged in shared memory, and each warp, owning BQ / warps query
 * rows, computes
 * 1. the rows' scores against the tile, each lane BK / 32 keys, reading Q four head dims at a time (float4
 *    broadcasts), then the scale, the keep mask and the additive mask;
 * 2. the online softmax: the tile's row maxima and exp-sums by warp shuffles, the running max m and sum l
 *    updated and the output accumulator rescaled by exp(m_old - m_new);
 * 3. the probabilities (through the warp's rows of Ps in shared memory) times the tile's V, each lane
 *    accumulating DVP / 32 output columns of every row in registers.
 * The output is acc / l. NaN semantics are the reference's: a row of -inf scores keeps m = -inf, its
 * exponentials are taken against 0 instead (so they are 0, not NaN from -inf - -inf), and the result is
 * 0 / 0 = NaN; a NaN or +inf score makes l NaN.
 * Keys past SK in the last tile score -inf against zero V rows; query rows past SQ compute on zero Q rows
 * and are not stored, so any SQ and SK work with any tile.
 *
 * Shared memory (floats, offsets from the Rust side's Layout, which sizes the launch): Qs [BQ][DQ] at 0 (DQ:
 * D rounded up to 4, the pad zero, for float4 reads), Ks [DQ][KS] at K_AT (KS = BK + 1: a warp's writes
 * along d hit 32 different banks), Vs [BK][DVP] at V_AT (DVP: DV rounded up to 32, the columns a warp
 * covers), Ps [BQ][BK] at P_AT; each offset a multiple of 4 (float4 reads of Ps).
 * K_BY_DIM: K is stored [D, Sk] (its tile is copied key-fastest), else [Sk, D]. The lambdas read Q row
 * q0 + r, K key k0 + j and V row k0 + j: q_at(q0, r, t), k_at(k0, j, t), v_at(k0, j, c) (t, c: head dims). */
template <unsigned BQ, unsigned BK, unsigned THREADS, unsigned SQ, unsigned SK, unsigned D, unsigned DV, unsigned DQ, unsigned KS, unsigned DVP,
          unsigned K_AT, unsigned V_AT, unsigned P_AT, bool K_BY_DIM, bool NAN_TO_ZERO, typename QAt, typename KAt, typename VAt, typename Mask, typename Store>
__device__ __forceinline__ void simt(unsigned q0, float scale, QAt q_at, KAt k_at, VAt v_at, Mask mask, Store store) {
  /* Rows of a warp, keys of a lane in a tile, output columns of a lane. */
  constexpr int RW = BQ / (THREADS / 32), KL = BK / 32, DVL = DVP / 32;
  float* const Qs = (float*)tsr_smem;
  float* const Ks = Qs + K_AT;
  float* const Vs = Qs + V_AT;
  float* const Ps = Qs + P_AT;
  const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  /* Q rows of the block (zero past SQ and in the head dim's pad), and the pad rows of Ks (zero for good). */
  for (unsigned e = threadIdx.x; e < BQ * DQ; e += THREADS) {
    const unsigned r = e / DQ, t = e % DQ;
    Qs[e] = (q0 + r < SQ && t < D) ? q_at(q0, r, t) : 0.0f;
  }
  if constexpr (DQ > D) {
    for (unsigned e = threadIdx.x; e < (DQ - D) * KS; e += THREADS) Ks[D * KS + e] = 0.0f;
  }
  float m[RW], l[RW], acc[RW][DVL];
#pragma unroll
  for (int i = 0; i < RW; i++) {
    m[i] = -__int_as_float(0x7f800000);
    l[i] = 0.0f;
#pragma unroll
    for (int c = 0; c < DVL; c++) acc[i][c] = 0.0f;
  }
  for (unsigned k0 = 0; k0 < SK; k0 += BK) {
    __syncthreads();
    /* Stage the key tile transposed and the value tile, zero past SK (and past DV in V's pad). */
    for (unsigned e = threadIdx.x; e < BK * D; e += THREADS) {
      unsigned j, t;
      if constexpr (K_BY_DIM) {
        t = e / BK;
        j = e % BK;
      } else {
        j = e / D;
        t = e % D;
      }
      Ks[t * KS + j] = k0 + j < SK ? k_at(k0, j, t) : 0.0f;
    }
    for (unsigned e = threadIdx.x; e < BK * DVP; e += THREADS) {
      const unsigned j = e / DVP, c = e % DVP;
      Vs[e] = (k0 + j < SK && c < DV) ? v_at(k0, j, c) : 0.0f;
    }
    __syncthreads();
    /* 1. Scores of the warp's rows: four head dims per step, Q as float4 broadcasts. */
    float s[RW][KL];
#pragma unroll
    for (int i = 0; i < RW; i++)
#pragma unroll
      for (int c = 0; c < KL; c++) s[i][c] = 0.0f;
    const float* const qw = Qs + warp * (RW * DQ);
#pragma unroll 2
    for (unsigned t = 0; t < DQ; t += 4) {
      float4 qv[RW];
#pragma unroll
      for (int i = 0; i < RW; i++) qv[i] = *reinterpret_cast<const float4*>(qw + i * (int)DQ + t);
      /* The four head dims of the step written out (not a loop over float4 components: the code must be the
       * same as the generator's was). */
#pragma unroll
      for (int c = 0; c < KL; c++) {
        {
          const float kv = Ks[(t + 0u) * KS + lane + 32u * c];
#pragma unroll
          for (int i = 0; i < RW; i++) s[i][c] = fmaf(qv[i].x, kv, s[i][c]);
        }
        {
          const float kv = Ks[(t + 1u) * KS + lane + 32u * c];
#pragma unroll
          for (int i = 0; i < RW; i++) s[i][c] = fmaf(qv[i].y, kv, s[i][c]);
        }
        {
          const float kv = Ks[(t + 2u) * KS + lane + 32u * c];
#pragma unroll
          for (int i = 0; i < RW; i++) s[i][c] = fmaf(qv[i].z, kv, s[i][c]);
        }
        {
          const float kv = Ks[(t + 3u) * KS + lane + 32u * c];
#pragma unroll
          for (int i = 0; i < RW; i++) s[i][c] = fmaf(qv[i].w, kv, s[i][c]);
        }
      }
    }
    /* 2. Scale and masks, then the online softmax per row. */
#pragma unroll
    for (int i = 0; i < RW; i++) {
      const unsigned r = q0 + warp * RW + i;
      float mx = -__int_as_float(0x7f800000);
#pragma unroll
      for (int c = 0; c < KL; c++) {
        const unsigned j = k0 + lane + 32u * c;
        float x = s[i][c] * scale;
        if (j >= SK) x = -__int_as_float(0x7f800000);
        else if (r < SQ) mask(r, j, x);
        s[i][c] = x;
        mx = fmaxf(mx, x);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float mn = fmaxf(m[i], mx);
      /* A row with only -inf so far: exponentials against 0, so they are 0 rather than NaN. */
      const float base = mn == -__int_as_float(0x7f800000) ? 0.0f : mn;
      const float alpha = expf(m[i] - base);
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < KL; c++) {
        const float p = expf(s[i][c] - base);
        Ps[(warp * RW + i) * BK + lane + 32u * c] = p;
        sum += p;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      l[i] = l[i] * alpha + sum;
      m[i] = mn;
#pragma unroll
      for (int c = 0; c < DVL; c++) acc[i][c] *= alpha;
    }
    __syncwarp();
    /* 3. Probabilities times V, four keys per step; the last tile stops after its valid keys. */
    const float* const pw = Ps + warp * (RW * BK);
    const unsigned kn = min(BK, SK - k0);
#pragma unroll 2
    for (unsigned j = 0; j < kn; j += 4) {
      float4 pv[RW];
#pragma unroll
      for (int i = 0; i < RW; i++) pv[i] = *reinterpret_cast<const float4*>(pw + i * (int)BK + j);
      /* Key j + u of the step times V row j + u, u = 0..3 written out as above. */
      {
        float vv[DVL];
#pragma unroll
        for (int c = 0; c < DVL; c++) vv[c] = Vs[(j + 0u) * DVP + lane + 32u * c];
#pragma unroll
        for (int i = 0; i < RW; i++)
#pragma unroll
          for (int c = 0; c < DVL; c++) acc[i][c] = fmaf(pv[i].x, vv[c], acc[i][c]);
      }
      {
        float vv[DVL];
#pragma unroll
        for (int c = 0; c < DVL; c++) vv[c] = Vs[(j + 1u) * DVP + lane + 32u * c];
#pragma unroll
        for (int i = 0; i < RW; i++)
#pragma unroll
          for (int c = 0; c < DVL; c++) acc[i][c] = fmaf(pv[i].y, vv[c], acc[i][c]);
      }
      {
        float vv[DVL];
#pragma unroll
        for (int c = 0; c < DVL; c++) vv[c] = Vs[(j + 2u) * DVP + lane + 32u * c];
#pragma unroll
        for (int i = 0; i < RW; i++)
#pragma unroll
          for (int c = 0; c < DVL; c++) acc[i][c] = fmaf(pv[i].z, vv[c], acc[i][c]);
      }
      {
        float vv[DVL];
#pragma unroll
        for (int c = 0; c < DVL; c++) vv[c] = Vs[(j + 3u) * DVP + lane + 32u * c];
#pragma unroll
        for (int i = 0; i < RW; i++)
#pragma unroll
          for (int c = 0; c < DVL; c++) acc[i][c] = fmaf(pv[i].w, vv[c], acc[i][c]);
      }
    }
  }
  /* The rows' outputs: acc / l (0 / 0 = NaN for a row of -inf scores, as the reference; 0 with NAN_TO_ZERO, the
   * exporters' guard, where l is 0 or NaN: exactly the rows whose probabilities are all NaN). */
#pragma unroll
  for (int i = 0; i < RW; i++) {
    const unsigned r = q0 + warp * RW + i;
    if (r < SQ) {
#pragma unroll
      for (int c = 0; c < DVL; c++) {
        const unsigned col = lane + 32u * c;
        if (col < DV) store(r, col, NAN_TO_ZERO && !(l[i] > 0.f) ? 0.f : acc[i][c] / l[i]);
      }
    }
  }
}

#ifdef TSR_HALF_TYPES
/* ---- Tensor cores (fp16 / bf16 operands, fp32 accumulation) -------------------------------------------
 * FlashAttention-2's structure with mma.sync m16n8k16 (the fragment layouts are the same for f16 and
 * bf16), so the Sq x Sk scores never touch global memory and both products run on the tensor cores; the
 * semantics are the SIMT kernel's exactly (masks, NaN rows, empty key axes).
 *
 * A block has WARPS x SPLIT warps. With SPLIT = 1 each warp owns 16 query rows of one batch matrix; with key
 * slices (SPLIT > 1) SPLIT warps share the same 16 rows, each walking every SPLIT-th key tile, and their
 * partial results are combined through shared memory at the end. Each warp keeps, in registers,
 * - its Q rows as the A fragments of Q K^T (loaded once, zero past SQ and past D);
 * - the output accumulator (16 x DV, the C fragments of P V), the running row max m and sum l.
 * The block walks the keys in rounds of BK keys per key slice, staging each round's K and V (Vs[j][c]) in
 * shared memory, zero past SK, D and DV; per tile each warp
 * 1. computes its scores S = Q K^T;
 * 2. applies the scale, the keep mask and the additive mask element by element (each thread knows the row
 *    and key of its fragment elements), -inf past SK;
 * 3. updates m and l (row maxima over the four threads sharing a row, by shuffles), rescales the
 *    accumulator, and turns P = exp(S - m) into A fragments of type T in registers: the C fragment layout of
 *    two adjacent 8-key tiles is the A fragment layout of one 16-key step, so P never leaves registers;
 * 4. accumulates P V, V's B fragments loaded transposed by ldmatrix.trans.
 * Rows are owned by quads of threads, so l stays a per-thread partial sum until the end (every thread of a
 * quad rescales by the same alpha) and is summed over the quad once. The output is acc / l: a row of -inf
 * scores keeps m = -inf, its exponentials are taken against 0 (so they are 0, not NaN), and gives 0 / 0 =
 * NaN, as the reference; a NaN or +inf score makes the row NaN. P is rounded to T for the second product
 * (as FlashAttention does); l sums the unrounded probabilities. */

/* A zero of the 16-bit type T as stored (for padding). */
template <typename T> __device__ __forceinline__ T zero();
template <> __device__ __forceinline__ __half zero<__half>() { return __ushort_as_half((unsigned short)0); }
template <> __device__ __forceinline__ __nv_bfloat16 zero<__nv_bfloat16>() { return __ushort_as_bfloat16((unsigned short)0); }

/* Copies a HEIGHT x WIDTH tile (padded extents) into shared memory at stage_at + AT elements (of T; rows LD
 * apart; the address from tsr_smem here, not a pointer parameter, for the reason given at the top, and
 * computed where it is used: a pointer hoisted out of the loop changes the code too) by all THREADS
 * threads: element
 * (r, c) is element (row0 + r, col0 + c) of the source, zero where row0 + r >= ROWS or col0 + c >= COLS.
 * ASYNC (decided by the generator: columns contiguous, COLS, the row stride and every batch matrix's start
 * multiples of 8 elements, the first column a multiple of 8, the source 16-byte aligned, not an inline
 * constant array): 16-byte groups by cp.async, each either whole or out of range, zero-filled where out of
 * range, so no branch; at(row0, r, col0, c) is the group's address in src. Else one element at a time,
 * at(row0, r, col0, c) the element. */
template <typename T, unsigned THREADS, unsigned HEIGHT, unsigned WIDTH, unsigned LD, unsigned AT, unsigned ROWS, unsigned COLS, bool ASYNC, typename At>
__device__ __forceinline__ void stage_tile(unsigned stage_at, unsigned row0, unsigned col0, const T* src, At at) {
  T* const smem = reinterpret_cast<T*>(tsr_smem);
  if constexpr (ASYNC) {
    constexpr unsigned GROUPS = WIDTH / 8;
    for (unsigned e = threadIdx.x; e < HEIGHT * GROUPS; e += THREADS) {
      const unsigned r = e / GROUPS, c = (e % GROUPS) * 8u;
      const bool ok = row0 + r < ROWS && col0 + c < COLS;
      tsr_cp16((smem + stage_at + AT) + r * LD + c, ok ? (const void*)(at(row0, r, col0, c)) : (const void*)src, ok ? 16u : 0u);
    }
  } else {
    for (unsigned e = threadIdx.x; e < HEIGHT * WIDTH; e += THREADS) {
      const unsigned r = e / WIDTH, c = e % WIDTH;
      (smem + stage_at + AT)[r * LD + c] = (row0 + r < ROWS && col0 + c < COLS) ? at(row0, r, col0, c) : zero<T>();
    }
  }
}

/* The tensor-core attention of one block. T: __half or __nv_bfloat16. WARPS warps along the query rows
 * (16 each), SPLIT key slices, BK keys per slice per round (a multiple of 16). Shared memory (elements of
 * T, from the Rust side's Layout, which sizes the launch): two stages of STAGE elements (the next round is
 * copied in, by cp.async, while the warps compute on this one), each K then V at V_AT; rows of LDK and LDV
 * elements, padded by 16 bytes so they stay 16-byte aligned (ldmatrix, cp.async) and the 32-bit fragment
 * reads of a warp fall in 32 different banks. K's tile is Ks[j][t] (K_BY_DIM false) or, when the operand's
 * keys rather than head dims are contiguous, Ks[t][j] (each tile a copy of the source's rows). K_ASYNC,
 * V_ASYNC: the tiles are copied 16 bytes at a time (see stage_tile). PARTIAL: floats of one warp's partial
 * result in the combine of key slices (per lane its accumulator, then its two rows' max and sum), which
 * reuses the stages. q0: the block's first query row. q_at(r, c, dc): the offset in q of row r, column
 * c + dc. k_at and v_at: the tiles' elements for stage_tile (K's in its staged layout: rows of head dims,
 * columns of keys when K_BY_DIM), k and v the buffers. */
template <typename T, unsigned WARPS, unsigned SPLIT, unsigned BK, unsigned SQ, unsigned SK, unsigned D, unsigned DV, unsigned LDK, unsigned LDV,
          unsigned V_AT, unsigned STAGE, unsigned PARTIAL, bool K_BY_DIM, bool K_ASYNC, bool V_ASYNC, bool NAN_TO_ZERO, typename QAt, typename KAt, typename VAt, typename Mask,
          typename Store>
__device__ __forceinline__ void mma(unsigned q0, float scale, const T* q, QAt q_at, const T* k, KAt k_at, const T* v, VAt v_at, Mask mask, Store store) {
  /* Head dims rounded up to 16 (the k of one Q K^T step; V's B fragments are loaded two 8-column tiles at
   * a time), the keys of a round, threads, rounds; Q K^T steps, 8-key score tiles, P V steps, 8-column output tiles. */
  constexpr unsigned DP = (D + 15) / 16 * 16, DVP = (DV + 15) / 16 * 16, ROUND = BK * SPLIT, THREADS = WARPS * SPLIT * 32, N_TILES = (SK + ROUND - 1) / ROUND;
  constexpr int DK_STEPS = DP / 16, S_TILES = BK / 8, PV_STEPS = BK / 16, O_TILES = DVP / 8;
  T* const smem = reinterpret_cast<T*>(tsr_smem);
  /* Warp `warp` owns rows rw of the block's and walks key slice ks: keys ks * BK.. of every round. */
  const unsigned warp = threadIdx.x >> 5, lane = threadIdx.x & 31u, gr = lane >> 2, tq = lane & 3u;
  const unsigned rw = warp % WARPS, ks = warp / WARPS;
  q0 += rw * 16u;
  /* Q's A fragments: register i of step s holds row gr + (i & 1) * 8, columns s * 16 + tq * 2 + (i >> 1) * 8
   * and the next. */
  unsigned qa[DK_STEPS][4];
#pragma unroll
  for (int s = 0; s < DK_STEPS; s++)
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const unsigned r = q0 + gr + (i & 1) * 8u, c = s * 16u + tq * 2u + (i >> 1) * 8u;
      const T lo = (r < SQ && c < D) ? q[q_at(r, c, 0u)] : zero<T>();
      const T hi = (r < SQ && c + 1u < D) ? q[q_at(r, c, 1u)] : zero<T>();
      qa[s][i] = tsr_pack2(lo, hi);
    }
  float acc[O_TILES][4];
#pragma unroll
  for (int n = 0; n < O_TILES; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) acc[n][e] = 0.0f;
  float m[2] = {-__int_as_float(0x7f800000), -__int_as_float(0x7f800000)}, l[2] = {0.0f, 0.0f};
  /* The key rounds, two stages: round it + 1 is copied in while the warps compute on round it; a round
   * holds one tile of BK keys per key slice. K's tile in the layout it is staged in: rows of dims (K_BY_DIM)
   * or of keys. */
  auto stage = [&](unsigned k0, unsigned st) {
    if constexpr (K_BY_DIM) stage_tile<T, THREADS, DP, ROUND, LDK, 0, D, SK, K_ASYNC>(st * STAGE, 0u, k0, k, k_at);
    else stage_tile<T, THREADS, ROUND, DP, LDK, 0, SK, D, K_ASYNC>(st * STAGE, k0, 0u, k, k_at);
    stage_tile<T, THREADS, ROUND, DVP, LDV, V_AT, SK, DV, V_ASYNC>(st * STAGE, k0, 0u, v, v_at);
    tsr_cp_commit();
  };
  stage(0u, 0u);
  for (unsigned it = 0; it < N_TILES; it++) {
    const unsigned r0 = it * ROUND;
    if (it + 1u < N_TILES) {
      stage(r0 + ROUND, (it + 1u) & 1u);
      tsr_cp_wait<1>();
    } else tsr_cp_wait<0>();
    __syncthreads();
    const unsigned k0 = r0 + ks * BK;
    const T* const Ks = smem + (it & 1u) * STAGE + ks * (K_BY_DIM ? BK : BK * LDK);
    const T* const Vs = smem + (it & 1u) * STAGE + V_AT + ks * (BK * LDV);
    /* 1. Scores: tile n of 8 keys, step t of 16 head dims. K stored [Sk, D]: the B fragment is the pair
     * Ks[n * 8 + gr][t * 16 + tq * 2 (+ 8)]; stored [D, Sk]: rows of dims, loaded transposed by ldmatrix
     * for key tiles n and n + 1 at once. */
    float s[S_TILES][4];
#pragma unroll
    for (int n = 0; n < S_TILES; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    if constexpr (K_BY_DIM) {
#pragma unroll
      for (int t = 0; t < DK_STEPS; t++)
#pragma unroll
        for (int n = 0; n < S_TILES; n += 2) {
          unsigned kb4[4];
          tsr_ldmatrix_x4_trans(kb4, Ks + (t * 16u + ((lane >> 3) & 1u) * 8u + (lane & 7u)) * LDK + n * 8u + (lane >> 4) * 8u);
          tsr_mma16816<T>(s[n], qa[t], kb4[0], kb4[1]);
          tsr_mma16816<T>(s[n + 1], qa[t], kb4[2], kb4[3]);
        }
    } else {
#pragma unroll
      for (int n = 0; n < S_TILES; n++) {
        const T* const kr = Ks + (n * 8u + gr) * LDK + tq * 2u;
#pragma unroll
        for (int t = 0; t < DK_STEPS; t++)
          tsr_mma16816<T>(s[n], qa[t], *reinterpret_cast<const unsigned*>(kr + t * 16), *reinterpret_cast<const unsigned*>(kr + t * 16 + 8));
      }
    }
    /* 2. Scale and masks per element: e = 0, 1 on row gr, e = 2, 3 on row gr + 8; key n * 8 + tq * 2 + (e & 1). */
#pragma unroll
    for (int n = 0; n < S_TILES; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const unsigned r = q0 + gr + (e >> 1) * 8u, j = k0 + n * 8u + tq * 2u + (e & 1);
        float x = s[n][e] * scale;
        if (j >= SK) x = -__int_as_float(0x7f800000);
        else if (r < SQ) mask(r, j, x);
        s[n][e] = x;
      }
    /* 3. Online softmax per row half h (rows gr and gr + 8): the quad's max, the rescale, P in place of S. */
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
      float mx = -__int_as_float(0x7f800000);
#pragma unroll
      for (int n = 0; n < S_TILES; n++) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mn = fmaxf(m[h], mx);
      /* A row with only -inf so far: exponentials against 0, so they are 0 rather than NaN. */
      const float base = mn == -__int_as_float(0x7f800000) ? 0.0f : mn;
      alpha[h] = expf(m[h] - base);
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < S_TILES; n++)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; e++) {
          s[n][e] = expf(s[n][e] - base);
          sum += s[n][e];
        }
      l[h] = l[h] * alpha[h] + sum;
      m[h] = mn;
    }
#pragma unroll
    for (int n = 0; n < O_TILES; n++) {
      acc[n][0] *= alpha[0];
      acc[n][1] *= alpha[0];
      acc[n][2] *= alpha[1];
      acc[n][3] *= alpha[1];
    }
    /* 4. P V: step t covers keys t * 16.. (score tiles 2t and 2t + 1 as one A fragment); V's B fragments for
     * output tiles n and n + 1 by one ldmatrix.x4.trans (lanes 8i..8i+7 address rows of matrix i: keys
     * t * 16 + (i & 1) * 8 + row, columns n * 8 + (i >> 1) * 8). */
#pragma unroll
    for (int t = 0; t < PV_STEPS; t++) {
      unsigned pa[4] = {tsr_pack_float2<T>(s[2 * t][0], s[2 * t][1]), tsr_pack_float2<T>(s[2 * t][2], s[2 * t][3]),
                        tsr_pack_float2<T>(s[2 * t + 1][0], s[2 * t + 1][1]), tsr_pack_float2<T>(s[2 * t + 1][2], s[2 * t + 1][3])};
#pragma unroll
      for (int n = 0; n < O_TILES; n += 2) {
        unsigned vb4[4];
        tsr_ldmatrix_x4_trans(vb4, Vs + (t * 16u + ((lane >> 3) & 1u) * 8u + (lane & 7u)) * LDV + n * 8u + (lane >> 4) * 8u);
        tsr_mma16816<T>(acc[n], pa, vb4[0], vb4[1]);
        tsr_mma16816<T>(acc[n + 1], pa, vb4[2], vb4[3]);
      }
    }
    __syncthreads();
  }
  if constexpr (SPLIT > 1) {
    /* The key slices' partial results combined into slice 0's warps (the others write theirs to shared
     * memory, over the stages, and are done): per row the largest max M, and each slice's sum and
     * accumulator scaled by exp(m - M) (against 0 when M is -inf, so a row with no finite score stays
     * 0 / 0). Each thread of slice 0 reads the same fragment positions of the others, so no layout changes
     * hands. l is still a per-thread partial here: the sum over the quad comes after, as without a split. */
    constexpr int ACC_FLOATS = O_TILES * 4;
    __syncthreads();
    float* const part = reinterpret_cast<float*>(tsr_smem);
    if (ks > 0u) {
      float* const mine = part + ((ks - 1u) * WARPS + rw) * PARTIAL + lane;
#pragma unroll
      for (int n = 0; n < O_TILES; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) mine[(n * 4 + e) * 32] = acc[n][e];
#pragma unroll
      for (int h = 0; h < 2; h++) {
        mine[(ACC_FLOATS + h) * 32] = m[h];
        mine[(ACC_FLOATS + 2 + h) * 32] = l[h];
      }
    }
    __syncthreads();
    if (ks == 0u) {
#pragma unroll
      for (int h = 0; h < 2; h++) {
        float mx = m[h];
        for (unsigned j = 0; j < SPLIT - 1; j++) mx = fmaxf(mx, part[(j * WARPS + rw) * PARTIAL + lane + (ACC_FLOATS + h) * 32]);
        const float base = mx == -__int_as_float(0x7f800000) ? 0.0f : mx;
        const float own = expf(m[h] - base);
        l[h] *= own;
#pragma unroll
        for (int n = 0; n < O_TILES; n++) {
          acc[n][2 * h] *= own;
          acc[n][2 * h + 1] *= own;
        }
        for (unsigned j = 0; j < SPLIT - 1; j++) {
          const float* const theirs = part + (j * WARPS + rw) * PARTIAL + lane;
          const float f = expf(theirs[(ACC_FLOATS + h) * 32] - base);
          l[h] += theirs[(ACC_FLOATS + 2 + h) * 32] * f;
#pragma unroll
          for (int n = 0; n < O_TILES; n++) {
            acc[n][2 * h] += theirs[(n * 4 + 2 * h) * 32] * f;
            acc[n][2 * h + 1] += theirs[(n * 4 + 2 * h + 1) * 32] * f;
          }
        }
      }
    }
  }
  /* The rows' outputs: the quad's sum of l, then acc / l (0 / 0 = NaN for a row of -inf scores; 0 with
   * NAN_TO_ZERO where l is 0 or NaN). */
#pragma unroll
  for (int h = 0; h < 2; h++) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    const unsigned r = q0 + gr + h * 8u;
    if (ks == 0u && r < SQ) {
#pragma unroll
      for (int n = 0; n < O_TILES; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const unsigned c = n * 8u + tq * 2u + e;
          if (c < DV) store(r, c, NAN_TO_ZERO && !(l[h] > 0.f) ? 0.f : acc[n][2 * h + e] / l[h]);
        }
    }
  }
}
#endif /* TSR_HALF_TYPES */

}  // namespace tsr_attention
