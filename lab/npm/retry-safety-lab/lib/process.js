"use strict";
// One lab process: its stdin is the stop switch (`--stop-on-stdin-close`, on any OS; if node
// dies the pipe closes and the lab stops too), its URL read from the line it announces.
const { spawn } = require("node:child_process");
const { findBinary } = require("./binary.js");
const { LabError } = require("./errors.js");

const ANNOUNCED = /listening on (http:\/\/[^;\s]+)/;
// What to do about the lab's own one-line errors, by the flag they name.
const HINTS = {
  "--listen": "the address is in use or not this machine's: pass another listen, or none for a free port",
  "--upstream": "start the upstream before the lab and check its URL",
};

// Running children, killed if node exits without stopping them (a test that forgot `stop`).
const running = new Set();
process.on("exit", () => {
  for (const child of running) child.kill();
});

function startProcess(args, { startupTimeoutMs = 30000 } = {}) {
  const bin = findBinary();
  return new Promise((resolve, reject) => {
    const child = spawn(bin, [...args, "--stop-on-stdin-close"], { stdio: ["pipe", "pipe", "pipe"] });
    const lab = { child, stderr: [], stdout: "", url: null };
    running.add(child);
    const exited = new Promise((done) => child.on("close", (code) => done(code)));
    lab.exited = exited;
    exited.then(() => running.delete(child));
    const fail = (why) => {
      clearTimeout(timer);
      child.kill();
      const hint = Object.entries(HINTS).find(([flag]) => why.includes(flag));
      reject(new LabError(`retry-safety-lab ${args[0]} did not start: ${why}${hint ? ` (${hint[1]})` : ""}`));
    };
    const timer = setTimeout(() => fail(`no address announced in ${startupTimeoutMs / 1000} s`), startupTimeoutMs);
    child.on("error", (err) => fail(`cannot run ${bin}: ${err.message}`));
    child.stdout.setEncoding("utf8").on("data", (text) => (lab.stdout += text));
    let partial = "";
    child.stderr.setEncoding("utf8").on("data", (text) => {
      const lines = (partial + text).split("\n");
      partial = lines.pop();
      for (const line of lines) {
        lab.stderr.push(line);
        const found = !lab.url && ANNOUNCED.exec(line);
        if (found) {
          lab.url = found[1];
          clearTimeout(timer);
          // Idle, it keeps no test runner alive: `stop` holds the loop while it waits.
          setRef(child, false);
          resolve(lab);
        }
      }
    });
    exited.then((code) => {
      if (!lab.url) fail(lab.stderr.find((l) => l.trim()) || `exited ${code} without a word`);
    });
  });
}

function setRef(child, on) {
  for (const handle of [child, child.stdin, child.stdout, child.stderr]) {
    if (handle) on ? handle.ref() : handle.unref();
  }
}

/** Ends stdin (the lab stops as on SIGTERM) and waits; kills it past `timeoutMs`. */
async function stopProcess(lab, timeoutMs) {
  setRef(lab.child, true);
  lab.child.stdin.end();
  let timer;
  const late = new Promise((done) => (timer = setTimeout(() => done("late"), timeoutMs)));
  const code = await Promise.race([lab.exited, late]);
  clearTimeout(timer);
  if (code === "late") {
    lab.child.kill("SIGKILL");
    await lab.exited;
    throw new LabError(`retry-safety-lab did not stop within ${timeoutMs / 1000} s; killed`);
  }
  return code;
}

module.exports = { startProcess, stopProcess };
