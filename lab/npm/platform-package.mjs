// Writes one platform package (`@retry-safety-lab/<os>-<cpu>`): the binary and a package.json
// whose os/cpu/libc let npm install it only where it runs.
// node platform-package.mjs <platform> <binary> <out dir> <version>
import { chmodSync, copyFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { basename, join } from "node:path";

const [platform, binary, out, version] = process.argv.slice(2);
const target = JSON.parse(readFileSync(new URL("./platforms.json", import.meta.url)))[platform];
if (!target || !version) throw new Error(`usage: platform-package.mjs <${Object.keys(JSON.parse(readFileSync(new URL("./platforms.json", import.meta.url)))).join("|")}> <binary> <out dir> <version>`);
const name = `@retry-safety-lab/${platform}`;
const manifest = {
  name,
  version,
  description: `The retry-safety-lab binary for ${platform}${target.libc ? ` (${target.libc})` : ""}; install retry-safety-lab, which picks it`,
  license: "MIT OR Apache-2.0",
  repository: { type: "git", url: "git+https://github.com/tower-retry-safety/tower-retry-safety.git", directory: "lab/npm" },
  os: [target.os],
  cpu: [target.cpu],
  ...(target.libc ? { libc: [target.libc] } : {}),
  files: ["bin"],
  preferUnplugged: true,
};
mkdirSync(join(out, "bin"), { recursive: true });
const exe = join(out, "bin", basename(binary));
copyFileSync(binary, exe);
chmodSync(exe, 0o755);
writeFileSync(join(out, "package.json"), JSON.stringify(manifest, null, 2) + "\n");
writeFileSync(join(out, "README.md"), `# ${name}\n\nThe \`retry-safety-lab\` binary for ${platform}. Install \`retry-safety-lab\`: it depends on this package where it runs.\n`);
