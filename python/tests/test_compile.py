"""tessera.compile against the tessera CLI: the same inputs and options give the same artifact bytes, and the
artifact runs through tessera.load like any other, bit for bit with `tessera run`.

Needs $TESSERA_BIN and $TESSERA_ZOO (scripts/test-python.sh compiles python/tests/zoo.toml into it with
`-t cpu -t 'cpu -compiler=gemm' --costs analytical`).
"""

import re
import subprocess
from pathlib import Path

import pytest

import tessera
from test_runtime import assert_same_bits, env_path, tessera_run

REPO = Path(__file__).resolve().parents[2]
# A PyTorch export of a two-layer BERT (fixed shapes 1x8), small enough to compile in seconds.
ONNX = REPO / "stages" / "src" / "onnx" / "testdata" / "bert_tiny_opset17.onnx"
ZOO_TARGETS = ["cpu", "cpu -compiler=gemm"]


def cli_compile(inputs, out, store, targets, costs="analytical"):
    args = [str(env_path("TESSERA_BIN")), "compile", *map(str, inputs), "--store", str(store), "--out", str(out), "--costs", costs]
    for t in targets:
        args += ["--target", t]
    subprocess.run(args, check=True, capture_output=True, text=True)


def test_onnx_compiles_like_the_cli_and_runs(tmp_path):
    # Separate stores: the Python build computes every stage itself, nothing comes from the CLI's cache.
    got = tessera.compile(ONNX, tmp_path / "py", targets=["cpu"], store=tmp_path / "py-store", costs="analytical")
    assert got == {"bert_tiny_opset17": str(tmp_path / "py" / "bert_tiny_opset17.tsr")}
    cli_compile([ONNX], tmp_path / "cli", tmp_path / "cli-store", ["cpu"])
    py_artifact = Path(got["bert_tiny_opset17"])
    assert py_artifact.read_bytes() == (tmp_path / "cli" / "bert_tiny_opset17.tsr").read_bytes()

    m = tessera.load(py_artifact)
    assert [i[0] for i in m.inputs] == ["input_ids", "attention_mask"]
    inputs, want = tessera_run(tmp_path / "cli" / "bert_tiny_opset17.tsr", tmp_path / "run", seed=3)
    assert_same_bits(m.run(inputs), want)


def test_manifest_and_fixture_spec_match_the_cli_built_zoo(tmp_path):
    manifest = tmp_path / "zoo.toml"
    manifest.write_text('[[entry]]\nmodel = "mlp3"\nbatch = 8\n')
    got = tessera.compile([manifest, "fixture:mlp3:b2"], tmp_path / "out", targets=ZOO_TARGETS, store=tmp_path / "store", costs="analytical")
    assert list(got) == ["mlp3-b8", "mlp3-b2"]
    # scripts/test-python.sh built $TESSERA_ZOO/mlp3-b8.tsr with the CLI and these targets and costs.
    assert Path(got["mlp3-b8"]).read_bytes() == (env_path("TESSERA_ZOO") / "mlp3-b8.tsr").read_bytes()
    m = tessera.load(got["mlp3-b2"])
    assert m.inputs == [("input", "float32", [2, 784])]


def test_shapes_fix_symbolic_onnx_dimensions(tmp_path):
    # The same model with its (already fixed) shapes given again: accepted; a wrong one names the input.
    got = tessera.compile(str(ONNX), tmp_path / "out", targets=["cpu"], store=tmp_path / "store", costs="analytical", shapes={"input_ids": (1, 8), "attention_mask": [1, 8]})
    assert list(got) == ["bert_tiny_opset17"]
    with pytest.raises(tessera.Error, match=r"bert_tiny_opset17.*input_ids"):
        tessera.compile(ONNX, tmp_path / "out2", targets=["cpu"], store=tmp_path / "store", costs="analytical", shapes={"input_ids": (1, 9)})


def test_errors_name_what_is_at_fault(tmp_path):
    store = tmp_path / "store"
    missing = tmp_path / "no" / "such.onnx"
    with pytest.raises(tessera.Error, match=r"model such: load: .*no/such\.onnx: cannot read"):
        tessera.compile(missing, tmp_path / "out", targets=["cpu"], store=store, costs="analytical")
    # One model failing does not stop the others: their artifacts are written, the error lists the failure.
    with pytest.raises(tessera.Error, match=r"1 of 2 models failed to compile: .*no/such\.onnx"):
        tessera.compile([ONNX, missing], tmp_path / "out", targets=["cpu"], store=store, costs="analytical")
    assert (tmp_path / "out" / "bert_tiny_opset17.tsr").is_file()
    with pytest.raises(tessera.Error, match=re.escape("model.txt: expected an ONNX model (.onnx) or a zoo manifest (.toml)")):
        tessera.compile("model.txt", tmp_path / "out", targets=["cpu"], store=store)
    with pytest.raises(tessera.Error, match=r"'guessed' is not a cost mode"):
        tessera.compile(ONNX, tmp_path / "out", targets=["cpu"], store=store, costs="guessed")
    with pytest.raises(tessera.Error, match=r"tpu"):
        tessera.compile(ONNX, tmp_path / "out", targets=["tpu"], store=store, costs="analytical")
    # The GPUs that measure are checked before anything is built, with or without a GPU here.
    with pytest.raises(tessera.Error, match=r"--gpus: --gpus names GPU 1 twice"):
        tessera.compile(ONNX, tmp_path / "gpus", targets=["cpu"], store=store, gpus=[1, 0, 1])
    assert not (tmp_path / "gpus").exists()


def test_a_remote_is_taken_as_the_cli_takes_it(tmp_path, monkeypatch):
    # A remote that is down (a closed port) costs nothing and changes nothing: the same bytes as without one.
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    plain = tessera.compile(ONNX, tmp_path / "plain", targets=["cpu"], store=tmp_path / "s1", costs="analytical")
    down = tessera.compile(ONNX, tmp_path / "down", targets=["cpu"], store=tmp_path / "s2", costs="analytical", remote=f"redis://127.0.0.1:{port}")
    assert Path(plain["bert_tiny_opset17"]).read_bytes() == Path(down["bert_tiny_opset17"]).read_bytes()
    # $TESSERA_REMOTE is read when no remote is given, and a bad URL names itself.
    monkeypatch.setenv("TESSERA_REMOTE", "ftp://example.invalid/cache")
    with pytest.raises(tessera.Error, match=r"remote: .*ftp"):
        tessera.compile(ONNX, tmp_path / "out", targets=["cpu"], store=tmp_path / "s3", costs="analytical")



def test_batch_sizes_make_one_artifact_serving_every_batch_up_to_the_largest(tmp_path):
    import numpy as np

    got = tessera.compile("fixture:mlp3", tmp_path / "out", targets=ZOO_TARGETS, store=tmp_path / "store", costs="analytical", batch=[1, 8])
    assert list(got) == ["mlp3-b1_8"]
    m = tessera.load(got["mlp3-b1_8"])
    assert m.batch_sizes == [1, 8]
    assert m.inputs == [("input", "float32", [8, 784])]
    assert m.provenance["options"]["batch"] == "1,8"
    # The plan for 8 against the zoo's batch-8 artifact (built by the CLI with the same targets and costs),
    # batch 3 padded onto it, batch 1 on its own plan.
    plain = tessera.load(env_path("TESSERA_ZOO") / "mlp3-b8.tsr")
    assert plain.batch_sizes == []
    x = np.random.default_rng(7).uniform(-1, 1, size=(8, 784)).astype(np.float32)
    want = plain.run({"input": x})["logits"]
    for rows in [8, 3, 1]:
        out = m.run({"input": x[:rows]})["logits"]
        assert out.shape == (rows, 10)
        np.testing.assert_allclose(out, want[:rows], rtol=1e-4, atol=1e-5)
    with pytest.raises(tessera.Error, match=r"batch 9.*1, 8"):
        m.run({"input": np.zeros((9, 784), np.float32)})
