"""allocscope's bundle bootstrap: bundled python packages first on sys.path, BCC's libraries
loaded from lib/ by absolute path (so nothing is put in LD_LIBRARY_PATH or PYTHONPATH for the
programs allocscope launches), bundled kernel headers for BCC when the box has none."""

import ctypes
import os
import platform
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(HERE, "lib")
NEED_CXX = b"GLIBCXX_3.4.30"  # LLVM 14 / libclang-cpp from Debian 12 (GCC 12)
SYSDIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/usr/lib", "/lib")


def _system_lib(soname):
    for d in SYSDIRS:
        p = os.path.join(d, soname)
        if os.path.exists(p):
            return p
    return None


def _use_system(soname):
    """libstdc++/libgcc_s: the box's own when new enough (its programs and python extensions may
    need a newer one than the bundle's), else the bundle's."""
    p = _system_lib(soname)
    if p is None:
        return False
    if soname.startswith("libstdc++"):
        try:
            with open(p, "rb") as f:
                return NEED_CXX in f.read()
        except OSError:
            return False
    return True


def preload():
    with open(os.path.join(LIB, "ORDER")) as f:
        order = [line.strip() for line in f if line.strip()]
    for rel in order:
        soname = os.path.basename(rel)
        if rel.startswith("fallback/") and _use_system(soname):
            ctypes.CDLL(soname, mode=ctypes.RTLD_GLOBAL)
            continue
        ctypes.CDLL(os.path.join(LIB, rel), mode=ctypes.RTLD_GLOBAL)


def kernel_headers():
    if os.environ.get("BCC_KERNEL_SOURCE"):
        return
    rel = platform.release()
    if os.path.exists(f"/lib/modules/{rel}/build/include/generated/autoconf.h"):
        return
    if os.path.exists("/sys/kernel/kheaders.tar.xz"):
        return
    # BCC (src/cc/frontends/clang/loader.cc) reads BCC_KERNEL_SOURCE instead of /lib/modules
    os.environ["BCC_KERNEL_SOURCE"] = os.path.join(HERE, "kernel")
    os.environ["ALLOCSCOPE_BUNDLED_HEADERS"] = "1"


def main():
    if sys.version_info < (3, 11):  # noqa: UP036 (run by any python3: says which one is needed)
        sys.exit(
            f"allocscope needs python >= 3.11 (this is {platform.python_version()} at {sys.executable}); "
            "ALLOCSCOPE_PYTHON=/path/to/python3 picks another"
        )
    sys.path.insert(0, os.path.join(HERE, "python"))
    os.environ["ALLOCSCOPE_BUNDLE"] = HERE
    kernel_headers()
    try:
        preload()
    except OSError as e:
        sys.exit(
            f"allocscope bundle: cannot load BCC's libraries from {LIB}: {e}\n"
            "(the bundle needs glibc >= 2.36 on x86-64)"
        )
    missing = []
    for mod in ("pandas", "pyarrow", "numpy"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        sys.exit(
            f"allocscope bundle: {sys.executable} has no {', '.join(missing)}; the bundle relies on the "
            "box's pandas (>= 2.0) and pyarrow (>= 14): pip install pandas pyarrow, or "
            "ALLOCSCOPE_PYTHON=/path/to/python3 with them"
        )
    sys.argv[0] = os.path.join(HERE, "bin", "allocscope")
    from allocscope.cli.entry import main as entry  # noqa: PLC0415

    sys.exit(entry())


if __name__ == "__main__":
    main()
