"""One lab process: started with its stdin as the stop switch (`--stop-on-stdin-close`, on
any OS; if this interpreter dies the pipe closes and the lab stops too), its address read
from the line it announces, its stderr kept for error messages."""

import re
import subprocess
import threading

from ._binary import find_binary
from .errors import LabError

ANNOUNCED = re.compile(r"listening on (http://[^;\s]+)")

# What to do about the lab's own one-line errors, by the flag they name.
HINTS = {
    "--listen": "the address is in use or not this machine's: pass another listen=, or none for a free port",
    "--upstream": "start the upstream before the lab and check its URL",
}


class LabProcess:
    def __init__(self, args, startup_timeout=30.0):
        self.args = [find_binary(), *args, "--stop-on-stdin-close"]
        try:
            self.child = subprocess.Popen(
                self.args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as err:
            raise LabError(f"cannot run {self.args[0]}: {err}") from err
        self.stderr = []
        self._announced = threading.Event()
        self.url = None
        # Read stderr to its end all along, so the pipe never fills and blocks the lab.
        self.stdout = []
        self._readers = [
            threading.Thread(target=self._read_stderr, daemon=True),
            threading.Thread(target=lambda: self.stdout.append(self.child.stdout.read()), daemon=True),
        ]
        for reader in self._readers:
            reader.start()
        if not self._announced.wait(startup_timeout) or self.url is None:
            self.kill()
            why = self.error_line() or f"no address announced in {startup_timeout:.0f} s"
            raise LabError(f"retry-safety-lab {args[0]} did not start: {why}{self._hint(why)}")

    def _read_stderr(self):
        for raw in self.child.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            self.stderr.append(line)
            found = ANNOUNCED.search(line)
            if found and self.url is None:
                self.url = found.group(1)
                self._announced.set()
        self._announced.set()  # ended without announcing: it failed

    def error_line(self):
        return next((line for line in self.stderr if "listening on" not in line), "")

    @staticmethod
    def _hint(why):
        return next((f" ({hint})" for flag, hint in HINTS.items() if flag in why), "")

    def stop(self, timeout):
        """Closes stdin (the lab stops as on SIGTERM), waits; kills it past `timeout`.
        Returns (exit status, stdout)."""
        if not self.child.stdin.closed:
            self.child.stdin.close()
        try:
            status = self.child.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise LabError(f"retry-safety-lab did not stop within {timeout:.0f} s; killed") from None
        for reader in self._readers:
            reader.join(5)
        return status, b"".join(self.stdout).decode("utf-8", "replace")

    def kill(self):
        if self.child.poll() is None:
            self.child.kill()
        self.child.wait()
        if not self.child.stdin.closed:
            self.child.stdin.close()
