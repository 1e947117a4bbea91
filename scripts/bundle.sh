#!/usr/bin/env bash
# make bundle: one relocatable tarball, dist/allocscope-VERSION-x86_64.tar.xz, that runs allocscope
# on a box without BCC, without Debian and without a network (glibc >= 2.36, python3 3.11-3.13 with
# pandas and pyarrow). Built from this Debian 12 box's packages (make host installs them):
#   lib/       libbcc + libbpf (libbpfcc, libbpf1) and every library they need (ldd closure),
#              except glibc's own; libstdc++/libgcc_s in lib/fallback/, used only when the box's
#              are older than what LLVM 14 needs (GLIBCXX_3.4.30)
#   python/    bcc (python3-bpfcc: pure Python over ctypes), allocscope's packages, and the wheels
#              allocscope needs besides pandas/pyarrow/numpy (click, pyelftools, cxxfilt,
#              rust-demangler, protobuf abi3, capstone, prometheus-client): one copy serves python 3.11-3.13
#   kernel/    Debian's newest linux-headers (common + amd64 merged, x86 only), for BCC_KERNEL_SOURCE
#              (only where the prebuilt probes, python/probes/prebuilt/, do not serve: no BTF)
#   bin/allocscope, libexec/bootstrap.py: the launcher (bundle/ in the repo)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
say() { printf 'bundle: %s\n' "$*" >&2; }

version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n1)
name=allocscope-$version
out=dist/$name-x86_64.tar.xz
stage=build/bundle/$name
libbcc=/usr/lib/x86_64-linux-gnu/libbcc.so.0
bccpy=/usr/lib/python3/dist-packages/bcc
for f in "$libbcc" "$bccpy/__init__.py"; do
  [ -e "$f" ] || { say "missing $f: install libbpfcc and python3-bpfcc (make host)"; exit 1; }
done
arch_hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1 || true)
[ -n "$arch_hdr" ] || { say "no /usr/src/linux-headers-*-amd64: install linux-headers-amd64 (make host)"; exit 1; }
common_hdr=${arch_hdr%-amd64}-common

rm -rf "$stage"
mkdir -p "$stage"/{bin,libexec,lib/fallback,python,kernel} dist

# 0. The probes compiled once (tracer/bpf/prebuilt_build.py, probes/prebuilt/): the bundle loads them on
#    any kernel with BTF, no compiler or headers used there. Rebuilt when probes/ changed.
py=.venv/bin/python; [ -x "$py" ] || py=python3
if ! "$py" -c 'from tracer.bpf import prebuilt; prebuilt.load_store()' 2>/dev/null; then
  "$py" -m tracer.bpf.prebuilt_build
fi

# 1. Shared libraries: libbcc's closure, glibc's own left to the box.
glibc_re='^(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64)\.so'
: > "$stage/lib/ORDER"
ldd "$libbcc" | awk '/=> \//{print $1, $3}' | while read -r soname path; do
  [[ $soname =~ $glibc_re ]] && continue
  case $soname in
    libstdc++.so.*|libgcc_s.so.*) cp -L "$path" "$stage/lib/fallback/$soname" ;;
    *) cp -L "$path" "$stage/lib/$soname" ;;
  esac
done
cp -L "$libbcc" "$stage/lib/libbcc.so.0"
# load order: a library after everything it needs (tsort over DT_NEEDED)
( cd "$stage/lib"
  for f in *.so* fallback/*.so*; do
    b=$(basename "$f"); echo "$b $b"
    readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | while read -r n; do echo "$n $b"; done
  done | tsort | while read -r n; do
    if [ -e "$n" ]; then echo "$n"; elif [ -e "fallback/$n" ]; then echo "fallback/$n"; fi
  done ) > "$stage/lib/ORDER"

# 2. Python: bcc, allocscope, wheels (no pandas/pyarrow/numpy: see docs/bundle.md).
cp -r "$bccpy" "$stage/python/bcc"
# bcc 0.26's one non-raw regex with '\.' warns (SyntaxWarning) on python >= 3.12: make it raw
sed -i "s/re.match(b'^.\*\\\\.cold/re.match(rb'^.*\\\\.cold/" "$stage/python/bcc/__init__.py"
for p in allocscope common tracer reports probes; do
  cp -r "$p" "$stage/python/"
done
whl=build/bundle/wheels
mkdir -p "$whl"
reqs=(click pyelftools cxxfilt rust-demangler protobuf capstone prometheus-client)
pip_dl=(python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$whl"
        --python-version 3.11 --implementation cp
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64
        --platform manylinux1_x86_64 --platform any)
for r in "${reqs[@]}"; do
  spec=$(python3 - "$r" <<'PY'
import re, sys, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
name = sys.argv[1]
print(next(d for d in deps if re.split(r"[<>=!~ ]", d)[0] == name))
PY
)
  "${pip_dl[@]}" "$spec"
done
for w in "$whl"/*.whl; do
  python3 -m zipfile -e "$w" "$stage/python/"
done
rm -rf "$stage"/python/*.dist-info/RECORD "$stage"/python/bin
find "$stage/python" -name __pycache__ -prune -exec rm -rf {} +
ls "$whl" > "$stage/python/WHEELS"

# 3. Kernel headers: one tree (common, then amd64's generated files over it), x86 only.
k=$stage/kernel
cp -a "$common_hdr/include" "$k/"
mkdir -p "$k/arch"
cp -a "$common_hdr/arch/x86" "$k/arch/"
cp -a "$common_hdr/Makefile" "$k/"
cp -aL "$arch_hdr/include/." "$k/include/"
cp -aL "$arch_hdr/arch/x86/." "$k/arch/x86/"
cp -aL "$arch_hdr/.config" "$k/" 2>/dev/null || true
# what BCC's clang never reads: other arches' bits under x86, DRM/sound/media uapi docs stay (small)
rm -rf "$k/arch/x86/boot" "$k/arch/x86/tools" "$k/arch/x86/realmode" 2>/dev/null || true
basename "$arch_hdr" | sed 's/^linux-headers-//' > "$k/DEBIAN_VERSION"

# 4. Launcher.
install -m 0755 bundle/allocscope "$stage/bin/allocscope"
install -m 0644 bundle/bootstrap.py "$stage/libexec/bootstrap.py"
echo "$version" > "$stage/VERSION"
git rev-parse --short HEAD > "$stage/COMMIT" 2>/dev/null || true

# 5. Tarball (deterministic order; xz -9e).
chmod -R u+w,go-w "$stage"
tar -C build/bundle --sort=name --owner=0 --group=0 --numeric-owner -cf - "$name" | xz ${XZ_LEVEL:--9e} -T0 > "$out.tmp"
mv "$out.tmp" "$out"
size=$(stat -c %s "$out")
say "$out: $((size / 1024 / 1024)) MiB ($size bytes)"
if [ "$size" -gt $((60 * 1024 * 1024)) ]; then
  say "over 60 MiB"; exit 1
fi
