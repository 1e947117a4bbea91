"""The CUDA driver API entry points allocscope probes in libcuda.so.1 (probes/allocscope.c, "the
CUDA driver API"), and finding that library among a target's mappings.

libcudart (the runtime: cudaMalloc, cudaHostAlloc, PyTorch's pin_memory) is often linked into the
program statically, but every runtime call that allocates ends in the driver, libcuda.so.1, which
is always a shared library: probing the driver sees all of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..process.procfs import Mapping

# x86-64 argument registers, as tracer/allocators/placement.py numbers them (capstone's X86_REG_*).
from .placement import REG_CX, REG_DI, REG_SI

# symbol -> (BPF entry program, argument registers it reads). One return program, cu_return.
CUDA_FUNCS: dict[str, tuple[str, tuple[int, ...]]] = {
    "cuMemAlloc_v2": ("cu_alloc_enter", (REG_DI, REG_SI)),
    "cuMemAllocAsync": ("cu_alloc_enter", (REG_DI, REG_SI)),
    "cuMemAllocFromPoolAsync": ("cu_alloc_enter", (REG_DI, REG_SI)),
    # the per-thread-default-stream twins (nvcc --default-stream per-thread, cuGetProcAddress with
    # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM): own entry points in the real driver (580)
    "cuMemAllocAsync_ptsz": ("cu_alloc_enter", (REG_DI, REG_SI)),
    "cuMemAllocFromPoolAsync_ptsz": ("cu_alloc_enter", (REG_DI, REG_SI)),
    "cuMemAllocPitch_v2": ("cu_pitch_enter", (REG_DI, REG_SI, REG_CX)),
    "cuMemCreate": ("cu_create_enter", (REG_DI, REG_SI)),
    "cuMemHostAlloc": ("cu_host_alloc_enter", (REG_DI, REG_SI)),
    "cuMemAllocHost_v2": ("cu_host_alloc_enter", (REG_DI, REG_SI)),
    "cuMemHostRegister_v2": ("cu_register_enter", (REG_DI, REG_SI)),
    "cuMemAllocManaged": ("cu_managed_enter", (REG_DI, REG_SI)),
    "cuMemFree_v2": ("cu_free_enter", (REG_DI,)),
    "cuMemFreeAsync": ("cu_free_enter", (REG_DI,)),
    "cuMemFreeAsync_ptsz": ("cu_free_enter", (REG_DI,)),
    "cuMemRelease": ("cu_release_enter", (REG_DI,)),
    "cuMemFreeHost": ("cu_free_host_enter", (REG_DI,)),
    "cuMemHostUnregister": ("cu_unregister_enter", (REG_DI,)),
}
SONAME = "libcuda.so.1"


@dataclass
class CudaReport:
    """What was probed in the driver: meta.json `probes.cuda`."""

    module: str = ""
    attached: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    placement: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "module": self.module,
            "attached": self.attached or [],
            "skipped": self.skipped or {},
            "placement": self.placement or {},
        }


def find_driver(maps: list[Mapping]) -> str | None:
    """The driver library the target maps (libcuda.so.1 or a versioned libcuda.so.N.M), if any."""
    for m in maps:
        path = m.path.removesuffix(" (deleted)")
        if m.is_file and "x" in m.perms and os.path.basename(path).startswith("libcuda.so"):
            return path
    return None
