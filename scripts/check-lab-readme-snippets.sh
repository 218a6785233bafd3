#!/usr/bin/env bash
# lab/README.md shows the examples the tests run, byte for byte: each fenced block after a
# `<!-- snippet: PATH -->` line must be PATH's content (for `lab/src/lib.rs`, the crate docs'
# first example as rustdoc shows it, without its `# ` lines; `cargo test --doc` runs it).
# Every example file the package tests run must be shown.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - <<'PY'
import re, sys

readme = open("lab/README.md").read()
shown = re.findall(r"<!-- snippet: (\S+) -->\n```[a-z]*\n(.*?)```\n", readme, re.S)
required = {"lab/python/examples/test_sdk.py", "lab/python/examples/without_pytest.py",
            "lab/npm/examples/sdk.test.mjs", "lab/src/lib.rs"}

def source(path):
    text = open(path).read()
    if path.endswith(".rs"):
        block = re.search(r"^//! ```\n(.*?)^//! ```$", text, re.S | re.M).group(1)
        lines = [l[4:] if l.startswith("//! ") else l[3:] for l in block.splitlines()]
        return "".join(l + "\n" for l in lines if not (l.startswith("# ") or l == "#"))
    return text

bad = [p for p, code in shown if code != source(p)]
missing = required - {p for p, _ in shown}
for p in bad:
    print(f"lab/README.md: the snippet of {p} differs from the file: copy it again", file=sys.stderr)
for p in sorted(missing):
    print(f"lab/README.md: no `<!-- snippet: {p} -->` block", file=sys.stderr)
sys.exit(1 if bad or missing else 0)
PY
echo "check-lab-readme-snippets: lab/README.md shows the tested examples as they are"
