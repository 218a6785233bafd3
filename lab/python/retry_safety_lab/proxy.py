"""`Proxy`: the lab's proxy in front of an upstream, as a context manager. On exit it stops
the proxy, reads its counts and raises `LabFailed` when a write may have been applied twice
or none reached it (a run that reached nothing verified nothing)."""

import json

from ._process import LabProcess
from .errors import LabError, LabFailed
from .report import Report


def _listed(value):
    return value if isinstance(value, str) else ",".join(value)


class Proxy:
    """`Proxy(upstream_url, faults=..., writes=[...])`: `.url` is the proxy's; `.report` the
    counts once stopped. Options are the CLI's `proxy` flags (`retry-safety-lab help`)."""

    def __init__(self, upstream, *, faults=None, listen="127.0.0.1:0", writes=(), reads=(),
                 op_header=None, op_id=None, key_header=None, replayed_header=None,
                 slow_ms=None, max_body=None, max_applied_twice=0, drain_ms=5000,
                 extra_args=(), startup_timeout=30.0):
        args = ["proxy", "--upstream", str(upstream), "--listen", listen, "--json",
                "--max-applied-twice", str(max_applied_twice), "--drain-ms", str(drain_ms)]
        flags = {"--faults": faults and _listed(faults), "--op-header": op_header,
                 "--op-id": op_id, "--key-header": key_header,
                 "--replayed-header": replayed_header, "--slow-ms": slow_ms,
                 "--max-body": max_body}
        for flag, value in flags.items():
            if value is not None:
                args += [flag, str(value)]
        for flag, rules in (("--write", writes), ("--read", reads)):
            for rule in [rules] if isinstance(rules, str) else rules:
                args += [flag, rule]
        self._args = [*args, *extra_args]
        self._drain_s = drain_ms / 1000
        self._startup_timeout = startup_timeout
        self._process = None
        self.url = None
        self.report = None

    def start(self):
        self._process = LabProcess(self._args, self._startup_timeout)
        self.url = self._process.url
        return self

    def stop(self) -> Report:
        """Stops the proxy (once) and returns its counts, whatever the verdict."""
        if self.report is None and self._process is not None:
            process, self._process = self._process, None
            status, out = process.stop(timeout=self._drain_s + 15)
            try:
                self.report = Report(json.loads(out))
            except ValueError:
                raise LabError(
                    f"retry-safety-lab proxy exited {status} without its JSON counts: "
                    f"{process.error_line() or out.strip() or 'no output'}"
                ) from None
        return self.report

    def check(self) -> Report:
        """Stops the proxy; raises `LabFailed` (an AssertionError) unless the run passed."""
        report = self.stop()
        if not report.passed:
            raise LabFailed(report.message(), report)
        return report

    def __enter__(self):
        return self.start()

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.check()
        else:
            # The block's own error wins; the proxy is stopped either way.
            try:
                self.stop()
            except LabError:
                pass
        return False

    def __str__(self):
        return self.url or "<retry-safety-lab proxy, not started>"
