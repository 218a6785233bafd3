#!/usr/bin/env bash
# Builds the lab's packages for this machine's platform into target/lab-packages/: the Python
# wheel (maturin, `bin` bindings) and the npm packages (`retry-safety-lab` and
# `@retry-safety-lab/<os>-<cpu>`), as tarballs `npm publish` takes. One release build: maturin
# builds the binary in the shared target dir, and the npm package takes the very binary the
# wheel holds. The release workflow (.github/workflows/release-lab.yml) runs this per platform;
# scripts/test-lab-packages.sh installs what it leaves.
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned in scripts/python-tools.txt, with their dependencies: a new maturin or auditwheel
# changes what is published only when bumped there.
constraints=scripts/python-tools.txt
pinned() { sed -n "s/^$1==//p" "$constraints"; }
MATURIN_VERSION=$(pinned maturin)
AUDITWHEEL_VERSION=$(pinned auditwheel)

out=$PWD/target/lab-packages
tools=$PWD/target/lab-tools
step() { echo "== package-lab: $* (at ${SECONDS}s)"; }

python=$(command -v python3 || command -v python) # Windows runners have no python3
platform=${LAB_PLATFORM:-$(node -p 'process.platform + "-" + process.arch')}
node -e 'const p = require("./lab/npm/platforms.json"); if (!p[process.argv[1]]) { console.error(`no npm package for ${process.argv[1]}: add it to lab/npm/platforms.json`); process.exit(1); }' "$platform"
version=$(scripts/crate-version.sh lab)

step "tools: maturin $MATURIN_VERSION, auditwheel $AUDITWHEEL_VERSION in $tools"
stamp=$tools/versions-$(cksum <"$constraints" | cut -d' ' -f1)
venv_bin() { if [ -d "$tools/bin" ]; then echo "$tools/bin"; else echo "$tools/Scripts"; fi; } # Windows: Scripts
if [ ! -e "$stamp" ]; then
    rm -rf "$tools" && "$python" -m venv "$tools"
    "$(venv_bin)/pip" install --quiet --disable-pip-version-check -c "$constraints" maturin auditwheel
    touch "$stamp"
fi
bin=$(venv_bin)

rm -rf "$out" && mkdir -p "$out"

step "wheel: maturin build --release (the lab's release build, in the shared target dir)"
# --locked: the binary is built from Cargo.lock's versions, as CI tests them.
(cd lab/python && "$bin/maturin" build --release --locked --out "$out")
wheel=$(ls "$out"/retry_safety_lab-"$version"-*.whl)

case "$platform" in linux-*)
    step "auditwheel show: the wheel's tag must be one pip installs on common Linux"
    "$bin/auditwheel" show "$wheel" | tee "$out/auditwheel.txt"
    tag=$(sed -n 's/.*-py3-none-\(.*\)\.whl$/\1/p' <<<"$(basename "$wheel")")
    tr -s ' \n' ' ' <"$out/auditwheel.txt" | grep -q "consistent with the following platform tag: \"$tag\"" || {
        echo "the wheel is tagged $tag, which auditwheel does not confirm (above)" >&2
        exit 1
    }
    case "$tag" in manylinux*|musllinux*) ;; *)
        echo "the wheel is tagged $tag: pip installs only manylinux or musllinux wheels from PyPI" >&2
        exit 1
    esac
esac

step "npm: $platform's binary (from the wheel) and the main package"
stage=$out/npm-stage
rm -rf "$stage" && mkdir -p "$stage/bin"
exe=retry-safety-lab; [[ $platform == win32-* ]] && exe=retry-safety-lab.exe
"$python" - "$wheel" "$exe" "$stage/bin" <<'PY'
import sys, zipfile
wheel, exe, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith(".data/scripts/" + exe))
    open(f"{dest}/{exe}", "wb").write(z.read(name))
PY
node lab/npm/platform-package.mjs "$platform" "$stage/bin/$exe" "$stage/$platform" "$version"
cp -R lab/npm/retry-safety-lab "$stage/main"
for dir in "$stage/$platform" "$stage/main"; do
    (cd "$dir" && npm pack --silent --pack-destination "$out" >/dev/null)
done
rm -rf "$stage"

step "versions"
scripts/check-lab-versions.sh

ls -l "$out"
step done
