// An SDK proving itself with the lab under node:test. The first test is EXPECTED TO FAIL:
// the lab catches the careless client's resent payments. The second passes: the same client,
// with an Idempotency-Key per payment.
import { test } from "node:test";
import { randomUUID } from "node:crypto";
import { startLab, startUpstream } from "retry-safety-lab";

const FAULTS = "none,drop-after-apply,503-after-apply";

// POST /v1/payments, retried on any failure, as a careless SDK does.
async function pay(baseUrl, amount, key) {
  const headers = { "content-type": "application/json", ...(key && { "idempotency-key": key }) };
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      const res = await fetch(`${baseUrl}/v1/payments`, {
        method: "POST", headers, body: JSON.stringify({ amount }), signal: AbortSignal.timeout(5000),
      });
      if (res.ok) return await res.json();
    } catch {} // a lost answer: try again
  }
  throw new Error("payment failed after 3 attempts");
}

async function withLab(t, run) {
  const upstream = await startUpstream();
  t.after(() => upstream.stop());
  const lab = await startLab({ upstream: upstream.url, faults: FAULTS, writes: ["POST /v1/payments"] });
  t.after(() => lab.stop()); // stopped even when the test fails
  await run(lab.url);
  await lab.check(); // throws LabFailed naming the writes applied twice
}

test("retries without keys", (t) =>
  withLab(t, async (url) => {
    for (let amount = 0; amount < 6; amount++) await pay(url, amount);
  }));

test("retries with keys", (t) =>
  withLab(t, async (url) => {
    for (let amount = 0; amount < 6; amount++) await pay(url, amount, randomUUID());
  }));
