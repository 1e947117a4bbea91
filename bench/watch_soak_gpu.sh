#!/bin/bash
# issue 50's soak at the brief's scale: `allocscope watch` (its defaults) over a daemon of the
# brief's shape (demo/provingd.c with --bug: partition workers handing 1 GiB partitions to one
# "gpu" thread through a one-slot channel; the pile-up grows it to its memory cgroup's limit in
# ~40-60 s), OOM-killed by that limit and restarted by a shell loop (like systemd's
# Restart=always, 1 s apart), for --minutes. Every 10 s, from outside: the watcher's RSS (it and
# its children), the traces directory's bytes and files, the daemon's RSS, the cgroup's usage.
# At the end: `allocscope report --format json` of every trace and bench/watch_soak_summary.py:
# incarnations started vs traced, each trace's end (expect oom_killed, scope cgroup, the limit),
# lost events (must be 0), peak live bytes, the top location, the watcher's RSS and disk.
#
# Here (gcc; the box needs no compiler): the daemon, built against this box's glibc 2.36 (its
# symbols need <= 2.34, the GPU box has 2.39), into .gpubin/ (.git/info/exclude ignores it), named
# provingd-soak so that no other watch of a provingd (bench/overhead.py's) holds its execs:
#   bash bench/watch_soak_gpu.sh --build-bins .gpubin
# There, as root, from the repo root (cgroup v2 or v1's memory controller; never the box's own
# cgroups: a sub-cgroup allocscope-soak-$$ of its own, removed at the end):
#   bash bench/watch_soak_gpu.sh --bundle dist/allocscope-*.tar.xz --daemon .gpubin/provingd-soak \
#       --out "$OUT" [--minutes 6] [--limit-mib 24576] [--partition-mb 1024]
# Options: --allocscope PATH instead of --bundle (e.g. .venv/bin/allocscope); --metrics PORT
# (the watch also serves Prometheus on 127.0.0.1:PORT, scraped at the end); --watch-args "..."
# (added to the watch's command line); --daemon-args "..." (replaces the daemon's pacing:
# --pw 2 --workers 40 --synth-ms 2400 --gpu-ms 3000, ~0.83 partitions/s made, 0.33 drained);
# --keep-work (leave the work folder); --enable-memory-controller (cgroup v2: write +memory into
# /sys/fs/cgroup/cgroup.subtree_control when it lacks it, as bench/oom_check.sh does; else
# refused). OUT gets at most 7 files: summary.md (also printed), samples.tsv, loop.log,
# watch.log, reports.json (the per-trace extract), box.txt and metrics.txt (with --metrics); the traces stay in the work folder /tmp/allocscope-soak-*
# (removed at the end unless --keep-work).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
if [ "${1:-}" = "--build-bins" ]; then
    BINS=${2:?--build-bins DIR}
    mkdir -p "$BINS"
    gcc -std=c11 -O2 -g -fno-omit-frame-pointer -pthread -o "$BINS/provingd-soak" "$HERE/../demo/provingd.c" || exit 1
    objdump -T "$BINS/provingd-soak" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1
    ls -l "$BINS/provingd-soak"
    exit 0
fi

BUNDLE="" A="" DAEMON="" OUT="" MINUTES=6 LIMIT_MIB=24576 PART_MB=1024 METRICS="" KEEP_WORK=0 ENABLE_MEM=0
WATCH_ARGS="" DAEMON_ARGS="--pw 2 --workers 40 --synth-ms 2400 --gpu-ms 3000" SAMPLE_S=10
usage() { sed -n '2,30p' "$0" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
    --bundle) BUNDLE=$2; shift 2 ;;
    --allocscope) A=$2; shift 2 ;;
    --daemon) DAEMON=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --minutes) MINUTES=$2; shift 2 ;;
    --limit-mib) LIMIT_MIB=$2; shift 2 ;;
    --partition-mb) PART_MB=$2; shift 2 ;;
    --metrics) METRICS=$2; shift 2 ;;
    --watch-args) WATCH_ARGS=$2; shift 2 ;;
    --daemon-args) DAEMON_ARGS=$2; shift 2 ;;
    --sample-s) SAMPLE_S=$2; shift 2 ;;
    --keep-work) KEEP_WORK=1; shift ;;
    --enable-memory-controller) ENABLE_MEM=1; shift ;;
    -h | --help) usage ;;
    *) echo "unknown option: $1" >&2; usage ;;
    esac
done
[ -n "$OUT" ] && [ -n "$DAEMON" ] || { echo "need --out and --daemon" >&2; exit 2; }
[ -n "$BUNDLE$A" ] || { echo "need --bundle or --allocscope" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "run as root (BPF, cgroups)" >&2; exit 4; }
[ -x "$DAEMON" ] || { echo "no daemon binary at $DAEMON (build it: --build-bins)" >&2; exit 2; }
DAEMON=$(readlink -f "$DAEMON")
mkdir -p "$OUT"
OUT=$(readlink -f "$OUT")
DUR_S=$(awk -v m="$MINUTES" 'BEGIN{if (m + 0 > 0) print int(m * 60 + 0.5)}')
[ -n "$DUR_S" ] || { echo "bad --minutes: $MINUTES" >&2; exit 2; }
W=$(mktemp -d /tmp/allocscope-soak-XXXX)
T0=$(date +%s)
if [ -n "$BUNDLE" ]; then
    tar xf "$BUNDLE" -C "$W" || exit 1
    A=$(ls -d "$W"/allocscope-*/)bin/allocscope
    echo "bundle $(basename "$BUNDLE") unpacked in $(($(date +%s) - T0)) s"
fi
A=$(readlink -f "$A")

# The memory cgroup: v2 (one filesystem at /sys/fs/cgroup) or v1's memory controller.
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
    CGV=2 CG=/sys/fs/cgroup/allocscope-soak-$$
    if ! grep -qw memory /sys/fs/cgroup/cgroup.subtree_control; then
        [ $ENABLE_MEM = 1 ] || {
            echo "memory controller not enabled for /sys/fs/cgroup's children: not touching it (--enable-memory-controller does)" >&2
            exit 1
        }
        echo +memory > /sys/fs/cgroup/cgroup.subtree_control || exit 1
        echo "enabled the memory controller in /sys/fs/cgroup/cgroup.subtree_control (as bench/oom_check.sh does)"
    fi
    mkdir "$CG" || exit 1
    echo $((LIMIT_MIB * 1048576)) > "$CG/memory.max"
    echo 0 > "$CG/memory.swap.max" 2>/dev/null
    LIMIT=$(cat "$CG/memory.max")
elif [ -d /sys/fs/cgroup/memory ]; then
    CGV=1 CG=/sys/fs/cgroup/memory/allocscope-soak-$$
    mkdir "$CG" || exit 1
    echo $((LIMIT_MIB * 1048576)) > "$CG/memory.limit_in_bytes"
    echo 0 > "$CG/memory.swappiness" 2>/dev/null
    LIMIT=$(cat "$CG/memory.limit_in_bytes")
else
    echo "no cgroup v2 at /sys/fs/cgroup and no v1 memory controller" >&2
    exit 1
fi
cg_usage() { if [ $CGV = 2 ]; then cat "$CG/memory.current"; else cat "$CG/memory.usage_in_bytes"; fi; }
{
    echo "date $(date -u +%FT%TZ)"
    echo "kernel $(uname -r), $(nproc) cores, $(free -g | awk '/^Mem:/{print $2}') GiB RAM"
    echo "cgroup v$CGV $CG limit $LIMIT bytes"
    echo "allocscope $A"
    echo "daemon $DAEMON --bug --partitions 1000000 --partition-mb $PART_MB $DAEMON_ARGS"
    echo "watch args: defaults${WATCH_ARGS:+ plus $WATCH_ARGS}${METRICS:+ plus --metrics 127.0.0.1:$METRICS}"
    echo "minutes $MINUTES"
    uptime
} > "$OUT/box.txt"
cat "$OUT/box.txt"

STOP=$W/stop LOOPLOG=$OUT/loop.log SAMPLES=$OUT/samples.tsv
: > "$LOOPLOG"
mkdir -p "$W/traces" "$W/daemon"
# Whatever ends the script: no restarts, the daemon SIGKILLed, the watch stopped, the cgroup removed.
cleanup() {
    touch "$STOP"
    [ -n "${LOOP:-}" ] && kill "$LOOP" 2>/dev/null
    for p in $(cat "$CG/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    [ -n "${WP:-}" ] && kill -INT "$WP" 2>/dev/null && sleep 2
    [ -d "$CG" ] && rmdir "$CG" 2>/dev/null
    [ $KEEP_WORK = 1 ] || rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck disable=SC2086
"$A" watch --pgrep "^$DAEMON --bug" -o "$W/traces" ${METRICS:+--metrics 127.0.0.1:$METRICS} $WATCH_ARGS \
    > "$OUT/watch.log" 2>&1 &
WP=$!
i=0
until grep -q watching "$OUT/watch.log" 2>/dev/null; do
    sleep 0.5
    i=$((i + 1))
    kill -0 $WP 2>/dev/null || { echo "the watch ended:"; cat "$OUT/watch.log"; exit 1; }
    [ $i -gt 240 ] && { echo "the watch did not start in 120 s:"; cat "$OUT/watch.log"; exit 1; }
done
echo "watch ready after $((i / 2)) s: $(grep -m1 watching "$OUT/watch.log")"

# The restart loop: each start writes its own pid into the cgroup, then execs the daemon.
(
    n=0
    while [ ! -e "$STOP" ]; do
        n=$((n + 1))
        # shellcheck disable=SC2016,SC2086
        sh -c 'echo "start $1 pid $$ $(date +%s.%N)" >> "$2"; echo $$ > "$3/cgroup.procs" && exec "$4" --bug --partitions 1000000 --partition-mb "$5" '"$DAEMON_ARGS" \
            sh "$n" "$LOOPLOG" "$CG" "$DAEMON" "$PART_MB" > "$W/daemon/$n.out" 2>&1
        echo "end $n status $? $(date +%s.%N)" >> "$LOOPLOG"
        [ -e "$STOP" ] || sleep 1
    done
) 2> "$W/loop.err" &
LOOP=$!

descendants() { echo "$1"; for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do descendants "$c"; done; }
cpu_s() { for p in "$@"; do sed 's/.*) //' /proc/"$p"/stat 2>/dev/null; done | awk '{s+=$12+$13} END{printf "%.1f", s/100}'; }
rss_kb() { awk '/^VmRSS:/{s+=$2} END{print s+0}' $(for p in "$@"; do echo /proc/"$p"/status; done) 2>/dev/null; }
echo -e "t_s\twatcher_rss_kb\twatcher_cpu_s\ttraces_bytes\ttraces_files\ttraces\tdaemon_rss_kb\tcgroup_bytes\tincarnations" > "$SAMPLES"
START=$(date +%s)
END=$((START + DUR_S))
while :; do
    now=$(date +%s)
    # shellcheck disable=SC2046
    wrss=$(rss_kb $(descendants $WP))
    # shellcheck disable=SC2046
    wcpu=$(cpu_s $(descendants $WP))
    tb=$(du -sb "$W/traces" | cut -f1)
    tf=$(find "$W/traces" -type f | wc -l)
    nt=$(find "$W/traces" -maxdepth 1 -name '*.allocscope' | wc -l)
    # shellcheck disable=SC2046
    drss=$(rss_kb $(cat "$CG/cgroup.procs" 2>/dev/null))
    inc=$(grep -c '^start' "$LOOPLOG")
    echo -e "$((now - START))\t$wrss\t$wcpu\t$tb\t$tf\t$nt\t$drss\t$(cg_usage)\t$inc" >> "$SAMPLES"
    [ "$now" -ge "$END" ] && break
    kill -0 $WP 2>/dev/null || { echo "the watch died during the soak"; break; }
    sleep "$SAMPLE_S"
done
[ -n "$METRICS" ] && python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$METRICS/metrics', timeout=10).read().decode())" \
    > "$OUT/metrics.txt" 2>&1

# The end: no more restarts; the incarnation under way is SIGKILLed (its trace ends "killed"), the
# watch is given 5 s to finish it, then stopped (SIGINT).
touch "$STOP"
for p in $(cat "$CG/cgroup.procs"); do kill -9 "$p" 2>/dev/null; done
wait $LOOP
sleep 5
kill -INT $WP
wait $WP
echo "watch exit status $? after $(($(date +%s) - START)) s of soak"
WP=""
rmdir "$CG" && echo "cgroup $CG removed"
echo "loop: $(grep -c '^start' "$LOOPLOG") started, statuses: $(awk '/^end/{print $4}' "$LOOPLOG" | sort | uniq -c | tr -s ' \n' ' ')"
T1=$(date +%s)
python3 "$HERE/watch_soak_summary.py" --allocscope "$A" --work "$W" --out "$OUT" --limit "$LIMIT" --cgroup "$CG" \
    --minutes "$MINUTES"
RC=$?
echo "reports and summary in $(($(date +%s) - T1)) s; total $(($(date +%s) - T0)) s"
[ $KEEP_WORK = 1 ] && echo "work folder kept: $W"
exit $RC
