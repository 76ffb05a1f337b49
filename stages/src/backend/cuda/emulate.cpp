/* A CPU emulation of the little of CUDA that tessera's single-kernel tests need, so generated kernels can
 * be run and checked against the reference interpreter on a machine without a GPU (test-only: see
 * emulate.rs).
 *
 * Every CUDA thread of a block is a cooperative fiber (ucontext). A fiber runs until it reaches a barrier
 * (__syncthreads, __syncwarp, or the two inside a shuffle); the scheduler resumes the fibers of a warp when
 * all of its lanes wait at a warp barrier, and the whole block when every live thread waits at a block
 * barrier. A barrier reached by only part of the threads it needs is a deadlock: the run aborts with a
 * message. Blocks run one after the other; shared memory is refilled with NaN bytes before each block, so a
 * read of shared memory nobody wrote shows up as NaN. The order in which runnable fibers are resumed can be
 * reversed: a missing barrier (a read racing a write) tends to give different results in the two orders.
 */
#include <ucontext.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

struct float4 {
    float x, y, z, w;
} __attribute__((aligned(16)));
struct tsr_dim3 {
    unsigned x, y, z;
};

static tsr_dim3 blockIdx, blockDim, gridDim;
static int tsr_cur;
#define threadIdx (tsr_dim3{(unsigned)tsr_cur, 0u, 0u})
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
/* A block's static shared arrays are one instance for all its fibers: function statics (blocks run one at a
 * time). emulate.rs drops the qualifier from `extern __shared__` (dynamic shared memory, tsr_smem below). */
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define tsr_smem tsr_emu_smem
extern "C" {
alignas(16) float4 tsr_emu_smem[227 * 1024 / 16];
}
static inline float __int_as_float(int i) {
    float f;
    memcpy(&f, &i, 4);
    return f;
}
using std::min;
using std::max;
/* What the float helpers of prelude.cuh (which emulate.rs appends after this harness) need from CUDA. */
#define TSR_DEV static inline
#define TSR_NAN __int_as_float(0x7fc00000)
static inline long long __double_as_longlong(double d) {
    long long i;
    memcpy(&i, &d, 8);
    return i;
}
static inline double __longlong_as_double(long long i) {
    double d;
    memcpy(&d, &i, 8);
    return d;
}

enum { TSR_RUN, TSR_WAIT_BLOCK, TSR_WAIT_WARP, TSR_DONE };
struct TsrFiber {
    ucontext_t ctx;
    int state;
    std::vector<char> stack;
};
static std::vector<TsrFiber> tsr_fibers;
static ucontext_t tsr_sched;
static std::function<void()> tsr_body;
static float tsr_xch[1024];

static void tsr_wait(int st) {
    tsr_fibers[tsr_cur].state = st;
    swapcontext(&tsr_fibers[tsr_cur].ctx, &tsr_sched);
}
static void __syncthreads() { tsr_wait(TSR_WAIT_BLOCK); }

static void __syncwarp(unsigned = 0xffffffffu) { tsr_wait(TSR_WAIT_WARP); }
static float __shfl_xor_sync(unsigned, float v, int o) {
    tsr_xch[tsr_cur] = v;
    __syncwarp();
    const float r = tsr_xch[tsr_cur ^ o];
    __syncwarp();
    return r;
}

static void tsr_fiber_main() {
    tsr_body();
    tsr_fibers[tsr_cur].state = TSR_DONE;
}

/* Runs `body` as a grid of `gx x gy x gz` blocks (x fastest) of `block` threads. */
static void tsr_launch(unsigned gx, unsigned gy, unsigned gz, unsigned block, std::function<void()> body, int reverse) {
    tsr_body = std::move(body);
    blockDim = {block, 1, 1};
    gridDim = {gx, gy, gz};
    const unsigned grid = gx * gy * gz;
    for (unsigned b = 0; b < grid; b++) {
        blockIdx = {b % gx, b / gx % gy, b / (gx * gy)};
        memset(tsr_emu_smem, 0xff, sizeof tsr_emu_smem);
        tsr_fibers.clear();
        tsr_fibers.resize(block);
        for (unsigned t = 0; t < block; t++) {
            TsrFiber& f = tsr_fibers[t];
            f.stack.resize(1 << 17);
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack.data();
            f.ctx.uc_stack.ss_size = f.stack.size();
            f.ctx.uc_link = &tsr_sched;
            makecontext(&f.ctx, tsr_fiber_main, 0);
            f.state = TSR_RUN;
        }
        for (;;) {
            for (unsigned k = 0; k < block; k++) {
                const unsigned t = reverse ? block - 1 - k : k;
                if (tsr_fibers[t].state != TSR_RUN) continue;
                tsr_cur = (int)t;
                swapcontext(&tsr_sched, &tsr_fibers[t].ctx);
            }
            unsigned done = 0, at_block = 0;
            for (auto& f : tsr_fibers) {
                done += f.state == TSR_DONE;
                at_block += f.state == TSR_WAIT_BLOCK;
            }
            if (done == block) break;
            bool released = false;
            for (unsigned w = 0; w * 32 < block; w++) {
                const unsigned lo = w * 32, hi = std::min(block, lo + 32);
                bool all = true;
                for (unsigned t = lo; t < hi; t++) all = all && tsr_fibers[t].state == TSR_WAIT_WARP;
                if (all) {
                    for (unsigned t = lo; t < hi; t++) tsr_fibers[t].state = TSR_RUN;
                    released = true;
                }
            }
            if (!released && at_block + done == block) {
                for (auto& f : tsr_fibers)
                    if (f.state == TSR_WAIT_BLOCK) f.state = TSR_RUN;
                released = true;
            }
            if (!released) {
                fprintf(stderr, "emulated block %u deadlocks: threads wait at different barriers\n", b);
                abort();
            }
        }
    }
}

template <class... P, size_t... I>
static void tsr_call_impl(void (*f)(P...), void** a, std::index_sequence<I...>) {
    f((P)a[I]...);
}
/* Calls kernel `f` with the pointers in `a`, each cast to its parameter's type. */
template <class... P>
static void tsr_call(void (*f)(P...), void** a) {
    tsr_call_impl(f, a, std::index_sequence_for<P...>{});
}

/* ---- 16-bit floats and tensor cores: what prelude_half.cuh and the toolkit's headers give a module with f16
 * or bf16 tensors, re-expressed for the CPU (the prelude's inline PTX cannot run here). Conversions round to
 * nearest even as the device's do; the tensor-core operations follow the PTX ISA's fragment layouts, so a
 * generated kernel that indexes its fragments wrongly computes wrong numbers here too. The warp-collective
 * ones (mma.sync, ldmatrix) exchange their lanes' registers through per-thread slots between warp barriers,
 * as the shuffles above do; WMMA fragments hold the whole 16x16 tile in every lane (what a lane holds of it
 * is opaque to the kernels), so loads, products and stores need no exchange. cp.async copies at once, which
 * is one of the orders the hardware may complete it in. */
#define TSR_HALF_TYPES 1
struct __half {
    unsigned short x;
};
struct __nv_bfloat16 {
    unsigned short x;
};
struct uint4 {
    unsigned x, y, z, w;
} __attribute__((aligned(16)));
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
static inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
static inline unsigned short __half_as_ushort(__half h) { return h.x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16{u}; }
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.x; }
static inline uint32_t tsr_emu_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __bfloat162float(__nv_bfloat16 h) {
    const uint32_t u = (uint32_t)h.x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u = tsr_emu_bits(f);
    if (std::isnan(f)) return __nv_bfloat16{(unsigned short)((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return __nv_bfloat16{(unsigned short)(u >> 16)};
}
static inline float __half2float(__half h) {
    const int e = (h.x >> 10) & 0x1f, m = h.x & 0x3ff;
    const double s = (h.x & 0x8000) ? -1.0 : 1.0;
    if (e == 0x1f) return m ? TSR_NAN : (float)(s * INFINITY);
    return (float)(s * (e ? std::ldexp(1024.0 + m, e - 25) : std::ldexp((double)m, -24)));
}
static inline __half __float2half_rn(float f) {
    if (std::isnan(f)) return __half{0x7e00};
    const unsigned short sign = std::signbit(f) ? 0x8000 : 0;
    const double a = std::fabs((double)f);
    if (a >= 65520.0) return __half{(unsigned short)(sign | 0x7c00)};  // halfway to 2^16 and beyond: inf
    if (a < std::ldexp(1.0, -14)) return __half{(unsigned short)(sign | (unsigned short)std::nearbyint(a * std::ldexp(1.0, 24)))};
    int ex;
    std::frexp(a, &ex);
    int e = ex - 1;
    double m = std::nearbyint((a / std::ldexp(1.0, e) - 1.0) * 1024.0);
    if (m == 1024.0) {
        m = 0.0;
        e++;
    }
    if (e > 15) return __half{(unsigned short)(sign | 0x7c00)};
    return __half{(unsigned short)(sign | ((e + 15) << 10) | (unsigned short)m)};
}
static inline float tsr_emu_float(__half h) { return __half2float(h); }
static inline float tsr_emu_float(__nv_bfloat16 h) { return __bfloat162float(h); }

static inline void tsr_cp16(void* dst, const void* src, unsigned bytes) {
    memcpy(dst, src, bytes);
    memset((char*)dst + bytes, 0, 16 - bytes);
}
static inline void tsr_cp_commit() {}
template <int N>
static inline void tsr_cp_wait() {}
static inline unsigned short tsr_bits(__half x) { return x.x; }
static inline unsigned short tsr_bits(__nv_bfloat16 x) { return x.x; }
template <typename T>
static inline T tsr_round(float x);
template <>
inline __half tsr_round<__half>(float x) { return __float2half_rn(x); }
template <>
inline __nv_bfloat16 tsr_round<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <typename T>
static inline unsigned tsr_pack2(T lo, T hi) { return (unsigned)tsr_bits(lo) | ((unsigned)tsr_bits(hi) << 16); }
template <typename T>
static inline unsigned tsr_pack_float2(float lo, float hi) { return tsr_pack2(tsr_round<T>(lo), tsr_round<T>(hi)); }
/* Element `half` (0: low 16 bits) of a packed register, as a float. */
template <typename T>
static inline float tsr_emu_unpack(unsigned r, int half) { return tsr_emu_float(T{(unsigned short)(half ? r >> 16 : r & 0xffffu)}); }

static unsigned tsr_xch_a[1024][4], tsr_xch_b[1024][2];
/* mma.sync.m16n8k16.row.col.f32.T.T.f32: lane l = 4 g + t holds A's rows g and g + 8, columns 2t.. and
 * 2t + 8.. (a[0]: row g, a[1]: row g + 8, a[2]: row g columns + 8, a[3]: row g + 8 columns + 8); B's column g,
 * rows 2t.. (b0) and 2t + 8.. (b1); D's rows g and g + 8, columns 2t and 2t + 1. */
template <typename T>
static void tsr_mma16816(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    for (int i = 0; i < 4; i++) tsr_xch_a[tsr_cur][i] = a[i];
    tsr_xch_b[tsr_cur][0] = b0;
    tsr_xch_b[tsr_cur][1] = b1;
    __syncwarp();
    const int base = tsr_cur & ~31, g = (tsr_cur & 31) >> 2, t = tsr_cur & 3;
    auto A = [&](int r, int c) {
        const int lane = (r % 8) * 4 + (c % 8) / 2;
        return tsr_emu_unpack<T>(tsr_xch_a[base + lane][(r >= 8) + 2 * (c >= 8)], c & 1);
    };
    auto B = [&](int k, int c) {
        const int lane = c * 4 + (k % 8) / 2;
        return tsr_emu_unpack<T>(tsr_xch_b[base + lane][k >= 8], k & 1);
    };
    for (int e = 0; e < 4; e++) {
        const int r = g + (e >> 1) * 8, c = 2 * t + (e & 1);
        float s = d[e];
        for (int k = 0; k < 16; k++) s += A(r, k) * B(k, c);
        d[e] = s;
    }
    __syncwarp();
}
static const unsigned short* tsr_xch_p[1024];
/* ldmatrix.sync.m8n8.x4.trans.b16: lane 8i + r addresses row r of matrix i; lane l = 4 g + t receives, of
 * each matrix, the transposed pair (row 2t, column g) and (row 2t + 1, column g). */
template <typename T>
static void tsr_ldmatrix_x4_trans(unsigned* r, const T* p) {
    tsr_xch_p[tsr_cur] = (const unsigned short*)p;
    __syncwarp();
    const int base = tsr_cur & ~31, g = (tsr_cur & 31) >> 2, t = tsr_cur & 3;
    for (int i = 0; i < 4; i++) {
        const unsigned lo = tsr_xch_p[base + 8 * i + 2 * t][g], hi = tsr_xch_p[base + 8 * i + 2 * t + 1][g];
        r[i] = lo | (hi << 16);
    }
    __syncwarp();
}

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    float x[16][16];
};
template <class F>
static inline void fill_fragment(F& f, float v) {
    for (auto& row : f.x)
        for (auto& e : row) e = v;
}
template <class Use, class T, class L>
static inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, L>& f, const T* p, unsigned ldm) {
    static_assert(std::is_same<L, row_major>::value, "the kernels stage row-major tiles");
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) f.x[r][c] = tsr_emu_float(p[r * ldm + c]);
}
template <class T, class LA, class LB>
static inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
                            const fragment<matrix_b, 16, 16, 16, T, LB>& b, const fragment<accumulator, 16, 16, 16, float>& c) {
    float out[16][16];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 16; n++) {
            float s = c.x[r][n];
            for (int k = 0; k < 16; k++) s += a.x[r][k] * b.x[k][n];
            out[r][n] = s;
        }
    memcpy(d.x, out, sizeof out);
}
static inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t layout) {
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) p[layout == mem_row_major ? r * ldm + c : c * ldm + r] = f.x[r][c];
}
}  // namespace wmma
}  // namespace nvcuda
