/* tessera cuda backend: the depthwise convolution's main loop (gemm.rs's conv_depthwise writes the kernels
 * that call it; other convolutions run as an implicit GEMM, gemm.cuh).
 *
 * A depthwise 2-D convolution (one input channel per output channel: MobileNet's and ConvNeXt's 3x3 to 7x7
 * layers): a thread computes ROW adjacent outputs of one output row `oy` and channel, columns ow0.., loading,
 * per kernel row, the input window they share once into registers ((ROW - 1) SW + (KW - 1) DW + 1 values)
 * and reusing every value for each output and tap it meets. (One output per thread loaded KH KW inputs per
 * output and recomputed each tap's coordinates: ConvNeXt-T's 7x7 layers took 15-37 us each.) The taps
 * accumulate kernel rows, then columns, in fp32. From the kernel, as lambdas:
 *   x(ih, iw)   the input at row ih, column iw of the channel's plane (both inside it), as float;
 *   w(tap)      the channel's weight of tap ky KW + kx, as float;
 *   out(o, v)   the epilogue of output column ow0 + o with accumulated value v (columns past OW are skipped). */
namespace tsr_conv {

template <int H, int W, int OW, int KH, int KW, int SH, int SW, int DH, int DW, int PH, int PW, int ROW, class X, class Wt, class Out>
__device__ __forceinline__ void depthwise_row(int oy, int ow0, X&& x, Wt&& w, Out&& out) {
  constexpr int WIN = (ROW - 1) * SW + (KW - 1) * DW + 1;
  float acc[ROW];
#pragma unroll
  for (int o = 0; o < ROW; o++) acc[o] = 0.0f;
#pragma unroll
  for (int ky = 0; ky < KH; ky++) {
    const int ih = oy * SH - PH + ky * DH;
    if ((unsigned)ih >= (unsigned)H) continue;
    float win[WIN];
#pragma unroll
    for (int j = 0; j < WIN; j++) {
      const int iw = ow0 * SW - PW + j;
      win[j] = (unsigned)iw < (unsigned)W ? x(ih, iw) : 0.0f;
    }
#pragma unroll
    for (int kx = 0; kx < KW; kx++) {
      const float wv = w(ky * KW + kx);
#pragma unroll
      for (int o = 0; o < ROW; o++) acc[o] = fmaf(win[o * SW + kx * DW], wv, acc[o]);
    }
  }
#pragma unroll
  for (int o = 0; o < ROW; o++) {
    if (ow0 + o >= OW) break;
    out(o, acc[o]);
  }
}

}  // namespace tsr_conv
