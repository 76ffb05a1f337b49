"""The installed wheel is what a manylinux_2_28 system can install and run: tagged manylinux_2_28 (or older),
its extension binding no glibc symbol newer than 2.28 and linking no library outside the manylinux set, and it
brings the `tessera` command with it."""

import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

from tessera import _tessera

# PEP 600: the libraries a manylinux wheel may link without shipping them (the ones the extension could need).
ALLOWED_LIBS = {"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "libgcc_s.so.1",
                "libstdc++.so.6", "libutil.so.1", "libresolv.so.2", "ld-linux-x86-64.so.2"}
MAX_GLIBC = (2, 28)


def dist():
    return metadata.distribution("tessera-runtime")


def test_the_wheel_is_tagged_manylinux_2_28_or_older():
    tags = [line.split(":", 1)[1].strip() for line in dist().read_text("WHEEL").splitlines() if line.startswith("Tag:")]
    assert tags, "the installed wheel records no tag"
    for tag in tags:
        python, abi, platform = tag.split("-")
        assert (python, abi) == ("cp39", "abi3"), tag
        m = re.fullmatch(r"manylinux_(\d+)_(\d+)_x86_64", platform)
        assert m and (int(m[1]), int(m[2])) <= MAX_GLIBC, f"{tag}: not installable on a glibc 2.28 system"


def test_the_extension_needs_glibc_2_28_at_most():
    so = Path(_tessera.__file__)
    objdump = shutil.which("objdump")
    assert objdump, "objdump (binutils, which comes with the C compiler) is needed to read the extension's symbols"
    symbols = subprocess.run([objdump, "-T", str(so)], check=True, capture_output=True, text=True).stdout
    # Lines such as `0000000000000000      DF *UND*  0000000000000000 (GLIBC_2.34) pthread_create`.
    bound = [(tuple(map(int, m[1].split("."))), m[2]) for m in re.finditer(r"\(?GLIBC_(\d+(?:\.\d+)+)\)?\s+(\S+)\s*$", symbols, re.M)]
    assert bound, f"{so}: no glibc symbol versions found"
    too_new = sorted(f"{name}@GLIBC_{'.'.join(map(str, v))}" for v, name in bound if v > MAX_GLIBC)
    assert not too_new, f"{so} needs a glibc newer than 2.28: {too_new[:20]}"

    headers = subprocess.run([objdump, "-p", str(so)], check=True, capture_output=True, text=True).stdout
    needed = set(re.findall(r"^\s*NEEDED\s+(\S+)$", headers, re.M))
    assert needed <= ALLOWED_LIBS, f"{so} links libraries outside the manylinux set: {sorted(needed - ALLOWED_LIBS)}"


def test_the_wheel_brings_the_tessera_command():
    scripts = [e for e in dist().entry_points if e.group == "console_scripts"]
    assert [(e.name, e.value) for e in scripts] == [("tessera", "tessera._cli:main")]
