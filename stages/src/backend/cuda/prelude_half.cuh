#include <mma.h>
/* Tells the templates (gemm.cuh, attention.cuh) that the 16-bit types and tensor-core helpers exist. */
#define TSR_HALF_TYPES 1
/* The 16-bit float types (__half, __nv_bfloat16: mma.h brings cuda_fp16.h and cuda_bf16.h) share every
   helper below: the element type is a template argument, and the one place the PTX differs, the mma
   instruction's type, is spelled once through a macro. */
/* Asynchronous 16-byte global-to-shared copy (sm_80+): `bytes` of the 16 are read, the rest zero-filled,
   so an out-of-range group costs no branch. */
__device__ __forceinline__ void tsr_cp16(void* dst, const void* src, unsigned bytes) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tsr_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void tsr_cp_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }
/* The bits of a 16-bit float. */
__device__ __forceinline__ unsigned short tsr_bits(__half x) { return __half_as_ushort(x); }
__device__ __forceinline__ unsigned short tsr_bits(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
/* A float rounded to the 16-bit type T (nearest even). */
template <typename T> __device__ __forceinline__ T tsr_round(float x);
template <> __device__ __forceinline__ __half tsr_round<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 tsr_round<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
/* Two 16-bit floats as one 32-bit register, `lo` in the low 16 bits (the element of lower index in an
   .f16x2 / .bf16x2). */
template <typename T> __device__ __forceinline__ unsigned tsr_pack2(T lo, T hi) {
  return (unsigned)tsr_bits(lo) | ((unsigned)tsr_bits(hi) << 16);
}
template <typename T> __device__ __forceinline__ unsigned tsr_pack_float2(float lo, float hi) {
  return tsr_pack2(tsr_round<T>(lo), tsr_round<T>(hi));
}
/* d = a b + d on tensor cores: m16n8k16, T inputs, fp32 accumulators, the PTX ISA's fragment layouts
   (a: 4 registers of row-major A, b: 2 of column-major B, d: rows lane/4 and lane/4 + 8); the layouts are
   the same for f16 and bf16. */
template <typename T> __device__ __forceinline__ void tsr_mma16816(float* d, const unsigned* a, unsigned b0, unsigned b1);
#define TSR_MMA16816(T, PTX_TYPE)                                                                              \
  template <> __device__ __forceinline__ void tsr_mma16816<T>(float* d, const unsigned* a, unsigned b0, unsigned b1) { \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX_TYPE "." PTX_TYPE ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n" \
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                           \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                            \
  }
TSR_MMA16816(__half, "f16")
TSR_MMA16816(__nv_bfloat16, "bf16")
#undef TSR_MMA16816
/* Four 8x8 matrices of 16-bit elements from shared memory, transposed (B fragments of a row-major tile):
   lane 8i + r passes the 16-byte-aligned address of row r of matrix i; r[i] is this lane's part of matrix i. */
template <typename T> __device__ __forceinline__ void tsr_ldmatrix_x4_trans(unsigned* r, const T* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
