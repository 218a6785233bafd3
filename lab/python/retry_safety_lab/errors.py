"""The two ways a lab run goes wrong: the lab could not run, or it ran and a check failed."""


class LabError(RuntimeError):
    """The lab could not start or stop (no binary, bad input, an upstream that does not
    answer, a port in use): nothing was verified."""


class LabFailed(AssertionError):
    """The lab ran and its verdict is a failure: a write may have been applied twice, or no
    write reached it. `report` holds the counts."""

    def __init__(self, message, report):
        super().__init__(message)
        self.report = report
