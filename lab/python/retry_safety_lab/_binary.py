"""Finds the `retry-safety-lab` binary the wheel installed (as ruff's `find_ruff_bin`)."""

import os
import shutil
import sys
import sysconfig

from .errors import LabError

ENV = "RETRY_SAFETY_LAB_BIN"
NAME = "retry-safety-lab" + (".exe" if sys.platform == "win32" else "")


def find_binary() -> str:
    """The binary's path: $RETRY_SAFETY_LAB_BIN, else this interpreter's scripts directory
    (where pip put it, activated or not), else PATH."""
    override = os.environ.get(ENV)
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        raise LabError(f"${ENV} is {override!r}, which is not an executable file: fix or unset it")
    looked = []
    schemes = [sysconfig.get_path("scripts")]
    user = sysconfig.get_preferred_scheme("user") if hasattr(sysconfig, "get_preferred_scheme") else None
    if user:
        schemes.append(sysconfig.get_path("scripts", scheme=user))
    for directory in schemes:
        path = os.path.join(directory, NAME)
        looked.append(directory)
        if os.path.isfile(path):
            return path
    found = shutil.which(NAME)
    if found:
        return found
    raise LabError(
        f"the retry-safety-lab binary is not installed for this platform ({sys.platform}, "
        f"looked in {', '.join(looked)} and PATH): `pip install retry-safety-lab` ships it for "
        "Linux (x86_64, aarch64), macOS and Windows; elsewhere `cargo install retry-safety-lab` "
        f"and put it on PATH or set ${ENV}"
    )
