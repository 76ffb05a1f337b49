"""Checks that every crate's rust-version is what the lock file really needs, the newest rust-version any locked
dependency declares (the lock's crates for every platform: build scripts, tests and all), and that README.md
states that version wherever it names one. Run by scripts/test.sh; `cargo` and the locked crates must be at hand
(it runs `cargo metadata --locked`). Usage: python3 scripts/check-rust-version.py"""

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
    declared = [(version(p["rust_version"]), f'{p["name"]} {p["version"]}') for p in meta["packages"]
                if p["id"] not in members and p.get("rust_version")]
    need = max(v for v, _ in declared)
    newest = sorted(name for v, name in declared if v == need)
    problems = []
    for p in meta["packages"]:
        if p["id"] in members and (p.get("rust_version") is None or version(p["rust_version"]) != need):
            problems.append(f'crate {p["name"]} declares rust-version {p.get("rust_version")}, the lock file needs {show(need)}')
    readme = (ROOT / "README.md").read_text()
    stated = re.findall(r"\bRust \(?(\d+\.\d+(?:\.\d+)?)(?:\+| or newer)", readme)
    if not stated:
        problems.append("README.md states no Rust version (`Rust 1.NN+` or `Rust (1.NN or newer`)")
    problems += [f"README.md says Rust {s}, the lock file needs {show(need)}" for s in stated if version(s) != need]
    if problems:
        print("\n".join(problems) + f"\n(the newest rust-version in Cargo.lock, {show(need)}, is declared by: {', '.join(newest)})", file=sys.stderr)
        return 1
    print(f"rust-version {show(need)}: what the lock file needs ({', '.join(newest)}), in every crate and README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
