"""`python -m retry_safety_lab ...` runs the binary, for when its scripts directory is not on PATH."""

import os
import subprocess
import sys

from ._binary import find_binary

if __name__ == "__main__":
    binary = find_binary()
    if sys.platform == "win32":
        sys.exit(subprocess.call([binary, *sys.argv[1:]]))
    os.execv(binary, [binary, *sys.argv[1:]])
