"""The C++ compiler AOTInductor builds a package's .so with, made to link the
shared libstdc++.

AOTInductor compiles and links the package's .so with $CXX (else g++). A
compiler that ships only a static libstdc++ (the GPU machine's /opt/gcc g++ 13:
`-print-file-name=libstdc++.so` finds nothing, libstdc++.a is there) links a
private copy of libstdc++ into the .so. Loaded into a process that already has
the shared libstdc++.so.6 (every torch process), the two copies disagree on
std::locale's facet ids, and the AOTI runtime's first std::regex
(parse_device_str, in the model's constructor) calls a wrong virtual function:
SIGSEGV inside aoti_load_package (found with bench/probes/gpu_aoti_probe.py --gdb
--diagnose on the GPU machine, 2026-11-30).

The remedy here: a folder whose libstdc++.so links to the libstdc++.so.6 the
process has loaded, handed to the linker with -L (a user -L comes before the
compiler's own folders, so the shared library wins over libstdc++.a), through a
small wrapper compiler that inductor is told to use. bench/lib/gpu_prepare.sh does the
same for the sdxl-batch build (CMake linker flags), so the program and the
package share one libstdc++.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path


def finds_shared_libstdcxx(cxx: str) -> bool:
    """Whether `cxx` links libstdc++ as a shared library by default."""
    try:
        found = subprocess.run([cxx, "-print-file-name=libstdc++.so"], capture_output=True, text=True,
                               timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return True  # cannot tell: leave the compiler alone
    return os.path.isabs(found)


def loaded_libstdcxx() -> str | None:
    """The libstdc++.so.6 this process has loaded (Linux), or None."""
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split()[-1] if line.split() else ""
            if "/libstdc++.so" in path:
                return path
    except OSError:
        pass
    return None


def use_shared_libstdcxx(log=print) -> str | None:
    """Points inductor's compiler at a wrapper that links the process's shared
    libstdc++ when the compiler would link a static copy. Returns the wrapper's
    path, or None when nothing was needed."""
    import torch  # noqa: F401 - loads libstdc++.so.6 into this process
    import torch._inductor.config as cfg
    import torch._inductor.cpp_builder as cb

    cxx = cb.get_cpp_compiler()
    if finds_shared_libstdcxx(cxx):
        return None
    lib = loaded_libstdcxx()
    if lib is None:
        log(f"aoti toolchain: {cxx} links libstdc++ statically and no libstdc++.so is loaded here; left as is")
        return None
    d = Path(tempfile.mkdtemp(prefix="aoti-cxx-"))
    (d / "libstdc++.so").symlink_to(lib)
    wrapper = d / "c++"
    wrapper.write_text(f'#!/bin/sh\nexec "{shutil.which(cxx) or cxx}" "$@" -L"{d}"\n')
    wrapper.chmod(0o755)
    cfg.cpp.cxx = (str(wrapper),)
    log(f"aoti toolchain: {cxx} has no shared libstdc++; linking the package against {lib} (through {wrapper})")
    return str(wrapper)
