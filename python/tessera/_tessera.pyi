"""Type stubs of the Rust extension (python/src/lib.rs, python/src/compile.rs); python/tests/test_stubs.py
checks that they name exactly what the extension exports."""

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

__version__: str

class Error(Exception):
    """Raised with a message naming the file, model, input or output at fault."""

TensorDesc = Tuple[str, str, List[int]]
"""(name, numpy dtype name, shape)"""

class Model:
    """A loaded artifact: its digest checked and its code loaded; run it from any number of threads."""

    @staticmethod
    def from_bytes(data: bytes, gpu: Optional[int] = None) -> "Model":
        """Loads an artifact held in memory; `gpu` as for `load`."""
    @property
    def name(self) -> str: ...
    @property
    def gpu(self) -> Optional[int]:
        """The GPU (CUDA device index, as torch's cuda:N) a GPU model was loaded on and runs on; None for a host
        model."""
    @property
    def batch_sizes(self) -> List[int]:
        """A batched model's batch sizes, ascending: run takes any batch up to the largest, on the smallest plan
        that fits (inputs zero-padded); [] for a model of one plan."""
    @property
    def inputs(self) -> List[TensorDesc]: ...
    @property
    def outputs(self) -> List[TensorDesc]: ...
    @property
    def provenance(self) -> Optional[Dict[str, Any]]:
        """How the artifact was built: tessera_version, source_revision, source (kind, name, digest), targets,
        precision, costs, options; None for an artifact written before tessera recorded provenance."""
    def run(self, inputs: Mapping[str, Any], out: Optional[Mapping[str, Any]] = None, stream: Optional[int] = None) -> Dict[str, Any]:
        """Inputs: NumPy arrays or DLPack tensors (torch, CuPy, JAX), read in place, on the host or the model's GPU.
        Returns NumPy arrays, or with `out=` writes into those DLPack tensors and returns `out`; `stream` (a
        CUstream handle) enqueues a GPU run on it and returns at once. A GPU run makes the model's GPU the
        thread's current CUDA device while it runs, and gives the caller's back afterwards."""
        ...

def load(path: Union[str, os.PathLike], gpu: Optional[int] = None) -> Model:
    """Loads an artifact; a GPU artifact on GPU `gpu` (a CUDA device index; default 0). A host artifact takes no
    `gpu`: giving one raises Error."""

_Path = Union[str, os.PathLike]

def compile(
    inputs: Union[_Path, Sequence[_Path]],
    out: _Path,
    *,
    targets: Optional[Sequence[str]] = None,
    shapes: Optional[Mapping[str, Sequence[int]]] = None,
    batch: Optional[Sequence[int]] = None,
    calibration: Optional[_Path] = None,
    store: Optional[_Path] = None,
    costs: str = "measured",
    wait: bool = False,
    remote: Optional[str] = None,
    remote_read_only: bool = False,
    gpus: Optional[Sequence[int]] = None,
) -> Dict[str, str]:
    """Compiles models into `out/<model>.tsr` (absent from a runtime-only build)."""

def cli_main(argv: Sequence[Union[str, os.PathLike]]) -> int:
    """Runs the `tessera` command line `argv` (program name first) in this process and returns its exit status;
    sets SIGPIPE and SIGINT to their default actions, so only for a process that is the command (the wheel's
    `tessera` console script, tessera/_cli.py). Absent from a runtime-only build."""
