/* tessera cuda backend: the GEMM main loops (see gemm.rs). */
