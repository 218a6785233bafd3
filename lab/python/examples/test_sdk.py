# An SDK proving itself with the lab's pytest fixture. The first test is EXPECTED TO FAIL:
# the lab catches the careless client's resent payments. The second passes: the same client,
# with an Idempotency-Key per payment.
import json
import urllib.error
import urllib.request
import uuid

FAULTS = "none,drop-after-apply,503-after-apply"


def pay(base_url, amount, key=None):
    """POST /v1/payments, retried on any failure, as a careless SDK does."""
    headers = {"content-type": "application/json"}
    if key:
        headers["idempotency-key"] = key
    for _ in range(3):
        req = urllib.request.Request(f"{base_url}/v1/payments", method="POST", headers=headers,
                                     data=json.dumps({"amount": amount}).encode())
        try:
            with urllib.request.urlopen(req, timeout=5) as res:
                return json.load(res)
        except (urllib.error.URLError, ConnectionError):
            continue
    raise RuntimeError("payment failed after 3 attempts")


def test_retries_without_keys(retry_safety_lab, retry_safety_lab_upstream):
    lab = retry_safety_lab(retry_safety_lab_upstream, faults=FAULTS,
                           writes=["POST /v1/payments"])
    for amount in range(6):
        pay(lab.url, amount)


def test_retries_with_keys(retry_safety_lab, retry_safety_lab_upstream):
    lab = retry_safety_lab(retry_safety_lab_upstream, faults=FAULTS,
                           writes=["POST /v1/payments"])
    for amount in range(6):
        pay(lab.url, amount, key=str(uuid.uuid4()))
