# Sourced by the scripts: steps that need root, and the scripts' own Python.
#
# Every script works as root (CI, containers) and as a user: system packages go through `as_root` (sudo where it
# exists and is needed). Nothing is ever pip-installed into a system Python (PEP 668 protects Debian's and
# Ubuntu's anyway): what the scripts install from PyPI goes into virtual environments of their own, under the
# cargo target folder.

# Runs a command as root: directly when we are root, else through sudo where it exists.
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else echo "$(basename "$0"): '$*' needs root, and sudo is not installed" >&2; return 1
    fi
}

# Installs Debian/Ubuntu packages (as root), quietly.
apt_install() {
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# A C compiler: the `c` backend compiles with it.
need_cc() {
    command -v cc >/dev/null || apt_install gcc libc6-dev
}

# Makes the virtual environment DIR (a no-op when it is there, with pip) from the system's python3, which is only
# run, never changed. Debian's python3 makes venvs only with python3-venv (without it, `python3 -m venv` fails
# after leaving a folder without pip behind, which is removed).
make_venv() {
    local dir="$1"
    [ -x "$dir/bin/pip" ] && return 0
    command -v python3 >/dev/null || apt_install python3 python3-venv
    rm -rf "$dir"
    if ! python3 -m venv "$dir" >/dev/null 2>&1; then
        rm -rf "$dir"
        apt_install python3-venv
        python3 -m venv "$dir"
    fi
}

# pip install into the virtual environment DIR.
venv_pip() {
    local dir="$1"; shift
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$@"
}
