extern "C" __global__ void __launch_bounds__(256) k_718db9ae7dc5e023b057_k12_15(const float* __restrict__ p0, const float* __restrict__ p1, const float* __restrict__ p2, float* __restrict__ p3) {
    __shared__ float As[16][32];
    __shared__ float Bs[576];
    const unsigned z = blockIdx.z / 1u, slice = blockIdx.z % 1u;
    const int m0 = blockIdx.y * 32, n0 = blockIdx.x * 32;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const unsigned zb0 = z;
    const unsigned abase = 0u;
    const unsigned bbase = 0u;
    float acc[2][2];
    #pragma unroll
    for (int a = 0; a < 2; a++)
    #pragma unroll
    for (int c = 0; c < 2; c++) acc[a][c] = 0.0f;
    const int kbeg = slice * 768, kend = min(768, kbeg + 768);
    for (int k0 = kbeg; k0 < kend; k0 += 16) {
        #pragma unroll
        for (int j = 0; j < 2; j++) {
            const int e = threadIdx.x + j * 256;
            const int kk = e % 16, mm = e / 16;
            const int m = m0 + mm, k = k0 + kk;
            As[kk][mm] = (m < 128 && k < kend) ? (p0[abase + m * 768u + k]) : 0.0f;
        }
        #pragma unroll
        for (int j = 0; j < 2; j++) {
            const int e = threadIdx.x + j * 256;
            const int nn = e % 32, kk = e / 32;
            const int n = n0 + nn, k = k0 + kk;
            Bs[kk * 36 + nn] = (n < 3072 && k < kend) ? (p1[bbase + k * 3072u + n]) : 0.0f;
        }
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < 16; kk++) {
            float ra[2], rb[2];
            #pragma unroll
            for (int a = 0; a < 2; a++) ra[a] = As[kk][ty * 2 + a];
            #pragma unroll
            for (int c = 0; c < 2; c++) rb[c] = Bs[kk * 36 + tx * 2 + c];
            #pragma unroll
            for (int a = 0; a < 2; a++)
            #pragma unroll
            for (int c = 0; c < 2; c++) acc[a][c] = fmaf(ra[a], rb[c], acc[a][c]);
        }
        __syncthreads();
    }
    #pragma unroll
    for (int a = 0; a < 2; a++) {
        #pragma unroll
        for (int c = 0; c < 2; c++) {
            const int m = m0 + ty * 2 + a, n = n0 + tx * 2 + c;
            if (m < 128 && n < 3072) {
                const unsigned f = z * 393216u + m * 3072u + n;
                const unsigned c1 = (f % 3072u);
                const unsigned o0 = c1;
                const float x14 = p2[o0];
                const float v175 = acc[a][c];
                const float v176 = (v175 + x14);
                const float v177 = tsr_gelu_erf(v176);
                p3[f] = v177;
            }
        }
    }
}
