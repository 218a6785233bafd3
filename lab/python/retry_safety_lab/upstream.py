"""`Upstream`: the lab's own upstream (`retry-safety-lab serve`), which honours
`Idempotency-Key`: something to point a proxy at when the SDK under test has no test server."""

import re

from ._process import LabProcess

RUNS = re.compile(r"the handler ran (\d+) times")


class Upstream:
    """`with Upstream() as upstream:` `upstream.url`; `handler_runs` once stopped."""

    def __init__(self, listen="127.0.0.1:0", startup_timeout=30.0):
        self._args = ["serve", "--listen", listen]
        self._startup_timeout = startup_timeout
        self._process = None
        self.url = None
        self.handler_runs = None

    def start(self):
        self._process = LabProcess(self._args, self._startup_timeout)
        self.url = self._process.url
        return self

    def stop(self):
        if self._process is not None:
            process, self._process = self._process, None
            process.stop(timeout=15)
            runs = [m for m in map(RUNS.search, process.stderr) if m]
            self.handler_runs = int(runs[-1].group(1)) if runs else None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def __str__(self):
        return self.url or "<retry-safety-lab serve, not started>"
