#!/bin/sh
# issue 50 on a GPU box (16 cores): the watch's default vs untraced, on daemons of the brief's
# shape at tens of GiB, from the bundle, in at most ~8 minutes. Here (gcc, this checkout):
#   sh bench/default_cost_gpu.sh --build-bins BINS        # brief_shape, provingd
# There, as root, from a checkout of bench/ (no compiler, no BCC needed: the bundle has them):
#   sh bench/default_cost_gpu.sh BUNDLE.tar.xz BINS OUT [ROUNDS]
# Two workloads, configurations interleaved per round (bench/overhead.py): untraced, the watch's
# default (`allocscope watch --pid`), the same with --wait-min 0, and residency mode with the
# page-fault events always open (--fault-duty 1, the default before 2026-12-07):
#   brief  bench/brief_shape.c: 16 threads, 1 GiB mallocs (mmapped), every page touched, 2 kept
#          (48 GiB live at the top, 96 GiB touched): seconds of work
#   demo   demo/provingd.c unpaced, 16 workers handing 1 GiB partitions to one GPU thread, 24 in
#          flight (24 GiB), 64 partitions: partitions/s
# ~40 trials of 5-12 s: ~6 minutes with ROUNDS 5 (each trial's start-up included; nothing compiles:
# the bundle's probes are prebuilt). Memory: ~50 GiB at the top.
# OUT gets default-cost-brief.txt, default-cost-demo.txt (the tables as printed, per-trial lines on
# stderr in the .log files) and the box's cores, memory and load before and after.
set -u
if [ "${1:-}" = "--build-bins" ]; then
    BINS=$2
    mkdir -p "$BINS"
    gcc -O2 -g -pthread -fno-omit-frame-pointer -o "$BINS/brief_shape" bench/brief_shape.c || exit 1
    gcc -std=c11 -O2 -g -fno-omit-frame-pointer -pthread -o "$BINS/provingd" demo/provingd.c || exit 1
    ls -l "$BINS"
    exit 0
fi
B=$1 BINS=$2 OUT=$3 ROUNDS=${4:-5}
mkdir -p "$OUT"
T=$(mktemp -d /tmp/allocscope-cost-XXXX)
tar xf "$B" -C "$T"
A=$(ls -d "$T"/allocscope-*)/bin/allocscope
date -u +%T
"$A" doctor > "$OUT/doctor.txt" 2>&1
{ nproc; free -g | head -2; uptime; } > "$OUT/box.txt"
CONFIGS=allocscope-watch,allocscope-watch-nowaits,allocscope-res-duty1
DEF="allocscope-res-duty1=--mode residency --fault-duty 1"
python3 bench/overhead.py --allocscope "$A" --bins "$BINS" --workload brief --threads 16 --brief-mib 1024 \
    --brief-iters 6 --rounds "$ROUNDS" --configs "$CONFIGS" --define "$DEF" --no-memleak --no-heaptrack \
    --bpf-stats > "$OUT/default-cost-brief.txt" 2> "$OUT/default-cost-brief.log"
echo "brief rc=$? $(date -u +%T)"
cat "$OUT/default-cost-brief.txt"
python3 bench/overhead.py --allocscope "$A" --bins "$BINS" --workload demo-large --large-partitions 64 \
    --large-args "--synth-ms 0 --gpu-ms 0 --pw 24 --workers 16 --partition-mb 1024" --rounds "$ROUNDS" \
    --configs "$CONFIGS" --define "$DEF" --no-memleak --no-heaptrack --bpf-stats \
    > "$OUT/default-cost-demo.txt" 2> "$OUT/default-cost-demo.log"
echo "demo rc=$? $(date -u +%T)"
cat "$OUT/default-cost-demo.txt"
uptime >> "$OUT/box.txt"
rm -rf "$T"
