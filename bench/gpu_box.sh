#!/bin/sh
# The device checks on a GPU box, in one go (bench/README.md, "GPU box"):
#   sh bench/gpu_box.sh BUNDLE.tar.xz BINS TESTWHEELS OUT
# BUNDLE: make bundle's tarball; BINS: gpu_small, gpu_driver, provingd built elsewhere (the box
# needs no compiler); TESTWHEELS: pytest, pytest-timeout, pytest-xdist, hypothesis and their
# dependencies as wheels (pip download); OUT: where results go. Runs bench/gpu_check.py (doctor,
# the C target, the driver-API program, PyTorch, the big demo daemon), then the tests that need no
# BPF under the box's own python, pandas and pyarrow, with the bundle's packages.
set -u
B=$1 BINS=$2 TW=$3 OUT=$4
mkdir -p "$OUT"
python3 bench/gpu_check.py "$B" --bins "$BINS" --out "$OUT" --skip scale > "$OUT/gpu_check.log" 2>&1
echo "gpu_check rc=$?"
grep -v '^WARNING' "$OUT/gpu_check.log" | tail -45
T=/tmp/allocscope-testdeps
mkdir -p "$T"
for w in "$TW"/*.whl; do python3 -m zipfile -e "$w" "$T"; done
PY=$(ls -d /tmp/allocscope-bundle/*/python | head -1)
python3 -c 'import sys, pandas, pyarrow; print("python", sys.version.split()[0], "pandas", pandas.__version__, "pyarrow", pyarrow.__version__)'
PYTHONPATH=".:$T:$PY" timeout 300 python3 -m pytest -q -m "not bpf" -n 8 -p no:cacheprovider tests \
  > "$OUT/tests.log" 2>&1
echo "tests rc=$?"
tail -25 "$OUT/tests.log"
