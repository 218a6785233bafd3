# The same check without pytest: the context manager raises LabFailed (an AssertionError)
# naming the routes whose writes were applied twice.
from retry_safety_lab import Proxy, Upstream

from test_sdk import FAULTS, pay

with Upstream() as upstream:
    with Proxy(upstream.url, faults=FAULTS, writes=["POST /v1/payments"]) as lab:
        for amount in range(6):
            pay(lab.url, amount, key=f"payment-{amount}")
    print("no write applied twice:", lab.report.raw["writes"], "writes")
