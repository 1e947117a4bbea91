#!/bin/sh
# A real OOM kill under `allocscope watch`, on a box with cgroup v2 (the GPU box; never on a box
# whose own cgroups must not be touched):
#   sudo sh bench/oom_check.sh ALLOCSCOPE RESTARTD OUT [LIMIT_BYTES]
# ALLOCSCOPE: the allocscope command (the bundle's bin/allocscope, or .venv/bin/allocscope);
# RESTARTD: tests/targets/restartd.c built; OUT: where the traces and logs go. It makes a memory
# cgroup of its own (memory.max LIMIT_BYTES, default 2 GiB, no swap), watches `restartd oom`,
# starts it in the cgroup twice (the second start is the restart systemd would make), waits for
# both OOM kills, stops the watch, prints each trace's report and its recording.end, and removes
# the cgroup.
set -u
A=$1 R=$2 OUT=$3 LIMIT=${4:-2147483648}
CG=/sys/fs/cgroup/allocscope-oomcheck-$$
mkdir -p "$OUT"
[ -f /sys/fs/cgroup/cgroup.controllers ] || { echo "no cgroup v2 at /sys/fs/cgroup"; exit 1; }
grep -qw memory /sys/fs/cgroup/cgroup.subtree_control || echo +memory > /sys/fs/cgroup/cgroup.subtree_control
mkdir "$CG" && echo "$LIMIT" > "$CG/memory.max" && echo 0 > "$CG/memory.swap.max" 2>/dev/null
echo "cgroup $CG memory.max $(cat "$CG/memory.max")"
"$A" watch --pgrep "^$R oom" -o "$OUT/traces" --interval 1 > "$OUT/watch.log" 2>&1 &
W=$!
i=0
while ! grep -q watching "$OUT/watch.log"; do sleep 0.5; i=$((i+1)); [ $i -gt 240 ] && break; done
for n in 1 2; do
  sh -c "echo \$\$ > $CG/cgroup.procs && exec $R oom 64 50" > "$OUT/restartd-$n.out" 2>&1
  echo "incarnation $n: exit status $? ($(tail -1 "$OUT/restartd-$n.out"))"
  sleep 2
done
sleep 3
kill -INT $W
wait $W
echo "watch exit $?"
cat "$OUT/watch.log"
grep -h "out of memory\|Killed process" /dev/kmsg 2>/dev/null | tail -2 &
sleep 1; kill $! 2>/dev/null
cat "$CG/memory.events"
rmdir "$CG"
for t in "$OUT"/traces/*.allocscope; do
  echo "== $t"
  "$A" report "$t" | head -16
  "$A" report "$t" --format json > "$t.json"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print('recording.end =', json.dumps(r['recording']['end'])); print('finding 1 =', r['findings'][0]['text'])" "$t.json"
done
