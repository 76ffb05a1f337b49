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
