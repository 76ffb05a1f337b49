# Builds cubins of GEMM kernel variants (sm_90, NVRTC 13 here) and a spec for scripts/gpu/kernel_ab.py.
import ctypes, json, os, re, sys
root='/work/nvvenv/lib/python3.11/site-packages/nvidia/cu13'
nv=ctypes.CDLL(root+'/lib/libnvrtc.so.13')
G=open('/work/main/stages/src/backend/cuda/gemm.cuh').read()
pre=open('/work/main/stages/src/backend/cuda/prelude.cuh').read().replace('#include "scalar.h"\n', open('/work/main/stages/src/backend/c/scalar.h').read())
OUT=sys.argv[1]; os.makedirs(OUT, exist_ok=True)
def compile(src, name):
    prog=ctypes.c_void_p()
    assert nv.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"m.cu", 0, None, None)==0
    opts=[b"--gpu-architecture=sm_90", b"--std=c++17", b"-default-device", b"-diag-suppress=177", ("-I"+root+"/include").encode()]
    arr=(ctypes.c_char_p*len(opts))(*opts)
    r=nv.nvrtcCompileProgram(prog, len(opts), arr)
    n=ctypes.c_size_t(); nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n)); log=ctypes.create_string_buffer(n.value); nv.nvrtcGetProgramLog(prog, log)
    if r!=0: print(name, log.value.decode()[:3000]); sys.exit(1)
    nv.nvrtcGetCUBINSize(prog, ctypes.byref(n)); cub=ctypes.create_string_buffer(n.value); nv.nvrtcGetCUBIN(prog, cub)
    open(f'{OUT}/{name}.cubin','wb').write(cub.raw)

# Template variants.
V={}
V['cur']=G
V['prefetch_all']=G.replace('constexpr bool PREFETCH = TM * TN >= 16;','constexpr bool PREFETCH = true;')
V['prefetch_pin']=G.replace('constexpr bool PREFETCH = TM * TN >= 16;','constexpr bool PREFETCH = true;').replace('''    if (PREFETCH) fetch(k0 + BK);''','''    if (PREFETCH) {
      fetch(k0 + BK);
#pragma unroll
      for (int j = 0; j < (BM * BK + THREADS - 1) / THREADS; j++) asm volatile("" : "+f"(ra[j]));
#pragma unroll
      for (int j = 0; j < (BN * BK + THREADS - 1) / THREADS; j++) asm volatile("" : "+f"(rb[j]));
    }''')
V['direct']=G.replace('''    if (!PREFETCH) fetch(k0);
    commit();''','''    if (!PREFETCH) {
      each<BM * BK, THREADS>([&](int j, int e) {
        const int m = m0 + e / BK, k = k0 + e % BK;
        As[e % BK][e / BK] = (m < M && k < kend) ? a(m, k) : 0.0f;
      });
      each<BN * BK, THREADS>([&](int j, int e) {
        const int k = k0 + e / BN;
        Bs[(e / BN) * LDB + gnn] = (gn < N && k < kend) ? b_at(k) : 0.0f;
      });
    } else commit();''')
assert V['direct']!=G
V['ldsdb']=G.replace('''#pragma unroll
    for (int kk = 0; kk < BK; kk++) {
      float xa[TM], xb[TN];
#pragma unroll
      for (int i = 0; i < TM; i++) xa[i] = As[kk][ty * TM + i];
#pragma unroll
      for (int c = 0; c < TN; c++) xb[c] = Bs[kk * LDB + tx * TN + c];
#pragma unroll
      for (int i = 0; i < TM; i++)
#pragma unroll
        for (int c = 0; c < TN; c++) acc[i][c] = fmaf(xa[i], xb[c], acc[i][c]);
    }''','''    float xa[2][TM], xb[2][TN];
#pragma unroll
    for (int i = 0; i < TM; i++) xa[0][i] = As[0][ty * TM + i];
#pragma unroll
    for (int c = 0; c < TN; c++) xb[0][c] = Bs[tx * TN + c];
#pragma unroll
    for (int kk = 0; kk < BK; kk++) {
      if (kk + 1 < BK) {
#pragma unroll
        for (int i = 0; i < TM; i++) xa[(kk + 1) & 1][i] = As[kk + 1][ty * TM + i];
#pragma unroll
        for (int c = 0; c < TN; c++) xb[(kk + 1) & 1][c] = Bs[(kk + 1) * LDB + tx * TN + c];
      }
#pragma unroll
      for (int i = 0; i < TM; i++)
#pragma unroll
        for (int c = 0; c < TN; c++) acc[i][c] = fmaf(xa[kk & 1][i], xb[kk & 1][c], acc[i][c]);
    }''')
assert V['ldsdb']!=G

def kernel(name, N, gelu, lb='256', slices=1, K=768):
    NN=128*N
    epi = f'tsr_gelu_erf(v + p2[f % {N}u])' if gelu else f'(v + p2[f % {N}u])'
    if slices>1: epi=None
    return f'''extern "C" __global__ void __launch_bounds__({lb}) {name}(const float* __restrict__ p0, const float* __restrict__ p1, const float* __restrict__ p2, float* __restrict__ p3) {{
    const unsigned z = blockIdx.z / {slices}u, slice = blockIdx.z % {slices}u;
    auto a = [&](int m, int k) {{ return p0[m * {K}u + k]; }};
    auto b = [&](int n) {{ return [=](int k) {{ return p1[k * {N}u + n]; }}; }};
    auto index = [&](int m, int n) -> unsigned {{ return z * {NN}u + m * {N}u + n; }};
    auto out = [&](int m, int n, unsigned f, float v) {{ {'p3[f] = '+epi if epi else 'p3[slice * %du + f] = v' % NN}; }};
    tsr_gemm::simt<128, {N}, {K}, {K//slices}, 32, 32, 16, 2, 2>(slice, a, b, index, out);
}}
'''
base=open('/tmp/nv/base_kernel.cu').read()
def base_kernel(name, N, gelu):
    s=base.replace('k_718db9ae7dc5e023b057_k12_15', name).replace('3072', str(N)).replace('393216', str(128*N))
    if not gelu: s=s.replace('tsr_gelu_erf(v176)','v176')
    return s
spec=[]
VARS=[('cur','256'),('cur','256, 4'),('prefetch_all','256, 4'),('prefetch_all','256, 5'),('prefetch_all','256, 6'),('prefetch_all','256')]
shapes=[('ffn_gelu',3072,True,1,768),('qkv_bias',2304,False,1,768),('proj_split3',768,False,3,768),('down_split3',768,False,3,3072)]
for sh,N,gelu,sl,K in shapes:
    grid=[N//32,4,sl]
    bufs=[128*K,K*N,N,128*N*sl]
    if sl==1:
        src=pre+base_kernel('k_'+sh,N,gelu); compile(src, f'base__{sh}')
        spec.append(dict(variant='base',shape=sh,cubin=f'base__{sh}.cubin',fn='k_'+sh,grid=grid,block=[256,1,1],bufs=bufs))
    for v,lb in VARS:
        tag=v+('_lb'+lb.split(',')[1].strip() if ',' in lb else '')
        src=pre+V[v]+kernel('k_'+sh,N,gelu,lb,sl,K); compile(src, f'{tag}__{sh}')
        spec.append(dict(variant=tag,shape=sh,cubin=f'{tag}__{sh}.cubin',fn='k_'+sh,grid=grid,block=[256,1,1],bufs=bufs))
json.dump(spec, open(f'{OUT}/spec.json','w'), indent=1)
print(len(spec),'kernels')
