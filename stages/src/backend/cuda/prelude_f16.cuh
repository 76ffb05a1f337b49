#include <cuda_fp16.h>
#include <mma.h>
/* Asynchronous 16-byte global-to-shared copy (sm_80+): `bytes` of the 16 are read, the rest zero-filled,
   so an out-of-range group costs no branch. */
__device__ __forceinline__ void tsr_cp16(void* dst, const void* src, unsigned bytes) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tsr_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void tsr_cp_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }
/* Two halves as one 32-bit register, `lo` in the low 16 bits (the element of lower index in an .f16x2). */
__device__ __forceinline__ unsigned tsr_pack_half2(__half lo, __half hi) {
  return (unsigned)__half_as_ushort(lo) | ((unsigned)__half_as_ushort(hi) << 16);
}
__device__ __forceinline__ unsigned tsr_pack_float2(float lo, float hi) {
  return tsr_pack_half2(__float2half_rn(lo), __float2half_rn(hi));
}
/* d = a b + d on tensor cores: m16n8k16, fp16 inputs, fp32 accumulators, the PTX ISA's fragment layouts
   (a: 4 registers of row-major A, b: 2 of column-major B, d: rows lane/4 and lane/4 + 8). */
__device__ __forceinline__ void tsr_mma16816(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* Four 8x8 fp16 matrices from shared memory, transposed (B fragments of a row-major tile): lane 8i + r
   passes the 16-byte-aligned address of row r of matrix i; r[i] is this lane's part of matrix i. */
__device__ __forceinline__ void tsr_ldmatrix_x4_trans(unsigned* r, const __half* p) {
  const unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a) : "memory");
}
