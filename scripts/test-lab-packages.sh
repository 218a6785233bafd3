#!/usr/bin/env bash
# Installs the packages scripts/package-lab.sh left in target/lab-packages/ (the wheel file;
# the npm tarballs, offline) into a fresh virtualenv and a fresh Node project, with no cargo
# or rustc on PATH, and runs the lab only through them: `--version`, `demo`, the README's
# pytest and node:test examples (the careless client must FAIL, naming the writes applied
# twice; the keyed one pass), and the helpers' bad inputs. Leaves no lab process behind.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
packages=$repo/target/lab-packages
work=$repo/target/lab-test
step() { echo "== test-lab-packages: $* (at ${SECONDS}s)"; }
fail() { echo "test-lab-packages: $*" >&2; exit 1; }

step "versions and the README's snippets"
scripts/check-lab-versions.sh
scripts/check-lab-readme-snippets.sh
version=$(scripts/crate-version.sh lab)
wheel=$(ls "$packages"/retry_safety_lab-"$version"-*.whl) || fail "no wheel: run scripts/package-lab.sh"

# PATH without any directory holding a Rust toolchain: only the packages provide the lab.
no_rust=
IFS=: read -ra dirs <<<"$PATH"
for dir in "${dirs[@]}"; do
    [ -e "$dir/cargo" ] || [ -e "$dir/rustc" ] || [ -e "$dir/rustup" ] || no_rust+=${no_rust:+:}$dir
done
rm -rf "$work" && mkdir -p "$work"
# Whatever fails below, no lab started from these installs outlives the script.
trap 'pkill -f "$work/" 2>/dev/null || true' EXIT

# Runs a command that must exit $1, its output in $work/$2.log; then greps each pattern.
expect() { # status log command... -- patterns...
    local status=$1 log=$work/$2.log cmd=() got=0
    shift 2
    while (($#)) && [ "$1" != -- ]; do cmd+=("$1"); shift; done
    shift || true
    "${cmd[@]}" >"$log" 2>&1 || got=$?
    if ((got != status)); then
        cat "$log" >&2
        fail "${cmd[*]}: exit $got, expected $status"
    fi
    for pattern in "$@"; do
        grep -qE -- "$pattern" "$log" || { cat "$log" >&2; fail "${cmd[*]}: no line matches '$pattern'"; }
    done
    echo "   ok (exit $got): ${cmd[*]}"
}

step "Python: a fresh virtualenv with the wheel file and pytest"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check --no-index --no-deps "$wheel"
"$work/venv/bin/pip" install --quiet --disable-pip-version-check -c scripts/python-tools.txt pytest
(
    export PATH=$work/venv/bin:$no_rust
    ! command -v cargo >/dev/null || fail "cargo is on PATH"
    cp -R lab/python/examples lab/python/tests "$work/"
    cd "$work/examples"
    [ "$(command -v retry-safety-lab)" = "$work/venv/bin/retry-safety-lab" ] || fail "not the wheel's binary"
    expect 0 py-version retry-safety-lab --version -- "^retry-safety-lab $version\$"
    expect 0 py-demo retry-safety-lab demo
    # The README's pytest example: the client without keys FAILS at the lab's verdict.
    expect 1 py-examples python -m pytest -p no:cacheprovider -rA test_sdk.py -- \
        "^FAILED test_sdk.py::test_retries_without_keys" \
        "^PASSED test_sdk.py::test_retries_with_keys" \
        "POST /v1/payments: [1-6] of 6 writes may have been applied twice" \
        "1 failed, 1 passed"
    expect 0 py-without-pytest python without_pytest.py -- "no write applied twice: 6 writes"
    cd "$work/tests"
    expect 0 py-errors python -m pytest -p no:cacheprovider -p pytester -rA test_helper_errors.py -- \
        "7 passed"
)

step "Node: a fresh project with the npm tarballs, offline (nothing but these files)"
mkdir -p "$work/node" && cp -R lab/npm/examples lab/npm/tests "$work/node/"
(
    cd "$work/node"
    echo '{ "private": true, "type": "module" }' >package.json
    npm install --offline --no-audit --no-fund --silent \
        "$packages/retry-safety-lab-$version.tgz" "$packages"/retry-safety-lab-*-"$version".tgz
    export PATH=$no_rust
    expect 0 npx-version npx --offline retry-safety-lab --version -- "^retry-safety-lab $version\$"
    expect 0 npx-demo npx --offline retry-safety-lab demo
    expect 1 node-examples node --test --test-reporter=tap examples/sdk.test.mjs -- \
        "^not ok 1 - retries without keys" \
        "^ok 2 - retries with keys" \
        "POST /v1/payments: [1-6] of 6 writes may have been applied twice" \
        "^# fail 1"
    expect 0 node-errors node --test --test-reporter=tap tests/errors.test.mjs -- "^# fail 0"
)

step "no lab process left behind"
if pgrep -fa "$work/"; then fail "lab processes outlived their tests (above)"; fi
step "done: the packages install and run without Rust; the fixture and helper fail a careless client"
