"""allocscope's bundle bootstrap: bundled python packages first on sys.path, BCC's libraries
loaded from lib/ by absolute path (so nothing is put in LD_LIBRARY_PATH or PYTHONPATH for the
programs allocscope launches), bundled kernel headers for BCC when the box has none."""

import ctypes
import importlib.machinery
import importlib.util
import marshal
import os
import platform
import sys
import threading

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


def _order():
    with open(os.path.join(LIB, "ORDER")) as f:
        return [line.strip() for line in f if line.strip()]


def _load(rel):
    soname = os.path.basename(rel)
    if rel.startswith("fallback/") and _use_system(soname):
        ctypes.CDLL(soname, mode=ctypes.RTLD_GLOBAL)
    else:
        ctypes.CDLL(os.path.join(LIB, rel), mode=ctypes.RTLD_GLOBAL)


def preload():
    for rel in _order():
        _load(rel)


# What is needed before BCC: libbpf (tracer/bpf/kernel_btf.py reads the kernel's BTF with it) and
# what it links. The rest — libbcc with LLVM and clang, ~150 MB — is loaded when `bcc` is first
# imported, in the thread that builds the probes (tracer/bpf/early.py), not before the CLI runs.
EAGER = ("libz.so.1", "libelf.so.1", "libbpf.so.1")


class _BccLibraries:
    """A meta path finder that loads the bundle's libraries at the first `import bcc` (then steps
    aside: the import itself is the normal one)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.done = False

    def find_spec(self, name, path=None, target=None):
        if name == "bcc" and not self.done:
            with self.lock:
                if not self.done:
                    preload()
                    self.done = True
        return None


def preload_lazily():
    order = _order()
    for rel in order:
        if os.path.basename(rel) in EAGER:
            _load(rel)
    sys.meta_path.insert(0, _BccLibraries())


class _KeepBytecode(importlib.machinery.SourceFileLoader):
    """The loader of the bundle's own modules where PYTHONDONTWRITEBYTECODE is set (as on many
    boxes' environments): it still keeps their bytecode, beside them in the bundle, so a start
    does not compile ~30k lines of allocscope again (0.6-0.9 s of the GPU box's warm start). The
    box's own packages are left to the box's setting."""

    def source_to_code(self, data, path, *, _optimize=-1):
        code = super().source_to_code(data, path, _optimize=_optimize)
        if sys.dont_write_bytecode:
            try:
                st = os.stat(path)
                header = importlib.util.MAGIC_NUMBER + b"\0\0\0\0"  # PEP 552: a timestamp pyc
                header += (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
                header += (len(data) & 0xFFFFFFFF).to_bytes(4, "little")
                self.set_data(importlib.util.cache_from_source(path), header + marshal.dumps(code))
            except (OSError, NotImplementedError, ValueError):
                pass  # a read-only bundle: compiled each start, as before
        return code


def keep_bytecode(root):
    """Finders for `root` (the bundle's python/) and the packages under it use _KeepBytecode."""
    m = importlib.machinery
    hook = m.FileFinder.path_hook(
        (m.ExtensionFileLoader, m.EXTENSION_SUFFIXES),
        (_KeepBytecode, m.SOURCE_SUFFIXES),
        (m.SourcelessFileLoader, m.BYTECODE_SUFFIXES),
    )

    def ours(path):
        if path == root or path.startswith(root + os.sep):
            return hook(path)
        raise ImportError("not the bundle's")

    sys.path_hooks.insert(0, ours)
    sys.path_importer_cache.pop(root, None)


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
    keep_bytecode(os.path.join(HERE, "python"))
    os.environ["ALLOCSCOPE_BUNDLE"] = HERE
    kernel_headers()
    try:
        if os.environ.get("ALLOCSCOPE_PRELOAD") == "1":
            preload()  # everything now (as before: a library that fails to load fails here)
        else:
            preload_lazily()
    except OSError as e:
        sys.exit(
            f"allocscope bundle: cannot load BCC's libraries from {LIB}: {e}\n"
            "(the bundle needs glibc >= 2.36 on x86-64)"
        )
    # found, not imported: importing pandas and pyarrow here took ~0.5-1 s before the CLI ran
    # (the recorder imports them in a thread, beside the probes' build)
    missing = [mod for mod in ("pandas", "pyarrow", "numpy") if importlib.util.find_spec(mod) is None]
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
