"""reuse_large_allocations(): keeps glibc's malloc from giving every large message fresh pages.

By default glibc maps each block above a sliding threshold on its own and hands the top of a heap
back to the system as soon as a little is free there, so a process that sends and receives tensors
of a few hundred KB or more touches fresh pages on every call: one page fault per 4 KiB. Measured
with this package's Client at 512 rows of d_model 512 (1 MiB each way): ~730 page faults and 4.1-4.3
ms of the process's CPU per call by default, 20 and 2.3-2.7 ms after this call. It fixes the
thresholds (blocks under 32 MiB come from the heaps; a heap keeps up to 64 MiB of free top), as
attnserve-cli and the server do. What the process frees then stays resident for reuse;
ctypes.CDLL(None).malloc_trim(0) hands it back when the process must shrink after a burst.

Process-wide: call it once, early, from the application (a library should not choose for it).
"""
import ctypes

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def reuse_large_allocations() -> bool:
    """Sets glibc's malloc thresholds for reuse of large blocks (see the module's docstring).
    Returns True when both were set, False where malloc is not glibc's (then nothing changed)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(mallopt(_M_TRIM_THRESHOLD, 64 << 20))
