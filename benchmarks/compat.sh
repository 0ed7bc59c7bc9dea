#!/usr/bin/env bash
# The test suite on JetPack 5.1's software: Python 3.8, torch 2.0.1, torchvision 0.15.2 (NVIDIA's JetPack 5.1
# wheels are torch 2.0/2.1; these are the same releases from PyPI, for x86-64).
#
#   benchmarks/compat.sh            make the venv (once) and run the whole suite in it
#   benchmarks/compat.sh install    only make / update the venv
#   benchmarks/compat.sh test [PYTEST ARGS...]   only run the tests (e.g. `test tests/test_runner.py -x`)
#
# Knobs (environment): COMPAT_PYTHON (a Python 3.8 interpreter; default: python3.8 on PATH, else pyenv's 3.8),
# COMPAT_VENV (default build/compat-venv; build/ is git-ignored). The Linux torch 2.0.1 wheel pulls the
# nvidia-* CUDA 11.7 libraries from PyPI: about 4.7 GB in the venv. The tests that need a newer torch
# (the memory tracker, the predictor) skip there with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."

stage="${1:-all}"
[ $# -gt 0 ] && shift
case "$stage" in
    all|install|test) ;;
    *) echo "compat.sh: error: stage '$stage' is not known; allowed: all, install, test" >&2; exit 2 ;;
esac

venv="${COMPAT_VENV:-build/compat-venv}"
is_py38() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 8))' 2>/dev/null; }
python="${COMPAT_PYTHON:-}"
if [ -z "$python" ]; then
    # pyenv's shim answers `python3.8` even where that version is not the active one: try each candidate
    for candidate in python3.8 $(command -v pyenv >/dev/null && ls -d "$(pyenv root)"/versions/3.8.*/bin/python 2>/dev/null); do
        if is_py38 "$candidate"; then python="$candidate"; break; fi
    done
fi
if [ -z "$python" ] || ! is_py38 "$python"; then
    echo "compat.sh: error: no Python 3.8 found (COMPAT_PYTHON='${COMPAT_PYTHON:-}'); allowed: COMPAT_PYTHON=/path/to/python3.8" >&2
    exit 2
fi

if [ "$stage" != test ]; then
    start=$(date +%s)
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    # torch and torchvision in one command, as JetPack's pair; numpy < 2: torch 2.0 was built against numpy 1.x
    "$venv/bin/python" -m pip install --quiet torch==2.0.1 torchvision==0.15.2 'numpy<2'
    "$venv/bin/python" -m pip install --quiet -e '.[test]'
    echo "compat.sh: venv $venv ready in $(( $(date +%s) - start )) s"
fi

if [ "$stage" != install ]; then
    "$venv/bin/python" -c 'import sys, torch, torchvision; print("compat.sh: Python", sys.version.split()[0], "torch", torch.__version__, "torchvision", torchvision.__version__)'
    start=$(date +%s)
    status=0
    "$venv/bin/python" -m pytest -rfEs "$@" || status=$?
    echo "compat.sh: tests took $(( $(date +%s) - start )) s (exit $status)"
    exit $status
fi
