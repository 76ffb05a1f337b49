"""Checks that the Rust version tessera declares is one that builds it, and that README.md says it.

- Every workspace crate declares the same rust-version (Cargo.toml's [workspace.package]).
- It is at least the newest rust-version any crate in Cargo.lock declares (build scripts, tests and every platform
  included): a dependency update that needs a newer Rust fails here, by name.
- README.md states exactly it wherever it names a Rust version (`Rust 1.NN+`, `Rust (1.NN or newer`).

tessera's own code is held to it by clippy's incompatible_msrv lint, which scripts/test.sh runs. Run by
scripts/test.sh; needs `cargo` and the locked crates (it runs `cargo metadata --locked`).
Usage: python3 scripts/check-rust-version.py"""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def version(text):
    """"1.89" and "1.89.0" as one comparable tuple."""
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def show(v):
    return ".".join(map(str, v[:2])) if v[2] == 0 else ".".join(map(str, v))


def main():
    meta = json.loads(subprocess.run(["cargo", "metadata", "--format-version", "1", "--locked"], cwd=ROOT, check=True,
                                     capture_output=True, text=True).stdout)
    members = set(meta["workspace_members"])
    locked = [(version(p["rust_version"]), f'{p["name"]} {p["version"]}') for p in meta["packages"]
              if p["id"] not in members and p.get("rust_version")]
    need = max(v for v, _ in locked)
    newest = ", ".join(sorted(name for v, name in locked if v == need))
    crates = {p["name"]: p.get("rust_version") for p in meta["packages"] if p["id"] in members}
    problems = [f"crate {name} declares no rust-version" for name, v in sorted(crates.items()) if v is None]
    declared = {version(v) for v in crates.values() if v is not None}
    if len(declared) > 1:
        problems.append(f"the crates declare different rust-versions: {crates}")
    ours = max(declared) if declared else need
    if ours < need:
        problems.append(f"the crates declare rust-version {show(ours)}, but Cargo.lock needs {show(need)} ({newest})")
    readme = (ROOT / "README.md").read_text()
    stated = re.findall(r"\bRust \(?(\d+\.\d+(?:\.\d+)?)(?:\+| or newer)", readme)
    if not stated:
        problems.append("README.md states no Rust version (`Rust 1.NN+` or `Rust (1.NN or newer`)")
    problems += [f"README.md says Rust {s}, the crates declare {show(ours)}" for s in stated if version(s) != ours]
    if problems:
        print("scripts/check-rust-version.py:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(f"rust-version {show(ours)} in every crate and README.md; Cargo.lock needs {show(need)} ({newest})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
