"""Facts about the machine that bound what a user may ask for (sizes, workers), and the
OpenGL it draws MuJoCo's frames with when it has no display."""

from __future__ import annotations

import ctypes
import os
import sys

# MUJOCO_GL's choices without a display, in order, each with the libraries it loads.
HEADLESS_GL = {"egl": ("libEGL.so.1",), "osmesa": ("libOSMesa.so.8", "libOSMesa.so.6")}
# What puts them on a Debian or Ubuntu machine.
GL_PACKAGES = "apt-get install libegl1 libegl-mesa0 libgl1-mesa-dri (EGL), or libosmesa6 (OSMesa)"


def physical_memory() -> int:
    """Bytes of RAM this machine has."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def headless_gl() -> str | None:
    """The first of ``HEADLESS_GL`` whose library loads here (None: neither)."""
    for backend, libraries in HEADLESS_GL.items():
        if any(_loads(library) for library in libraries):
            return backend
    return None


def choose_mujoco_gl() -> None:
    """Set ``MUJOCO_GL`` to ``headless_gl()`` on Linux where the user has not set it: mujoco
    reads it when first imported, so the command's start calls this. Left unset where no
    library loads: filming MuJoCo is then refused in one line saying what to install
    (``rlspeed.video``)."""
    if "MUJOCO_GL" in os.environ or not sys.platform.startswith("linux"):
        return
    if (backend := headless_gl()) is not None:
        os.environ["MUJOCO_GL"] = backend


def _loads(library: str) -> bool:
    try:
        ctypes.CDLL(library)
    except OSError:
        return False
    return True
