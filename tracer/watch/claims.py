"""One watch per program name per box (tracer/watch/gate.py holds a watched name's execs).

Two gates that hold the same program name each let go (SIGCONT) what the other holds, so an
incarnation would run while the other watch's probes attach, its first allocations missed. A
watch therefore claims each name it holds: an exclusive flock(2) on
`$ALLOCSCOPE_RUN_DIR/watch-HEX.lock` (default /run/allocscope; HEX: the name's first 15 bytes,
as the kernel keeps a comm), with its pid written inside for the message of the one refused. The
kernel drops the lock when the watch ends, however it ends (SIGKILL included); the files stay
(a few bytes each), as unlinking a lock file races with the next opener.
"""

from __future__ import annotations

import fcntl
import os
import tempfile

from common.errors import PermissionProblem

RUN_DIR_ENV = "ALLOCSCOPE_RUN_DIR"


def run_dir() -> str:
    """$ALLOCSCOPE_RUN_DIR, else /run/allocscope where /run is writable, else a folder of this
    user's in the temporary directory (a box without /run: every watch there falls back alike)."""
    if os.environ.get(RUN_DIR_ENV):
        return os.environ[RUN_DIR_ENV]
    if os.access("/run", os.W_OK):
        return "/run/allocscope"
    return os.path.join(tempfile.gettempdir(), f"allocscope-run-{os.geteuid()}")


def lock_name(comm: str) -> str:
    return f"watch-{comm.encode()[:15].hex()}.lock"


class NameClaims:
    """The program names this watch holds at their exec, each claimed box-wide."""

    def __init__(self, directory: str | None = None) -> None:
        self.dir = directory or run_dir()
        self.fds: dict[bytes, int] = {}

    def claim(self, comm: str) -> int | None:
        """Claim `comm` for this watch: None when it is ours (now or already), else the pid of the
        watch that holds it (0 when its file says none)."""
        key = comm.encode()[:15]
        if key in self.fds:
            return None
        try:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
            st = os.stat(self.dir)
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                raise OSError(0, "owned by another user or writable by others")
            fd = os.open(
                os.path.join(self.dir, lock_name(comm)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600
            )
        except OSError as e:
            raise PermissionProblem(
                f"cannot claim {comm!r} for this watch in {self.dir} ({e.strerror}); set {RUN_DIR_ENV} to a "
                "directory of root's"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = int(os.pread(fd, 32, 0).split()[0])
            except (OSError, ValueError, IndexError):
                holder = 0
            os.close(fd)
            return holder
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n{comm}\n".encode(), 0)
        self.fds[key] = fd
        return None

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
