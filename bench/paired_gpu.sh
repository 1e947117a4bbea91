#!/bin/bash
# issue 50 on the GPU box: bench/paired.py's side-by-side cost of the watch's default (two live
# copies of a workload, the same blocks of work in ABBA order, one traced, each copy traced once)
# on redis, the brief's shape and the demo daemon, from the bundle: no compiler, no BCC, no
# package registry there. Here (Debian 12, gcc), into BINS (.gpubin/ is ignored by git):
#   bash bench/paired_gpu.sh --build-bins BINS
# copies Debian's redis-server 7.0 (jemalloc), redis-benchmark and redis-cli with the libraries
# an Ubuntu 24.04 box lacks (liblzf, libjemalloc, libatomic; its own glibc 2.39 runs them), and
# builds brief_shape and provingd. There, as root, from the repo root:
#   bash bench/paired_gpu.sh BUNDLE.tar.xz BINS OUT "redis brief demo" [PAIRS] [-- paired.py args]
# OUT gets paired-WORKLOAD.txt (the printed lines), paired-WORKLOAD.log (stderr) and box.txt.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = "--build-bins" ]; then
    BINS=${2:?--build-bins DIR}
    mkdir -p "$BINS/redis/lib"
    gcc -O2 -g -pthread -fno-omit-frame-pointer -o "$BINS/brief_shape" "$HERE/brief_shape.c" || exit 1
    gcc -std=c11 -O2 -g -fno-omit-frame-pointer -pthread -o "$BINS/provingd" "$HERE/../demo/provingd.c" || exit 1
    # redis-server is Debian's link to redis-check-rdb: the binary decides its role by its name
    cp "$(readlink -f "$(command -v redis-server)")" "$BINS/redis/redis-server" || exit 1
    cp "$(command -v redis-benchmark)" "$(command -v redis-cli)" "$BINS/redis/" || exit 1
    for l in liblzf.so.1 libjemalloc.so.2 libatomic.so.1; do
        cp -L "/lib/x86_64-linux-gnu/$l" "$BINS/redis/lib/" || exit 1
    done
    ls -lR "$BINS"
    exit 0
fi
B=${1:?BUNDLE} BINS=$(cd "${2:?BINS}" && pwd) OUT=${3:?OUT} WORKLOADS=${4:-"redis brief demo"} PAIRS=${5:-60}
shift 5 2>/dev/null || shift $#
[ "${1:-}" = "--" ] && shift
mkdir -p "$OUT"
T=$(mktemp -d /tmp/allocscope-paired-gpu-XXXX)
trap 'rm -rf "$T"' EXIT
tar xf "$B" -C "$T" || exit 1
A=$(ls -d "$T"/allocscope-*)/bin/allocscope
export PATH="$BINS/redis:$PATH" LD_LIBRARY_PATH="$BINS/redis/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{ nproc; free -g | head -2; uptime; redis-server --version; } > "$OUT/box.txt" 2>&1
for w in $WORKLOADS; do
    echo "== $w $(date -u +%T)"
    python3 "$HERE/paired.py" --workload "$w" --pairs "$PAIRS" --allocscope "$A" --bins "$BINS" \
        --note "GPU box, from the bundle" "$@" > "$OUT/paired-$w.txt" 2> "$OUT/paired-$w.log"
    echo "$w rc=$? $(date -u +%T)"
    grep -A3 -E "both ways|FAILED" "$OUT/paired-$w.txt" | head -12
done
uptime >> "$OUT/box.txt"
