#!/usr/bin/env bash
# Host set-up for allocscope: Debian packages, kernel headers, tracefs.
# Idempotent; needs root. Run by `make setup` (and so by `make demo` / `make test`).
set -euo pipefail

say() { printf 'setup: %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
  say "must run as root (BPF needs it); try: sudo make $*"
  exit 1
fi

# 1. Debian packages. python3-bpfcc = BCC's Python bindings (NOT the PyPI 'bcc').
# libc6-dbg: main_arena's address for the glibc census (tracer/allocators/census.py; without it, found by
# shape, tests/test_census_bpf.py checks both); chromium + fonts: the HTML report's render test; bpfcc-tools: memleak for bench/ comparisons;
# redis-server + redis-tools: the soak (bench/soak.py, tests/test_soak_bpf.py). What tests need
# and would otherwise skip (a failure under CI=true, tests/support.py): binutils (nm, objdump,
# objcopy, strip, readelf) and dwz for tests/test_symbolize.py, libjemalloc2 for the jemalloc
# tests, tcmalloc (minimal and full) and mimalloc for tests/test_allocators_bpf.py, rustc for the
# Rust target of tests/test_unwind_bpf.py (Debian's, unless one is there), tmux for the
# full-screen `allocscope top` test (tests/test_top_bpf.py drives it in a real terminal); the
# crates of tests/targets/rustd (tests/test_rustd_bpf.py, built offline from
# /usr/share/cargo/registry): librust-rayon-dev, librust-tokio-dev, librust-jemalloc-sys-dev, and
# cargo (Debian's, unless one is there). clang-format: `make lint` checks the C of probes/ and tracer/.
# prometheus (+ promtool): tests/test_prometheus_bpf.py runs its own server on loopback against
# `--metrics`, and checks contrib/prometheus/ with promtool; the package's own service is disabled.
pkgs=(python3-bpfcc libbpfcc linux-headers-amd64 gcc g++ make python3-venv libc6-dev libc6-dbg binutils dwz
      chromium fonts-dejavu-core bpfcc-tools redis-server redis-tools libjemalloc2
      libtcmalloc-minimal4 libgoogle-perftools4 libmimalloc2.0 tmux
      librust-rayon-dev librust-tokio-dev librust-jemalloc-sys-dev clang-format prometheus)
if ! command -v rustc >/dev/null && [ ! -x "$HOME/.cargo/bin/rustc" ] && [ ! -x /usr/local/cargo/bin/rustc ]; then
  pkgs+=(rustc)
fi
if ! command -v cargo >/dev/null && [ ! -x "$HOME/.cargo/bin/cargo" ] && [ ! -x /usr/local/cargo/bin/cargo ]; then
  pkgs+=(cargo)
fi
# shellcheck source=scripts/pkgs.sh
. "$(dirname "${BASH_SOURCE[0]}")/pkgs.sh"
had_prometheus=$(dpkg-query -W -f='${Status}' prometheus 2>/dev/null | grep -c "install ok installed" || true)
ensure_pkgs "${pkgs[@]}"
if [ "$had_prometheus" = 0 ] && [ -d /run/systemd/system ]; then
  systemctl disable --now prometheus >/dev/null 2>&1 || true  # installed for the tests: no server left listening
fi

# 2. Kernel headers: BCC compiles against /lib/modules/$(uname -r)/build. When no
#    package matches the running kernel, link the newest Debian headers there.
kver=$(uname -r)
moddir=/lib/modules/$kver
if [ ! -e "$moddir/build/include/generated/autoconf.h" ] && [ ! -e /sys/kernel/kheaders.tar.xz ]; then
  arch_hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$arch_hdr" ]; then
    say "no linux-headers-*-amd64 under /usr/src after installing linux-headers-amd64"
    exit 1
  fi
  common_hdr=${arch_hdr%-amd64}-common
  mkdir -p "$moddir"
  ln -sfn "$arch_hdr" "$moddir/build"
  [ -d "$common_hdr" ] && ln -sfn "$common_hdr" "$moddir/source"
  say "linked $arch_hdr as headers for kernel $kver"
fi

# 3. tracefs (uprobes and tracepoints are registered through it).
if [ ! -e /sys/kernel/tracing/uprobe_events ]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi
if [ ! -e /sys/kernel/tracing/uprobe_events ] && [ ! -e /sys/kernel/debug/tracing/uprobe_events ]; then
  mount -t debugfs nodev /sys/kernel/debug 2>/dev/null || true
fi
if [ ! -e /sys/kernel/tracing/uprobe_events ] && [ ! -e /sys/kernel/debug/tracing/uprobe_events ]; then
  say "tracefs is not available (no uprobe_events); is CONFIG_UPROBE_EVENTS on?"
  exit 1
fi
exit 0
