"""Cargo-built test targets: tests/targets/rustd (issue 19's Rust proving daemon).

`build_rustd()` runs `cargo build --release --offline` over Debian's crate registry
(tests/targets/rustd/.cargo/config.toml replaces crates.io with /usr/share/cargo/registry) into
tests/targets/bin/rustd-<hash of the toolchain>/ (CARGO_TARGET_DIR; ignored by git) and returns
the executable. A stamp there records the toolchain and a hash of the sources: while it matches,
cargo is not run at all (the first build takes a minute or so, a source edit a few seconds,
later calls nothing). No cargo, or
no Debian crates, is `unavailable` (a skip; a failure under CI=true: scripts/setup-host.sh
installs them).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from support import ROOT, TARGETS_SRC, find_tool, unavailable

RUSTD_SRC = TARGETS_SRC / "rustd"
BIN = ROOT / "tests" / "targets" / "bin"
DEBIAN_REGISTRY = Path("/usr/share/cargo/registry")
# crate directory prefix -> the Debian package that installs it
DEBIAN_CRATES = {
    "rayon-": "librust-rayon-dev",
    "tokio-1": "librust-tokio-dev",
    "jemalloc-sys-": "librust-jemalloc-sys-dev",
}
CARGO_ELSEWHERE = ("~/.cargo/bin/cargo", "/usr/local/cargo/bin/cargo", "/usr/bin/cargo")


def find_cargo() -> str | None:
    """$RUSTD_CARGO when set (e.g. /usr/bin/cargo: Debian's 1.65 with rustc 1.63), else cargo on
    PATH, else rustup's (~/.cargo/bin, /usr/local/cargo/bin), else Debian's."""
    if os.environ.get("RUSTD_CARGO"):
        return find_tool(os.environ["RUSTD_CARGO"])
    return find_tool("cargo", *CARGO_ELSEWHERE)


def missing_crates() -> list[str]:
    """The Debian packages whose crates are not in DEBIAN_REGISTRY."""
    have = [p.name for p in DEBIAN_REGISTRY.iterdir()] if DEBIAN_REGISTRY.is_dir() else []
    return [pkg for prefix, pkg in DEBIAN_CRATES.items() if not any(n.startswith(prefix) for n in have)]


def _sources(project: Path) -> list[Path]:
    files = [project / "Cargo.toml", project / "Cargo.lock", project / ".cargo" / "config.toml"]
    return [f for f in files if f.exists()] + sorted((project / "src").rglob("*.rs"))


def _toolchain(cargo: str, env: dict) -> str:
    """Versions of `cargo` and the rustc it runs (RUSTC, set by build_rustd)."""
    out = [
        subprocess.run([tool, "--version"], capture_output=True, text=True, env=env).stdout.strip()
        for tool in (cargo, env.get("RUSTC", "rustc"))
    ]
    return f"{cargo}: {' / '.join(out)}"


def _sources_hash(project: Path) -> str:
    """Hash of the project's sources and of the registry's crate directories."""
    h = hashlib.sha256()
    for f in _sources(project):
        h.update(str(f.relative_to(project)).encode() + b"\0" + f.read_bytes() + b"\0")
    h.update("\0".join(sorted(p.name for p in DEBIAN_REGISTRY.iterdir())).encode())
    return h.hexdigest()


def build_rustd(cargo: str | None = None) -> Path:
    """The release build of tests/targets/rustd (opt-level 3, debug info, no frame pointers),
    built with `cargo` (default find_cargo()) unless an up-to-date one is already there."""
    cargo = cargo or find_cargo()
    if cargo is None:
        unavailable("cargo is not installed (looked in PATH, ~/.cargo/bin, /usr/local/cargo/bin, /usr/bin)")
    missing = missing_crates()
    if missing:
        unavailable(f"Debian's Rust crates are not installed in {DEBIAN_REGISTRY}: {' '.join(missing)}")
    env = dict(os.environ)
    # the rustc next to this cargo (Debian's cargo with Debian's rustc, rustup's with rustup's)
    sibling = Path(cargo).with_name("rustc")
    if "RUSTC" not in env and sibling.exists():
        env["RUSTC"] = str(sibling)
    env.pop("RUSTFLAGS", None)  # the profile in Cargo.toml is the build: no frame pointers
    toolchain = _toolchain(cargo, env)
    # one target directory per toolchain and build configuration (switching keeps both builds; a
    # changed [env] or profile is a fresh build: cargo does not rerun jemalloc-sys' build script
    # for a changed CFLAGS_<target>), one stamp in it
    config = b"".join(f.read_bytes() for f in (RUSTD_SRC / "Cargo.toml", RUSTD_SRC / ".cargo" / "config.toml"))
    target_dir = BIN / f"rustd-{hashlib.sha256(toolchain.encode() + config).hexdigest()[:12]}"
    stamp = f"{toolchain}\n{_sources_hash(RUSTD_SRC)}\n"
    exe = target_dir / "release" / "rustd"
    stamp_file = target_dir / "stamp"
    if exe.exists() and stamp_file.exists() and stamp_file.read_text() == stamp:
        return exe
    env["CARGO_TARGET_DIR"] = str(target_dir)
    p = subprocess.run(
        [cargo, "build", "--release", "--offline", "--quiet"],
        cwd=RUSTD_SRC,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if p.returncode != 0:
        raise AssertionError(f"cargo build of {RUSTD_SRC} failed ({cargo}):\n{p.stderr[-4000:]}")
    stamp_file.write_text(stamp)
    return exe
