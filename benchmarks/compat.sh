#!/usr/bin/env bash
# The test suite on an old board's software, from PyPI's x86-64 builds of the same releases:
#   COMPAT_SET=jp5 (default)  Python 3.8, torch 2.0.1, torchvision 0.15.2: JetPack 5.1 (NVIDIA's wheels are torch 2.0/2.1)
#   COMPAT_SET=tx2            Python 3.8, torch 1.13.1, torchvision 0.14.1: a TX2 or Nano on JetPack 4.6 with a
#                             community torch 1.13 wheel (docs/jetson.md, "The TX2 route")
#
#   benchmarks/compat.sh            make the venv (once) and run the whole suite in it
#   benchmarks/compat.sh install    only make / update the venv
#   benchmarks/compat.sh test [PYTEST ARGS...]   only run the tests (e.g. `test tests/job/test_run.py -x`)
#
# Knobs (environment): COMPAT_SET (above), COMPAT_PYTHON (a Python 3.8 interpreter; default: python3.8 on PATH,
# else pyenv's 3.8), COMPAT_VENV (default build/compat-venv for jp5, build/compat-venv-tx2 for tx2; build/ is
# git-ignored). The Linux torch wheels pull the nvidia-* CUDA libraries from PyPI: about 4.7 GB in the venv. The
# tests that need a newer torch (the memory tracker, the predictor; on 1.13 also FLOP counts) skip there with the
# reason.
set -euo pipefail
cd "$(dirname "$0")/.."

stage="${1:-all}"
[ $# -gt 0 ] && shift
case "$stage" in
    all|install|test) ;;
    *) echo "compat.sh: error: stage '$stage' is not known; allowed: all, install, test" >&2; exit 2 ;;
esac

compat_set="${COMPAT_SET:-jp5}"
case "$compat_set" in
    jp5) torch_pins="torch==2.0.1 torchvision==0.15.2"; default_venv=build/compat-venv ;;
    tx2) torch_pins="torch==1.13.1 torchvision==0.14.1"; default_venv=build/compat-venv-tx2 ;;
    *) echo "compat.sh: error: COMPAT_SET='$compat_set' is not known; allowed: jp5, tx2" >&2; exit 2 ;;
esac
venv="${COMPAT_VENV:-$default_venv}"
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
    # torch and torchvision in one command, as JetPack's pair; numpy < 2: torch 1.13 and 2.0 were built against 1.x
    # shellcheck disable=SC2086
    "$venv/bin/python" -m pip install --quiet $torch_pins 'numpy<2'
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
