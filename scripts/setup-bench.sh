#!/usr/bin/env bash
# Bench-only Debian packages (root, idempotent), run by `make bench` after `make setup`:
# heaptrack for bench/overhead.py's heaptrack configuration, gdb for `heaptrack -p` (it injects
# its library into a running process with gdb). `make setup` / `make test` / `make demo` do not
# install these.
set -euo pipefail

say() { printf 'setup-bench: %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
  say "must run as root; try: sudo make bench"
  exit 1
fi

pkgs=(heaptrack gdb)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
exit 0
