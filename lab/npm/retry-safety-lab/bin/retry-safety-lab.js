#!/usr/bin/env node
"use strict";
// `npx retry-safety-lab ...`: runs the platform package's binary with these arguments,
// forwarding signals (a CI job's SIGTERM reaches the proxy, which prints its counts) and
// its exit status.
const { spawn } = require("node:child_process");
const { findBinary } = require("../lib/binary.js");

let bin;
try {
  bin = findBinary();
} catch (err) {
  console.error(`retry-safety-lab: ${err.message}`);
  process.exit(2);
}
const child = spawn(bin, process.argv.slice(2), { stdio: "inherit" });
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  process.on(signal, () => child.kill(signal));
}
child.on("error", (err) => {
  console.error(`retry-safety-lab: cannot run ${bin}: ${err.message}`);
  process.exit(2);
});
child.on("exit", (code, signal) => {
  if (signal) {
    process.removeAllListeners(signal);
    process.kill(process.pid, signal);
  } else {
    process.exit(code);
  }
});
