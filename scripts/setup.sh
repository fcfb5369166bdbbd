#!/usr/bin/env bash
# Sets up everything detlaunch and its tests need on a fresh Debian 12 machine:
# apt packages, a venv in .venv, torch (CPU), horovod (built once, wheel cached),
# deepspeed (CPU comm op prebuilt), and detlaunch itself in editable mode.
# Safe to run again: every step is skipped when already done.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${DETLAUNCH_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/detlaunch"

TORCH_VERSION=2.13.0
HOROVOD_VERSION=0.28.1
DEEPSPEED_VERSION=0.19.8
APT_PACKAGES=(openssh-server openssh-client pdsh openmpi-bin libopenmpi-dev iproute2
              munge slurmctld slurmd slurm-client python3 python3-venv python3-dev g++ time
              chromium)  # headless, for the tests of the job's page (tests/observe/test_story_page.py)

log() { printf '[setup] %s\n' "$*" >&2; }

install_apt() {
    local missing=()
    for p in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "apt: ${missing[*]}"
        local sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

prepare_sshd() {
    # sshd wants its privilege-separation dir; /run is emptied at boot.
    [ -d /run/sshd ] && return 0
    local sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo mkdir -p -m 0755 /run/sshd
}

make_venv() {
    if [ ! -x "$VENV/bin/python" ]; then
        log "venv: $VENV"
        "$PY" -m venv "$VENV"
        "$VENV/bin/pip" install -q --upgrade pip
    fi
}

# Installed at this version (a local tag such as torch's +cpu does not count).
pip_has() { "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('$1').split('+')[0] == '$2' else 1)" 2>/dev/null; }

install_python_deps() {
    if ! pip_has torch "$TORCH_VERSION"; then
        log "torch $TORCH_VERSION (CPU)"
        "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" numpy
    fi
    # Again only when pyproject.toml changed (its hash is kept in the venv).
    local stamp="$VENV/.detlaunch-pyproject" want
    want="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1) $ROOT"
    [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && return 0
    log "detlaunch (editable) and dev tools"
    "$VENV/bin/pip" install -q -e "$ROOT[dev]" wheel setuptools ninja cmake
    echo "$want" > "$stamp"
}

install_horovod() {
    pip_has horovod "$HOROVOD_VERSION" && return 0
    local wheels="$CACHE/wheels/horovod-$HOROVOD_VERSION-torch$TORCH_VERSION-$("$VENV/bin/python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
    if ! ls "$wheels"/horovod-*.whl >/dev/null 2>&1; then
        log "building horovod $HOROVOD_VERSION against torch $TORCH_VERSION (2-3 minutes, once)"
        mkdir -p "$wheels"
        # horovod's torch CMakeLists forces C++14; torch 2.13's headers need C++17.
        local cxx_dir; cxx_dir="$(mktemp -d)"
        cat > "$cxx_dir/g++-cxx17" <<'WRAP'
#!/bin/sh
for a in "$@"; do
    case "$a" in -std=c++11|-std=c++14) shift; set -- "$@" -std=c++17 ;; *) shift; set -- "$@" "$a" ;; esac
done
exec g++ "$@"
WRAP
        chmod +x "$cxx_dir/g++-cxx17"
        PATH="$VENV/bin:$PATH" CXX="$cxx_dir/g++-cxx17" CMAKE_POLICY_VERSION_MINIMUM=3.5 \
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j"$(nproc)" \
            "$VENV/bin/pip" wheel -q --no-deps --no-build-isolation --no-cache-dir \
                -w "$wheels" "horovod==$HOROVOD_VERSION"
        rm -rf "$cxx_dir"
    fi
    log "horovod $HOROVOD_VERSION from $wheels"
    "$VENV/bin/pip" install -q --no-deps "$wheels"/horovod-*.whl
    "$VENV/bin/pip" install -q cloudpickle psutil pyyaml packaging cffi
}

install_deepspeed() {
    pip_has deepspeed "$DEEPSPEED_VERSION" && return 0
    log "deepspeed $DEEPSPEED_VERSION with the CPU comm op prebuilt"
    PATH="$VENV/bin:$PATH" DS_BUILD_SHM_COMM=1 DS_ACCELERATOR=cpu \
        "$VENV/bin/pip" install -q --no-build-isolation "deepspeed==$DEEPSPEED_VERSION"
}

install_apt
prepare_sshd
make_venv
install_python_deps
install_horovod
install_deepspeed
log "ready: $VENV/bin/detlaunch"
