// tessera's cutlass prelude: the one GEMM template every kernel of a `cutlass` module instantiates.
//
// A kernel is `D[b] = act(A[b] B[b] + C[b])` for a fixed problem (M, N, K, batch) in row-major layouts,
// run by CUTLASS's kernel-level `GemmBatched` (the sm80 multistage mainloop: cp.async, mma.sync on tensor
// cores for fp16 and bf16, SIMT for fp32). The device-level wrapper (`cutlass::gemm::device::GemmBatched<...>`) is
// used only as the type that names the kernel; its host code never runs. The kernel's parameters are built
// here, on the device, from the four pointers the launch passes (tessera's cubin launches pass pointers
// only): the constructor is CUTLASS_HOST_DEVICE and its work (a few integer divisions) is negligible next
// to one K step.
//
// C is the epilogue's source: null for none, a bias row (LdC = 0, StrideC = 0: every row reads the same N
// values), or a residual of D's shape (LdC = N). CUTLASS skips reading it when beta is 0.
#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_batched.h>
#include <cutlass/epilogue/thread/linear_combination_generic.h>
#include <cutlass/epilogue/thread/activation.h>

namespace tessera {

template <typename Gemm, int M, int N, int K, int Batch, long long StrideA, long long StrideB, int LdC, long long StrideC>
__device__ __forceinline__ void gemm(void const* a, void const* b, void const* c, void* d) {
  using Kernel = typename Gemm::GemmKernel;
  using Tile = typename Kernel::Mma::Shape;
  using EA = typename Gemm::ElementA;
  using EB = typename Gemm::ElementB;
  using EC = typename Gemm::ElementC;
  extern __shared__ __align__(16) unsigned char smem[];
  cutlass::gemm::GemmCoord problem(M, N, K);
  cutlass::gemm::GemmCoord tiles((M + Tile::kM - 1) / Tile::kM, (N + Tile::kN - 1) / Tile::kN, Batch);
  typename Kernel::Params params(
      problem, tiles,
      {const_cast<EA*>(static_cast<EA const*>(a)), cutlass::layout::RowMajor(K)}, StrideA,
      {const_cast<EB*>(static_cast<EB const*>(b)), cutlass::layout::RowMajor(N)}, StrideB,
      {const_cast<EC*>(static_cast<EC const*>(c)), cutlass::layout::RowMajor(LdC)}, StrideC,
      {static_cast<EC*>(d), cutlass::layout::RowMajor(N)}, static_cast<long long>(M) * N,
      {1.0f, c ? 1.0f : 0.0f}, Batch);
  Kernel{}(params, *reinterpret_cast<typename Kernel::SharedStorage*>(smem));
}

}  // namespace tessera
