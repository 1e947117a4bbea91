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
# shellcheck source=scripts/pkgs.sh
. "$(dirname "${BASH_SOURCE[0]}")/pkgs.sh"
ensure_pkgs "${pkgs[@]}"
exit 0
