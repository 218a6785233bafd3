#!/usr/bin/env bash
# Finds intra-doc links that rustdoc left unresolved in the crate's own rendered pages: it
# renders a link it cannot make a URL for (an item of a dependency under `--no-deps`, a typo
# it does not warn about) as its source text, brackets included, such as
# `[<code>tower::Layer</code>]`. rustdoc does not warn about these, even with
# `-D rustdoc::broken_intra_doc_links`.
#
# Reads each published crate's pages under target/doc (run scripts/doc.sh first). Left out:
# code blocks and signatures (where `[u8]` is Rust), attributes (`#[non_exhaustive]`), HTML
# comments, scripts and the sidebar (lists of names), and the docs of other crates that rustdoc
# copies into our pages (blanket and auto-trait implementations, methods through Deref).
set -euo pipefail
cd "$(dirname "$0")/.."
dirs=(target/doc/tower_retry_safety target/doc/tower_idempotency_keys target/doc/retry_safety_lab)
for dir in "${dirs[@]}"; do
    [ -f "$dir/index.html" ] || { echo "no $dir/index.html: run scripts/doc.sh first" >&2; exit 2; }
done
found=$(find "${dirs[@]}" -name '*.html' -print0 | xargs -0 perl -0777 -ne '
    s/<!--.*?-->//gs;
    s/<script\b.*?<\/script>//gs;
    s/<nav\b.*?<\/nav>//gs;
    s/<pre\b.*?<\/pre>//gs;
    s/<h[1-6][^>]*class="code-header".*?<\/h[1-6]>//gs;
    # Methods reached through `Deref` to another crate\x27s type repeat that crate\x27s docs.
    s/<h2 id="deref-methods.*?(?=<h2 id="(?!deref-methods))//gs;
    # Auto-trait and blanket implementations come last on a page, and only repeat other
    # crates\x27 docs.
    s/<h2 id="(?:synthetic|blanket)-implementations".*//s;
    s/#\[[^\]]*\]//g;
    my @left;
    push @left, "[`$1`]" while s/\[<code>([^<]*)<\/code>\]//;
    s/<code>.*?<\/code>//gs;
    push @left, $1 while s/(\[[A-Za-z_][A-Za-z0-9_:]*\])//;
    print "$ARGV: $_\n" for @left;
')
if [ -n "$found" ]; then
    echo "unresolved intra-doc links, left as literal brackets in the rendered docs:" >&2
    echo "$found" | sort -u >&2
    exit 1
fi
echo "no unresolved intra-doc links in ${dirs[*]}"
