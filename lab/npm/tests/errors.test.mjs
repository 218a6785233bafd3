// The helper's bad inputs, each a clear error and no process left behind (run by
// scripts/test-lab-packages.sh against the installed packages).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import { startLab, startUpstream, findBinary, LabError, LabFailed } from "retry-safety-lab";

// This install's lab processes only (other labs may run on the machine).
const labPids = () => spawnSync("pgrep", ["-f", findBinary()], { encoding: "utf8" }).stdout.trim();

async function listening() {
  const server = createServer();
  await new Promise((done) => server.listen(0, "127.0.0.1", done));
  return server;
}

test("the CommonJS entry loads too", () => {
  const cjs = createRequire(import.meta.url)("retry-safety-lab");
  assert.equal(typeof cjs.startLab, "function");
});

test("a missing binary says what to install", async () => {
  process.env.RETRY_SAFETY_LAB_BIN = "/nonexistent/retry-safety-lab";
  try {
    await assert.rejects(startLab({ upstream: "http://127.0.0.1:1" }), (err) =>
      err instanceof LabError && /RETRY_SAFETY_LAB_BIN/.test(err.message));
  } finally {
    delete process.env.RETRY_SAFETY_LAB_BIN;
  }
});

test("the launcher runs the binary, or names what is missing", () => {
  const manifest = createRequire(import.meta.url).resolve("retry-safety-lab/package.json");
  const launcher = manifest.replace(/package\.json$/, "bin/retry-safety-lab.js");
  const ok = spawnSync(process.execPath, [launcher, "--version"], { encoding: "utf8" });
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stdout, /^retry-safety-lab \d+\.\d+\.\d+/);
  const env = { ...process.env, RETRY_SAFETY_LAB_BIN: "/nonexistent/retry-safety-lab" };
  const missing = spawnSync(process.execPath, [launcher, "--version"], { encoding: "utf8", env });
  assert.equal(missing.status, 2);
  assert.match(missing.stderr, /RETRY_SAFETY_LAB_BIN.*fix or unset it/);
});

test("an upstream that does not answer is named", async () => {
  const server = await listening();
  const port = server.address().port;
  await new Promise((done) => server.close(done)); // nothing listens there now
  await assert.rejects(startLab({ upstream: `http://127.0.0.1:${port}` }), (err) =>
    err instanceof LabError && /--upstream.*unreachable.*start the upstream/.test(err.message));
});

test("a port in use is named", async (t) => {
  const upstream = await startUpstream();
  t.after(() => upstream.stop());
  const taken = await listening();
  t.after(() => taken.close());
  await assert.rejects(
    startLab({ upstream: upstream.url, listen: `127.0.0.1:${taken.address().port}` }),
    (err) => err instanceof LabError && /--listen.*pass another listen/.test(err.message));
});

test("a run that reached nothing fails, and no process is left", async () => {
  const upstream = await startUpstream();
  const lab = await startLab({ upstream: upstream.url });
  await assert.rejects(lab.check(), (err) =>
    err instanceof LabFailed && /no write reached the lab/.test(err.message) && err.report.writes === 0);
  await upstream.stop();
  assert.equal(labPids(), "");
});

test("a lab never stopped neither holds node open nor outlives it", async () => {
  const script = `import { startLab, startUpstream } from "retry-safety-lab";
    const upstream = await startUpstream();
    await startLab({ upstream: upstream.url });`;
  const run = spawnSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8", timeout: 20000 });
  assert.equal(run.status, 0, `node did not end by itself: ${run.stderr}`);
  for (let i = 0; i < 50 && labPids() !== ""; i++) await new Promise((done) => setTimeout(done, 100));
  assert.equal(labPids(), "");
});
