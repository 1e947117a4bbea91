#!/bin/sh
# bench/first_contact.py on a GPU box from the bundle (issue 45), in one go:
#   sh bench/first_contact_gpu.sh BUNDLE.tar.xz IDLE_BIN OUT [first_contact.py options...]
# IDLE_BIN: bench/idle.c built elsewhere (the box needs no compiler). Unpacks the bundle into a
# fresh folder (a new box's first contact: empty cache dirs), runs doctor, starts a PyTorch
# process (CUDA initialised, allocating), then first_contact.py on the idle daemon and on it:
# cold/warm/compiled-here per variant.
set -u
B=$1 IDLE=$2 OUT=$3
shift 3
mkdir -p "$OUT"
T=$(mktemp -d /tmp/allocscope-fc-XXXX)
tar xf "$B" -C "$T"
A=$(ls -d "$T"/allocscope-*)/bin/allocscope
"$A" doctor 2>&1 | grep -E "headers|prebuilt|probe program|tracing"
python3 - > "$OUT/torch.out" 2>&1 <<'PY' &
import os, time, torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
print("ready", os.getpid(), flush=True)
while True:
    a = torch.empty(1 << 20, dtype=torch.uint8); d = torch.empty(2 << 20, dtype=torch.uint8, device="cuda")
    del a, d; time.sleep(0.01)
PY
TP=$!
for i in $(seq 1 120); do grep -q ready "$OUT/torch.out" && break; sleep 0.5; done
grep ready "$OUT/torch.out" || { cat "$OUT/torch.out"; exit 1; }
python3 bench/first_contact.py --allocscope "$A" --daemon "$IDLE" --pid "$TP" --json "$OUT/first_contact.json" "$@" 2>&1 | tee "$OUT/first_contact.txt"
kill "$TP"
