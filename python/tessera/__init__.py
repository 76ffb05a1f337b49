"""Run tessera artifacts (.tsr) from Python, and compile models into them.

    import tessera
    m = tessera.load("out/bert-tiny-b1-s128.tsr")     # digest checked before any code loads
    m.inputs                                           # [("input_ids", "int64", (1, 128)), ...]
    m.provenance                                       # {"tessera_version": ..., "source": {...}, "targets": [...], ...}
    out = m.run({"input_ids": ids, "attention_mask": mask})   # {"last_hidden_state": ndarray, ...}

    paths = tessera.compile("model.onnx", "out", targets=["cpu"], costs="analytical")
    # {"model": "out/model.tsr"}: what `tessera compile model.onnx -t cpu --costs analytical --out out` builds

A GPU artifact loads on GPU 0, or on the GPU `tessera.load(path, gpu=1)` names (a CUDA device index, as torch's
`cuda:1`; `m.gpu` says which, None for a host model), and runs there, DLPack tensors in and out on that GPU.

Inputs are NumPy arrays of each input's exact dtype and shape (C-contiguous ones are read in place, others
copied once); outputs are new arrays that own the memory the run wrote (no copy after the run). The GIL is
released while the model runs and while compiling, so threads sharing one model run in parallel. Errors raise
tessera.Error with a message naming the file, model, input or output at fault.

`compile` exists when the extension was built with its `compiler` feature (the default), and so does the
`tessera` command the wheel installs (tessera/_cli.py): the `tessera` binary's command line, run by the extension.
"""

from ._tessera import Error, Model, load, __version__

__all__ = ["Error", "Model", "load", "__version__"]

try:
    from ._tessera import compile  # noqa: F401  (absent in a runtime-only build)

    __all__.append("compile")
except ImportError:
    pass
