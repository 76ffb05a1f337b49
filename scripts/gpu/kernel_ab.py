#!/usr/bin/env python3
"""Times variants of single CUDA kernels on the GPU, alternated, from cubins compiled elsewhere.

Usage (on the GPU machine): python3 scripts/gpu/kernel_ab.py DIR [ROUNDS] > out.txt

DIR holds the cubins and spec.json, a list of {variant, shape, cubin, fn, grid, block, bufs}: bufs are the
kernel's float buffer parameters, in order, by element count, filled with uniform random values in [-1, 1)
(never zeros) and passed as pointers. For each shape, every variant is launched 20 times untimed, then the
variants take turns in ROUNDS rounds (default 7) of 50 launches each, every launch between two CUDA events;
a variant's figure is the median over all its launches. The alternation spreads clock and thermal drift over
all variants alike. Only the driver API (libcuda, through ctypes) and numpy are used: no toolkit is needed on
the machine that times, so the cubins can come from NVRTC on the build machine.
"""
import ctypes
import json
import os
import statistics
import sys

import numpy as np

cuda = ctypes.CDLL("libcuda.so.1")


def check(rc, what):
    if rc != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"{what}: {name.value.decode() if name.value else rc}")


def main():
    d = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    spec = json.load(open(os.path.join(d, "spec.json")))
    check(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    name = ctypes.create_string_buffer(256)
    cuda.cuDeviceGetName(name, 256, dev)
    ctx = ctypes.c_void_p()
    check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    print(f"device: {name.value.decode()}")
    rng = np.random.default_rng(7)
    kernels = []
    for k in spec:
        data = open(os.path.join(d, k["cubin"]), "rb").read()
        mod = ctypes.c_void_p()
        check(cuda.cuModuleLoadData(ctypes.byref(mod), data), f"load {k['cubin']}")
        fn = ctypes.c_void_p()
        check(cuda.cuModuleGetFunction(ctypes.byref(fn), mod, k["fn"].encode()), f"function {k['fn']}")
        ptrs = []
        for n in k["bufs"]:
            p = ctypes.c_uint64()
            check(cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(4 * n)), "cuMemAlloc")
            host = rng.uniform(-1.0, 1.0, n).astype(np.float32)
            check(cuda.cuMemcpyHtoD_v2(p, host.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(4 * n)), "cuMemcpyHtoD")
            ptrs.append(p)
        params = (ctypes.c_void_p * len(ptrs))(*[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in ptrs])
        kernels.append(dict(k, f=fn, params=params, ptrs=ptrs, times=[]))
    start, stop = ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cuEventCreate(ctypes.byref(start), 0), "cuEventCreate")
    check(cuda.cuEventCreate(ctypes.byref(stop), 0), "cuEventCreate")

    def launch(k):
        g, b = k["grid"], k["block"]
        check(cuda.cuLaunchKernel(k["f"], g[0], g[1], g[2], b[0], b[1], b[2], 0, None, k["params"], None), f"launch {k['cubin']}")

    def timed(k):
        cuda.cuEventRecord(start, None)
        launch(k)
        cuda.cuEventRecord(stop, None)
        check(cuda.cuEventSynchronize(stop), "cuEventSynchronize")
        ms = ctypes.c_float()
        cuda.cuEventElapsedTime(ctypes.byref(ms), start, stop)
        return ms.value * 1000.0

    shapes = sorted({k["shape"] for k in kernels}, key=[k["shape"] for k in kernels].index)
    for shape in shapes:
        group = [k for k in kernels if k["shape"] == shape]
        for k in group:
            for _ in range(20):
                launch(k)
        check(cuda.cuCtxSynchronize(), "warm-up")
        for _ in range(rounds):
            for k in group:
                k["times"].extend(timed(k) for _ in range(50))
        first = statistics.median(group[0]["times"])
        for k in group:
            med = statistics.median(k["times"])
            q = statistics.quantiles(k["times"], n=10)
            print(f"{shape:14} {k['variant']:16} median {med:8.2f} us  p10 {q[0]:8.2f}  p90 {q[-1]:8.2f}  vs {group[0]['variant']} {med / first:.3f}")


if __name__ == "__main__":
    main()
