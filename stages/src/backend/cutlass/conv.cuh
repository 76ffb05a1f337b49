// tessera's cutlass convolution prelude: the conv2d forward template of modules with a channels-last
// convolution (`NhwcConv`), included after the GEMM prelude only where a kernel needs it (its headers add to
// every nvcc run that includes them).
//
// A kernel is `y = act(conv(x, w) + c)` for a fixed problem, in CUTLASS's tensor layouts: x NHWC, w KRSC
// (tessera's channels-last weight `[M, kh, kw, C]`), y NPQK. CUTLASS runs it as an implicit GEMM (`M = N*P*Q`,
// `N = K`, `K = R*S*C`) with the sm80 multistage mainloop and its optimized iterators. As for the GEMM
// template, the kernel's parameters are built on the device from the launch's pointers; every extent is a
// template constant, so the compiler folds the constructor's divisions away.
//
// C is the epilogue's source: null for none, a bias of K values (a layout of stride 0: every pixel reads the
// same K values), or a residual of y's shape.
#include <cutlass/conv/kernel/default_conv2d_fprop.h>
#include <cutlass/conv/conv2d_problem_size.h>

namespace tessera {

template <typename Kernel, int N, int H, int W, int C, int K, int R, int S, int P, int Q, int PadH, int PadW,
          int StrideH, int StrideW, int DilationH, int DilationW, bool Bias>
__device__ __forceinline__ void conv2d(void const* x, void const* w, void const* c, void* y) {
  using EA = typename Kernel::ElementA;
  using EB = typename Kernel::ElementB;
  using EC = typename Kernel::ElementC;
  using Layout = cutlass::layout::TensorNHWC;
  extern __shared__ __align__(16) unsigned char smem[];
  cutlass::conv::Conv2dProblemSize problem(N, H, W, C, K, R, S, P, Q, PadH, PadW, StrideH, StrideW, DilationH,
                                           DilationW, cutlass::conv::Mode::kCrossCorrelation, 1, 1);
  Layout out = Layout::packed({N, P, Q, K});
  typename Kernel::Arguments args(
      problem,
      {const_cast<EA*>(static_cast<EA const*>(x)), Layout::packed({N, H, W, C})},
      {const_cast<EB*>(static_cast<EB const*>(w)), Layout::packed({K, R, S, C})},
      {const_cast<EC*>(static_cast<EC const*>(c)), Bias ? Layout() : out},
      {static_cast<EC*>(y), out},
      {1.0f, c ? 1.0f : 0.0f});
  typename Kernel::Params params(args);
  Kernel{}(params, *reinterpret_cast<typename Kernel::SharedStorage*>(smem));
}

}  // namespace tessera
