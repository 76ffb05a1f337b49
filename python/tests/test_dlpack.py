"""Tensors through DLPack: inputs read in place from any `__dlpack__` producer, outputs written into the caller's
tensors with `out=`, bit for bit what the NumPy path gives; refusals that say why. NumPy's own DLPack export
stands in for other frameworks on the host (the test venv has no torch); with torch installed, torch tensors
are run too, and on a machine with a GPU and $TESSERA_GPU_ARTIFACT (a GPU artifact), GPU tensors in and out.

scripts/test-python.sh sets $TESSERA_ZOO (see test_runtime.py).
"""

import os
import re
from pathlib import Path

import numpy as np
import pytest

import tessera


def artifact(name):
    value = os.environ.get("TESSERA_ZOO")
    assert value, "$TESSERA_ZOO is not set (scripts/test-python.sh sets it)"
    return Path(value) / f"{name}.tsr"


class Producer:
    """A DLPack producer that is not a NumPy array: what a torch, CuPy or JAX tensor looks like to tessera."""

    def __init__(self, array):
        self.array = array
        self.exported = 0

    def __dlpack__(self, **kwargs):
        self.exported += 1
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def random_inputs(m, seed):
    rng = np.random.default_rng(seed)
    inputs = {}
    for name, dtype, shape in m.inputs:
        if dtype == "float32":
            inputs[name] = rng.standard_normal(shape).astype(np.float32)
        else:
            inputs[name] = rng.integers(0, 2, size=shape).astype(dtype)
    return inputs


@pytest.mark.parametrize("name", ["mlp3-b8", "bert-tiny-b1-s128"])
def test_dlpack_inputs_and_outputs_match_numpy(name):
    m = tessera.load(str(artifact(name)))
    inputs = random_inputs(m, 3)
    want = m.run(inputs)
    wrapped = {k: Producer(v) for k, v in inputs.items()}
    got = m.run(wrapped)
    assert all(p.exported == 1 for p in wrapped.values()), "each input exported once"
    for k in want:
        assert got[k].tobytes() == want[k].tobytes(), k
    # out=: the outputs are written into the caller's tensors, which come back as they were given.
    out = {k: np.full(v.shape, np.nan, v.dtype) for k, v in want.items()}
    returned = m.run(wrapped, out={k: Producer(v) for k, v in out.items()})
    assert list(returned) == list(out)
    for k in want:
        assert out[k].tobytes() == want[k].tobytes(), f"{k} written in place"
    # NumPy arrays are DLPack producers too: out= takes them directly.
    out2 = {k: np.zeros(v.shape, v.dtype) for k, v in want.items()}
    assert m.run(inputs, out=out2) is not None
    for k in want:
        assert out2[k].tobytes() == want[k].tobytes(), k


def test_dlpack_refusals_say_why():
    m = tessera.load(str(artifact("mlp3-b8")))
    (name, dtype, shape), = m.inputs
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    strided = np.repeat(x, 2, axis=-1)[..., ::2]
    with pytest.raises(tessera.Error, match=re.escape(f"input '{name}' is not C-contiguous")):
        m.run({name: Producer(strided)})
    with pytest.raises(tessera.Error, match=re.escape(f"input '{name}': DLPack dtype (code 2, 64 bits, 1 lanes) is not one")):
        m.run({name: Producer(x.astype(np.float64))})
    (out_name, _, out_shape), = m.outputs
    with pytest.raises(tessera.Error, match=re.escape(f"out['{out_name}'] must be a DLPack tensor")):
        m.run({name: x}, out={out_name: [0.0]})
    # A wrong shape is the runtime's usual error, naming the output.
    with pytest.raises(tessera.Error, match=re.escape(f"'{out_name}'")):
        m.run({name: x}, out={out_name: np.zeros((1,), np.float32)})
    with pytest.raises(tessera.Error, match=re.escape("stream= is for GPU tensors")):
        m.run({name: x}, stream=12345)
    m.run({name: x})  # still usable


def test_torch_tensors_on_the_host():
    torch = pytest.importorskip("torch")
    m = tessera.load(str(artifact("mlp3-b8")))
    inputs = random_inputs(m, 4)
    want = m.run(inputs)
    got = m.run({k: torch.from_numpy(v) for k, v in inputs.items()})
    out = {k: torch.empty(v.shape, dtype=torch.float32) for k, v in want.items()}
    m.run({k: torch.from_numpy(v) for k, v in inputs.items()}, out=out)
    for k in want:
        assert got[k].tobytes() == want[k].tobytes()
        assert out[k].numpy().tobytes() == want[k].tobytes()


def test_torch_tensors_on_the_gpu():
    """GPU tensors in, GPU tensors out, no host copy: the run reads and writes torch's device memory."""
    torch = pytest.importorskip("torch")
    path = os.environ.get("TESSERA_GPU_ARTIFACT")
    if not path or not torch.cuda.is_available():
        pytest.skip("needs a GPU, torch with CUDA and $TESSERA_GPU_ARTIFACT (a GPU artifact)")
    m = tessera.load(path)
    inputs = random_inputs(m, 5)
    want = m.run(inputs)  # host tensors: the runtime copies them in and out
    dev = {k: torch.from_numpy(v).cuda() for k, v in inputs.items()}
    out = {k: torch.empty(v.shape, dtype=torch.float32, device="cuda") for k, v in want.items()}
    # Written on torch's stream just before the run: the run waits for it.
    dev = {k: v * 1 for k, v in dev.items()}
    returned = m.run(dev, out=out)
    assert set(returned) == set(out)
    for k in want:
        assert out[k].is_cuda
        assert out[k].cpu().numpy().tobytes() == want[k].tobytes(), k
    # On torch's stream, asynchronously: inputs written, the run, and a read of the outputs all enqueued on one
    # stream with no synchronization between them; only the end waits.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        dev2 = {k: v * 1 for k, v in dev.items()}
        out2 = {k: torch.zeros_like(v) for k, v in out.items()}
        m.run(dev2, out=out2, stream=s.cuda_stream)
        read = {k: v * 1 for k, v in out2.items()}
    s.synchronize()
    for k in want:
        assert read[k].cpu().numpy().tobytes() == want[k].tobytes(), f"{k} on the caller's stream"
    with pytest.raises(tessera.Error, match="tessera allocates no device memory"):
        m.run(dev)
    host_in = {**dev, next(iter(dev)): torch.from_numpy(next(iter(inputs.values())))}
    with pytest.raises(tessera.Error, match="on one side"):
        m.run(host_in, out=out)
