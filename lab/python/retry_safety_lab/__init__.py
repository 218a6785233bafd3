"""The retry-safety-lab fault lab from Python: `Proxy` and `Upstream` context managers, and a
pytest plugin (`retry_safety_lab` fixture) registered when the wheel is installed."""

from importlib.metadata import PackageNotFoundError, version

from ._binary import find_binary
from .errors import LabError, LabFailed
from .proxy import Proxy
from .report import Report
from .upstream import Upstream

try:
    __version__ = version("retry-safety-lab")
except PackageNotFoundError:  # run from the source tree
    __version__ = "0+unknown"

__all__ = ["Proxy", "Upstream", "Report", "LabError", "LabFailed", "find_binary", "__version__"]
