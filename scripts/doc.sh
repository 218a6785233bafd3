#!/usr/bin/env bash
# Documents every package of the workspace (`--no-deps`, all features), each after the packages
# it links to.
#
# rustdoc makes a link to another crate's item only if that crate's pages are already in
# target/doc, and cargo removes a package's pages before it documents the package again. In one
# `cargo doc --workspace`, cargo runs rustdoc on a package once its dependencies are *checked*,
# not documented: a fresh clone's run documented the lab while the server's pages were missing,
# and rustdoc left the lab's links to `IdempotencyLayer` as text, without a warning. So one cargo
# command per layer, in dependency order; each documents only the packages it names.
set -euo pipefail
cd "$(dirname "$0")/.."

layers=(
    "tower-retry-safety"
    "tower-idempotency-keys"
    "retry-safety-lab retry-safety-testing"
    "retry-safety-e2e"
)

# Every member in a layer, each after the members its library depends on (a member placed too
# early would bring the race back).
cargo metadata --no-deps --format-version 1 | LAYERS="$(printf '%s\n' "${layers[@]}")" perl -MJSON::PP -0777 -ne '
    my $packages = decode_json($_)->{packages};
    my %layer; my $i = 0;
    my $fail = 0;
    for my $line (split /\n/, $ENV{LAYERS}) {
        for (split " ", $line) {
            if (defined $layer{$_}) { print STDERR "scripts/doc.sh: $_ is in two layers\n"; $fail = 1 }
            $layer{$_} = $i;
        }
        $i++;
    }
    for my $p (@$packages) {
        my $at = $layer{$p->{name}};
        if (!defined $at) { print STDERR "scripts/doc.sh: $p->{name} is in no layer\n"; $fail = 1; next }
        for my $d (@{$p->{dependencies}}) {
            next unless defined $d->{path} && !defined $d->{kind};
            my $dep_at = $layer{$d->{name}};
            next if defined $dep_at && $dep_at < $at;
            print STDERR "scripts/doc.sh: $p->{name} links to $d->{name}, which is not in an earlier layer\n";
            $fail = 1;
        }
    }
    my %members = map { $_->{name} => 1 } @$packages;
    for (keys %layer) { next if $members{$_}; print STDERR "scripts/doc.sh: $_ is not a member\n"; $fail = 1 }
    exit $fail;
'

for layer in "${layers[@]}"; do
    args=()
    for package in $layer; do args+=(-p "$package"); done
    RUSTDOCFLAGS="-Dwarnings ${RUSTDOCFLAGS:-}" cargo doc "${args[@]}" --no-deps --all-features
done
