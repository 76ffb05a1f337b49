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
#define __launch_bounds__(n)
#define __restrict__ __restrict
/* A block's static shared arrays are one instance for all its fibers: function statics (blocks run one at a
 * time). emulate.rs drops the qualifier from `extern __shared__` (dynamic shared memory, tsr_smem below). */
#define __shared__ static
#define __align__(n) alignas(n)
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
