"""The `tessera` command of the wheel (a console script, pyproject.toml's [project.scripts]): the Rust command
line of the `tessera` binary, run inside this process by the extension (python/src/cli.rs), with the binary's
arguments, output and exit statuses."""

import os
import sys


def main() -> int:
    try:
        from ._tessera import cli_main
    except ImportError:
        # A runtime-only build (`maturin build --no-default-features`) carries no compiler and no command line.
        print("tessera: this build of the tessera package has no compiler, so no command line: it was built "
              "without its `compiler` feature (maturin build --no-default-features)", file=sys.stderr)
        return 1
    # tessera finds NVIDIA's and CUTLASS's PyPI wheels (NVRTC, nvcc, the headers) in the site-packages of the
    # `python3` on PATH: this interpreter's folder goes first, as activating its environment would put it, so
    # `~/venv/bin/tessera` finds the wheels installed beside it without the environment being active.
    here = os.path.dirname(sys.executable)
    if sys.executable and os.access(os.path.join(here, "python3"), os.X_OK):
        os.environ["PATH"] = os.pathsep.join([here] + [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and d != here])
    # The program's name as the binary's: clap prints it in help and errors.
    return cli_main(["tessera", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
