// tessera's cutlass prelude for the Hopper family, added to a module that instantiates it: CUTLASS 3.x's
// warp-specialized GEMM kernel (`KernelCpAsyncWarpSpecialized`: cp.async producers, a wgmma consumer
// warpgroup), with an epilogue computing D = act(acc + C) element by element from the accumulators.
//
// As in `tessera::gemm`, the kernel's parameters are built on the device from the launch's four pointers: the
// mainloop's and the epilogue's parameters are pointers and strides (CUTLASS's own `to_underlying_arguments`
// for them is the identity). Problem (M, N, K, batch) is cute's (M, N, K, L); A is M x K row-major, B is
// K x N row-major (N-major for wgmma), D is M x N row-major; C is the epilogue's source: null for none, a
// bias row (LdC = 0, StrideC = 0) or a residual of D's shape (LdC = N). The grid is (M tiles, N tiles,
// batch): this kernel is not persistent, each threadblock computes one tile.
#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/epilogue/collective/default_epilogue.hpp>
#include <cutlass/epilogue/collective/detail.hpp>

namespace tessera {

// The epilogue's operation on one element: act(acc + c), or act(acc) where no C is read.
template <template <typename> class Act, typename T>
struct ActEpilogue {
  using ElementOutput = T;
  using ElementD = T;
  using ElementC = T;
  using ElementAccumulator = float;
  using ElementCompute = float;
  static constexpr int kCount = 1;
  struct Params {
    float beta;
  };
  float beta;
  CUTLASS_HOST_DEVICE explicit ActEpilogue(Params const& p) : beta(p.beta) {}
  CUTLASS_HOST_DEVICE bool is_source_needed() const { return beta != 0.0f; }
  CUTLASS_HOST_DEVICE T operator()(float acc, T c) const { return T(Act<float>{}(acc + float(c))); }
  CUTLASS_HOST_DEVICE T operator()(float acc) const { return T(Act<float>{}(acc)); }
};

using RowStride = cute::Stride<int64_t, cute::Int<1>, int64_t>;

// CUTLASS's register epilogue, adapted to the warp-specialized kernels' pipeline interface.
template <template <typename> class Act, typename T>
using Sm90Epilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
    cutlass::epilogue::collective::DefaultEpilogue<T, RowStride, RowStride, ActEpilogue<Act, T>, cutlass::gemm::EpilogueDefault>>;

template <typename Kernel, int M, int N, int K, int Batch, long long StrideA, long long StrideB, int LdC, long long StrideC>
__device__ __forceinline__ void gemm_sm90(void const* a, void const* b, void const* c, void* d) {
  using EA = typename Kernel::ElementA;
  using EB = typename Kernel::ElementB;
  using EC = typename Kernel::ElementC;
  using ED = typename Kernel::ElementD;
  extern __shared__ __align__(128) char smem[];
  typename Kernel::Params params{
      cutlass::gemm::GemmUniversalMode::kBatched,
      {M, N, K, Batch},
      {static_cast<EA const*>(a), {int64_t(K), cute::Int<1>{}, int64_t(StrideA)},
       static_cast<EB const*>(b), {cute::Int<1>{}, int64_t(N), int64_t(StrideB)}},
      {{c ? 1.0f : 0.0f}, static_cast<EC const*>(c), {int64_t(LdC), cute::Int<1>{}, int64_t(StrideC)},
       static_cast<ED*>(d), {int64_t(N), cute::Int<1>{}, int64_t(M) * N}}};
  Kernel{}(params, smem);
}

}  // namespace tessera
