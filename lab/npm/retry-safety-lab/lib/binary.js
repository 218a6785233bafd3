"use strict";
// Finds the binary the platform package installed (as esbuild and Biome do): one
// optionalDependency per platform, of which npm installs only the one whose os/cpu/libc match.
const fs = require("node:fs");
const path = require("node:path");
const { LabError } = require("./errors.js");

const ENV = "RETRY_SAFETY_LAB_BIN";

function platformPackage() {
  return `@retry-safety-lab/${process.platform}-${process.arch}`;
}

function findBinary() {
  const override = process.env[ENV];
  if (override) {
    if (fs.existsSync(override)) return override;
    throw new LabError(`$${ENV} is ${JSON.stringify(override)}, which does not exist: fix or unset it`);
  }
  const pkg = platformPackage();
  const exe = process.platform === "win32" ? "retry-safety-lab.exe" : "retry-safety-lab";
  let dir;
  try {
    dir = path.dirname(require.resolve(`${pkg}/package.json`));
  } catch {
    throw new LabError(
      `the retry-safety-lab binary for ${process.platform}-${process.arch} is not installed ` +
        `(${pkg} is missing): reinstall without --omit=optional / --no-optional, and with a lockfile ` +
        `made on this platform or none; packages exist for linux-x64, linux-arm64 (glibc), darwin-x64, ` +
        `darwin-arm64 and win32-x64; elsewhere \`cargo install retry-safety-lab\` and set $${ENV}`,
    );
  }
  return path.join(dir, "bin", exe);
}

module.exports = { findBinary, platformPackage, ENV };
