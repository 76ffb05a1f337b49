"""The wheel's `tessera` command (a console script over the extension, tessera/_cli.py) against the `tessera`
binary of the same checkout: the same output, the same files, the same exit statuses, with no Rust toolchain
anywhere on PATH (scripts/test-python.sh takes it off, and installs the wheel into a clean environment)."""

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import tessera
from test_runtime import assert_same_bits, env_path, tessera_run


def command():
    """The installed console script: the one in this environment's bin/, first on PATH."""
    found = shutil.which("tessera")
    assert found, "the wheel installed no `tessera` command on PATH"
    assert Path(found).parent == Path(sys.executable).parent, f"`tessera` on PATH is {found}, not this environment's"
    return found


def both(*args):
    """Runs the command and the binary with the same arguments: (command's result, binary's result)."""
    run = lambda exe: subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=600)
    return run(command()), run(str(env_path("TESSERA_BIN")))


def test_no_rust_toolchain_is_on_path():
    for tool in ("cargo", "rustc"):
        assert shutil.which(tool) is None, f"{tool} is on PATH ({shutil.which(tool)}): the test must show the wheel needs none"


def test_version_help_and_targets_are_the_binary_s():
    for args in (["--version"], ["--help"], ["compile", "--help"], ["targets", "--json"]):
        cmd, binary = both(*args)
        assert (cmd.returncode, cmd.stdout, cmd.stderr) == (binary.returncode, binary.stdout, binary.stderr), args
        assert cmd.returncode == 0 and cmd.stdout, args


def test_compile_writes_the_binary_s_bytes_and_tessera_load_runs_them(tmp_path):
    # Separate stores: each computes every stage; the artifacts must still be byte for byte the same.
    def compile_with(exe, name):
        args = [exe, "compile", "fixture:mlp3:b2", "-t", "cpu", "--costs", "analytical", "--store", str(tmp_path / f"{name}-store"), "--out", str(tmp_path / name)]
        done = subprocess.run(args, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (exe, done.stderr)
        return done

    cmd = compile_with(command(), "cmd")
    binary = compile_with(str(env_path("TESSERA_BIN")), "bin")
    assert "mlp3-b2" in cmd.stdout and "mlp3-b2" in binary.stdout   # (the reports hold times: not compared)
    artifact = tmp_path / "cmd" / "mlp3-b2.tsr"
    assert artifact.read_bytes() == (tmp_path / "bin" / "mlp3-b2.tsr").read_bytes()

    m = tessera.load(artifact)
    assert m.inputs == [("input", "float32", [2, 784])]
    inputs, want = tessera_run(artifact, tmp_path / "run", seed=7)
    assert_same_bits(m.run(inputs), want)


def test_failures_exit_as_the_binary_does(tmp_path):
    # A failing command: status 1 and `error: ...` on stderr (its report on stdout holds times: not compared).
    missing = tmp_path / "no" / "such.onnx"
    cmd, binary = both("compile", missing, "-t", "cpu", "--store", tmp_path / "s", "--out", tmp_path / "o")
    assert (cmd.returncode, cmd.stderr) == (binary.returncode, binary.stderr)
    assert cmd.returncode == 1 and cmd.stderr.startswith("error:") and "such.onnx" in cmd.stderr, cmd.stderr
    # Bad arguments: clap's status 2 and its message, word for word.
    for args in (["compile", "--no-such-flag"], ["no-such-command"], []):
        cmd, binary = both(*args)
        assert cmd.returncode == 2, (args, cmd.returncode, cmd.stderr)
        assert (cmd.returncode, cmd.stdout, cmd.stderr) == (binary.returncode, binary.stdout, binary.stderr), args


def test_a_reader_that_has_gone_ends_it_with_sigpipe():
    # `tessera targets | head -0`: the reader is gone before the first write; the command must end by SIGPIPE
    # (status 141 in a shell), as the binary does, not with a panic or an error message.
    for exe in (command(), str(env_path("TESSERA_BIN"))):
        p = subprocess.Popen([exe, "targets"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stdout.close()   # the only read end: the child's stdout now has no reader
        _, err = p.communicate(timeout=60)
        assert p.returncode == -signal.SIGPIPE, (exe, p.returncode, err)
        assert err == b"", (exe, err)


def compile_bert_base_and_interrupt(tmp_path, **popen):
    """Starts `tessera compile` of BERT-base (440 MB of weights: seconds), sends SIGINT once the compiler has
    made its store, and returns (process, whether it ended within 10 s, the artifact's path)."""
    store, out = tmp_path / "s", tmp_path / "o"
    p = subprocess.Popen([command(), "compile", "fixture:bert-base:b1:s128", "-t", "cpu", "--costs", "analytical",
                          "--store", str(store), "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)
    deadline = time.monotonic() + 60
    while not store.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert p.poll() is None, f"the compile ended before the signal: {p.returncode}, {p.stderr.read()}"
    p.send_signal(signal.SIGINT)
    try:
        p.wait(timeout=10)
        ended = True
    except subprocess.TimeoutExpired:
        ended = False
    return p, ended, out / "bert-base-b1-s128.tsr"


def test_ctrl_c_stops_a_compile_at_once(tmp_path):
    # Python defers SIGINT to its own handler, which would run only once the extension returned, after the whole
    # compile: the command sets it back to the default, so Ctrl-C ends a compile at once, as it ends the binary.
    # The command starts with SIGINT at its default, as a terminal's foreground job does, whatever this runner
    # inherited: run in the background of a script (`nohup ... &`), the runner has SIGINT ignored, its children
    # inherit that, and an ignored SIGINT rightly stays ignored (the next test), so the compile ran to its end.
    p, ended, artifact = compile_bert_base_and_interrupt(tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    if not ended:
        p.kill()
        p.wait()
    assert ended, "Ctrl-C did not stop `tessera compile` within 10 s"
    assert p.returncode == -signal.SIGINT, (p.returncode, p.stderr.read())
    assert not artifact.exists(), "the compile ran to its end: the signal waited for it"


def test_an_ignored_sigint_stays_ignored(tmp_path):
    # A shell starts background commands with SIGINT ignored (`tessera compile ... &` in a script): the command
    # keeps it ignored, as the binary does, and the compile runs to its end.
    p, _, artifact = compile_bert_base_and_interrupt(tmp_path, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    p.wait(timeout=600)
    assert p.returncode == 0, (p.returncode, p.stderr.read())
    assert artifact.is_file()


def test_the_command_looks_for_nvidia_wheels_in_its_own_environment(tmp_path):
    # tessera looks for NVIDIA's wheels (nvcc, CUTLASS's headers) in the site-packages of the `python3` on PATH.
    # Run by its path, with this environment off PATH and another `python3` first (a stand-in answering a
    # site-packages of its own), the command must still look in this environment: it puts its interpreter's
    # folder first (tessera/_cli.py), as activating the environment would.
    other = tmp_path / "other-python"
    other.mkdir()
    (other / "python3").write_text(f"#!/bin/sh\necho {tmp_path / 'other-site-packages'}\n")
    (other / "python3").chmod(0o755)
    here = Path(sys.executable).parent
    path = os.pathsep.join([str(other)] + [d for d in os.environ["PATH"].split(os.pathsep) if d and Path(d) != here])
    env = {k: v for k, v in os.environ.items() if k not in ("TESSERA_CUDA_HOME", "TESSERA_CUTLASS_HOME")}
    done = subprocess.run([command(), "targets", "--json"], capture_output=True, text=True, timeout=120, env={**env, "PATH": path})
    assert done.returncode == 0, done.stderr
    cutlass = next(b for k in json.loads(done.stdout)["kinds"] for b in k["backends"] if b["backend"] == "cutlass")
    # This environment holds neither nvcc nor CUTLASS, so the status is the error listing where tessera looked:
    # nvcc under site-packages/nvidia/cu13/bin, or CUTLASS under site-packages/cutlass_library (after a
    # system-wide nvcc, /usr/local/cuda, was found).
    assert cutlass["status"].startswith("unavailable"), cutlass["status"]
    assert sysconfig.get_paths()["purelib"] in cutlass["status"], cutlass["status"]
    assert "other-site-packages" not in cutlass["status"], cutlass["status"]
