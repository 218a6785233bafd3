"use strict";
// The retry-safety-lab fault lab from Node: `startLab` runs the proxy in front of an upstream,
// `startUpstream` the lab's own upstream. Plain CommonJS without dependencies, so node:test,
// Jest and Vitest all load it (index.mjs re-exports it for `import`).
const { findBinary } = require("./binary.js");
const { LabError, LabFailed } = require("./errors.js");
const { startProcess, stopProcess } = require("./process.js");
const { failureMessage } = require("./report.js");

const list = (v) => (typeof v === "string" ? v : v.join(","));

/**
 * Starts `retry-safety-lab proxy` in front of `upstream` (options as the CLI's `proxy` flags).
 * Resolves to `{ url, stop(), check() }`: `stop()` ends it and resolves to its counts (the
 * `--json` report); `check()` stops it and rejects with `LabFailed` unless the run passed.
 * Both may be called again (the same counts); call `stop` in an after hook.
 */
async function startLab(options) {
  const { upstream, faults, listen = "127.0.0.1:0", writes = [], reads = [], opHeader, opId,
    keyHeader, replayedHeader, slowMs, maxBody, maxAppliedTwice = 0, drainMs = 5000,
    extraArgs = [], startupTimeoutMs } = options;
  if (!upstream) throw new LabError("startLab: `upstream` (the URL to forward to) is required");
  const args = ["proxy", "--upstream", String(upstream), "--listen", listen, "--json",
    "--max-applied-twice", String(maxAppliedTwice), "--drain-ms", String(drainMs)];
  const flags = { "--faults": faults && list(faults), "--op-header": opHeader, "--op-id": opId,
    "--key-header": keyHeader, "--replayed-header": replayedHeader, "--slow-ms": slowMs,
    "--max-body": maxBody };
  for (const [flag, value] of Object.entries(flags)) {
    if (value !== undefined && value !== null) args.push(flag, String(value));
  }
  for (const rule of [].concat(writes)) args.push("--write", rule);
  for (const rule of [].concat(reads)) args.push("--read", rule);
  args.push(...extraArgs);
  const lab = await startProcess(args, { startupTimeoutMs });
  let stopped;
  const stop = () =>
    (stopped ??= stopProcess(lab, drainMs + 15000).then((code) => {
      try {
        return JSON.parse(lab.stdout);
      } catch {
        const why = lab.stderr.find((l) => l.trim() && !l.includes("listening on")) || lab.stdout.trim();
        throw new LabError(`retry-safety-lab proxy exited ${code} without its JSON counts: ${why || "no output"}`);
      }
    }));
  const check = async () => {
    const report = await stop();
    if (!report.pass) throw new LabFailed(failureMessage(report), report);
    return report;
  };
  return { url: lab.url, stop, check };
}

/** Starts `retry-safety-lab serve` (an upstream honouring Idempotency-Key): `{ url, stop() }`. */
async function startUpstream({ listen = "127.0.0.1:0", startupTimeoutMs } = {}) {
  const lab = await startProcess(["serve", "--listen", listen], { startupTimeoutMs });
  let stopped;
  return { url: lab.url, stop: () => (stopped ??= stopProcess(lab, 15000)) };
}

module.exports = { startLab, startUpstream, findBinary, failureMessage, LabError, LabFailed };
