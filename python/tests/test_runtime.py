"""The Python API on zoo artifacts, against `tessera run` (the CLI binary) on the same inputs, bit for bit.

scripts/test-python.sh builds the wheel, installs it into a clean virtual environment, compiles
python/tests/zoo.toml into $TESSERA_ZOO and sets $TESSERA_BIN to the tessera binary; both are required (a missing one fails, it does not skip).
"""

import json
import os
import re
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

import tessera

MODELS = ["mlp3-b8", "bert-tiny-b1-s128", "mobilenetv2-b1"]


def env_path(var):
    value = os.environ.get(var)
    assert value, f"${var} is not set (scripts/test-python.sh sets it)"
    return Path(value)


def artifact(name):
    return env_path("TESSERA_ZOO") / f"{name}.tsr"


def tessera_run(path, out_dir, seed=0, inputs=None):
    """Runs `tessera run` and returns ({input name: array}, {output name: array}) from the files it lists."""
    args = [str(env_path("TESSERA_BIN")), "run", str(path), "--seed", str(seed), "--out", str(out_dir)]
    for name, file in (inputs or {}).items():
        args += ["--input", f"{name}={file}"]
    text = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    ins, outs = {}, {}
    for kind, name, file in re.findall(r"^\s*(input|output)\s+(\S+) \S+ .*-> (\S+)$", text, re.M):
        (ins if kind == "input" else outs)[name] = np.load(file)
    return ins, outs


def assert_same_bits(got, want):
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        assert got[name].shape == want[name].shape, name
        assert got[name].tobytes() == want[name].tobytes(), f"output {name} differs"


@pytest.mark.parametrize("name", MODELS)
def test_matches_tessera_run(name, tmp_path):
    m = tessera.load(str(artifact(name)))
    assert m.name == name
    inputs, want = tessera_run(artifact(name), tmp_path, seed=5)
    assert [i[0] for i in m.inputs] == list(inputs)
    for n, dtype, shape in m.inputs:
        assert inputs[n].dtype == np.dtype(dtype) and inputs[n].shape == tuple(shape)
    assert [o[0] for o in m.outputs] == list(want)
    got = m.run(inputs)
    assert_same_bits(got, want)
    # Outputs own their memory: a later run on other inputs leaves them as they were.
    other, _ = tessera_run(artifact(name), tmp_path / "other", seed=6)
    m.run(other)
    assert_same_bits(got, want)


def test_from_bytes_and_non_contiguous_inputs(tmp_path):
    path = artifact("bert-tiny-b1-s128")
    m = tessera.Model.from_bytes(path.read_bytes())
    inputs, want = tessera_run(path, tmp_path, seed=6)
    # A strided view of the same values: copied to contiguous memory first, same results.
    strided = {k: np.repeat(v, 2, axis=-1)[..., ::2] for k, v in inputs.items()}
    assert not any(v.flags.c_contiguous for v in strided.values())
    assert_same_bits(m.run(strided), want)


def test_threads_match_serial_runs():
    m = tessera.load(str(artifact("mobilenetv2-b1")))
    (name, dtype, shape), = m.inputs
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype(dtype) for _ in range(8)]
    serial = [m.run({name: x}) for x in inputs]
    results = [None] * len(inputs)

    def work(t):
        for i in range(t, len(inputs), 4):
            results[i] = m.run({name: inputs[i]})

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, serial):
        assert_same_bits(got, want)


def test_bad_inputs_raise_errors_naming_them():
    m = tessera.load(str(artifact("bert-tiny-b1-s128")))
    ids = np.zeros((1, 128), np.int64)
    good = {"input_ids": ids, "attention_mask": np.ones((1, 128), np.int64)}
    assert set(good) == {i[0] for i in m.inputs}
    cases = [
        ({**good, "nope": ids}, "no input 'nope'"),
        ({"input_ids": ids}, "missing input 'attention_mask'"),
        ({**good, "input_ids": ids.astype(np.int32)}, "input 'input_ids' must be i64[1x128], got i32[1x128]"),
        ({**good, "input_ids": np.zeros((1, 64), np.int64)}, "input 'input_ids' must be i64[1x128], got i64[1x64]"),
        ({**good, "input_ids": ids.astype(np.float64)}, "input 'input_ids': NumPy dtype float64"),
        ({**good, "input_ids": [0] * 128}, "input 'input_ids' must be a NumPy array"),
    ]
    for given, message in cases:
        with pytest.raises(tessera.Error, match=re.escape(message)):
            m.run(given)
    m.run(good)  # still usable


def test_bad_artifacts_raise_errors_naming_the_file(tmp_path):
    data = artifact("mlp3-b8").read_bytes()
    truncated = tmp_path / "truncated.tsr"
    truncated.write_bytes(data[:-10])
    with pytest.raises(tessera.Error, match=r"truncated\.tsr.*truncated or padded"):
        tessera.load(str(truncated))
    tampered = tmp_path / "tampered.tsr"
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 1
    tampered.write_bytes(bytes(flipped))
    with pytest.raises(tessera.Error, match=r"tampered\.tsr.*digest mismatch"):
        tessera.load(str(tampered))
    with pytest.raises(tessera.Error, match=r"missing\.tsr.*cannot read"):
        tessera.load(str(tmp_path / "missing.tsr"))


def test_provenance_is_what_tessera_inspect_prints():
    path = artifact("mlp3-b8")
    p = tessera.load(str(path)).provenance
    args = [str(env_path("TESSERA_BIN")), "inspect", str(path), "--json"]
    inspected = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    assert p == inspected["provenance"]
    assert p["source"]["kind"] == "fixture" and p["source"]["name"] == "fixture:mlp3:b8"
    assert re.fullmatch(r"[0-9a-f]{64}", p["source"]["digest"])
    assert p["costs"] == "analytical" and p["precision"] == "fp32" and len(p["targets"]) == 2
    assert p["tessera_version"] == tessera.__version__
    # The payload alone (as the linker wrote it: no provenance section, flags 0) records none.
    data = path.read_bytes()
    body_len, data_len = int.from_bytes(data[16:24], "little"), int.from_bytes(data[24:32], "little")
    payload_len = (64 + body_len + 63) // 64 * 64 + data_len
    payload = data[:12] + bytes(4) + data[16:payload_len]
    assert tessera.Model.from_bytes(payload).provenance is None


def test_host_models_are_on_no_gpu_and_refuse_a_gpu_index():
    path = artifact("mlp3-b8")
    m = tessera.load(str(path))
    assert m.gpu is None
    assert tessera.Model.from_bytes(path.read_bytes()).gpu is None
    assert tessera.load(str(path), gpu=None).gpu is None
    # A GPU index asks for a GPU artifact: a host one is refused by name, before anything loads.
    message = "model 'mlp3-b8' runs on the host; it cannot be placed on GPU 1"
    with pytest.raises(tessera.Error, match=r"mlp3-b8\.tsr.*" + re.escape(message)):
        tessera.load(str(path), gpu=1)
    with pytest.raises(tessera.Error, match=re.escape("<memory>") + ".*" + re.escape(message)):
        tessera.Model.from_bytes(path.read_bytes(), gpu=1)
    with pytest.raises(tessera.Error, match=re.escape("gpu=-1: a GPU index")):
        tessera.load(str(path), gpu=-1)


def test_gpu_models_run_on_the_gpu_they_are_loaded_on():
    """On a machine with two GPUs, torch with CUDA and $TESSERA_GPU_ARTIFACT (a GPU artifact): the model loaded
    on GPU 1 runs there, on torch tensors of cuda:1, as it runs on GPU 0, from any thread; tensors of another GPU
    are refused naming both."""
    torch = pytest.importorskip("torch")
    path = os.environ.get("TESSERA_GPU_ARTIFACT")
    if not path or not torch.cuda.is_available():
        pytest.skip("needs a GPU, torch with CUDA and $TESSERA_GPU_ARTIFACT (a GPU artifact)")
    assert tessera.load(path).gpu == 0
    with pytest.raises(tessera.Error, match="no GPU 99"):
        tessera.load(path, gpu=99)
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    try:
        m = tessera.load(path, gpu=1)
        assert m.gpu == 1 and tessera.Model.from_bytes(Path(path).read_bytes(), gpu=1).gpu == 1
        rng = np.random.default_rng(3)
        inputs = {n: rng.standard_normal(shape).astype(dtype) for n, dtype, shape in m.inputs}
        want = tessera.load(path).run(inputs)
        assert_same_bits(m.run(inputs), want)
        dev = {k: torch.from_numpy(v).to("cuda:1") for k, v in inputs.items()}

        def run_on_gpu1():
            out = {k: torch.zeros(v.shape, dtype=torch.float32, device="cuda:1") for k, v in want.items()}
            m.run(dev, out=out)
            for k in want:
                assert out[k].device.index == 1 and out[k].cpu().numpy().tobytes() == want[k].tobytes(), k

        run_on_gpu1()
        # A thread whose current device is torch's default (GPU 0): the run makes the model's GPU current.
        errors = []
        t = threading.Thread(target=lambda: _collect(errors, run_on_gpu1))
        t.start()
        t.join()
        assert not errors, errors
        out = {k: torch.empty(v.shape, dtype=torch.float32, device="cuda:1") for k, v in want.items()}
        with pytest.raises(tessera.Error, match=r"input '.*' is on GPU 0, but model '.*' runs on GPU 1"):
            m.run({k: v.to("cuda:0") for k, v in dev.items()}, out=out)
        with pytest.raises(tessera.Error, match=r"out\['.*'\] is on GPU 0, but model '.*' runs on GPU 1"):
            m.run(dev, out={k: v.to("cuda:0") for k, v in out.items()})
        # Loads and runs give the caller its current device back.
        assert torch.cuda.current_device() == 0
    finally:
        torch.cuda.set_device(0)


def _collect(errors, f):
    try:
        f()
    except Exception as e:  # noqa: BLE001 (reported by the test's thread)
        errors.append(e)
