#!/bin/sh
# make test-install: `make install DESTDIR=$tmp PREFIX=/usr`, then the installed k3, run from
# outside the checkout with no MODEL_DIR, must find the bundled model in /usr/share/k3:
#  - its greedy ids for the fixture's reference prompt equal the reference's (computed by the
#    independent references of tests/fixtures/k3-tiny-kjv/reference, not by k3);
#  - its text for the README's quick-start prompt starts with the lines the README shows;
#  - the man pages exist and render without warnings (when man is installed);
# then `make uninstall` with the same variables leaves no file behind.
set -eu
BUILD=${BUILD:-build}
root=$(pwd)
tmp=$(mktemp -d /tmp/k3-install-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL test-install: $*"; exit 1; }

dest=$tmp/root
make --no-print-directory -s install BUILD="$BUILD" DESTDIR="$dest" PREFIX=/usr >/dev/null
k3="$dest/usr/bin/k3"
[ -x "$k3" ] || fail "no $k3"
[ -f "$dest/usr/share/k3/k3-tiny-kjv/config.json" ] || fail "no bundled model in /usr/share/k3"
[ ! -e "$dest/usr/bin/k3-lab" ] || fail "k3-lab installed without INSTALL_LAB=1"

# 1. the reference: prompt ids and 24 greedy ids, from the fixture's JSON
ref=tests/fixtures/k3-tiny-kjv/reference/prompt_len9.json
ids=$(grep -o '"prompt_ids": *\[[0-9, ]*\]' "$ref" | grep -o '\[.*\]' | tr -d '[] ')
want=$(sed -n '/"greedy": {/,/"tokens"/s/^ *"tokens": *\[\([0-9, ]*\)\],*$/\1/p' "$ref" |
       tr -d ' ')
[ -n "$ids" ] && [ -n "$want" ] || fail "cannot read $ref"
got=$(cd / && "$k3" run --prompt-ids "$ids" --max-new 24 --ids -q 2>"$tmp/err") ||
    fail "installed k3 run --prompt-ids: $(cat "$tmp/err")"
[ "$got" = "$want" ] || fail "greedy ids $got, the reference's $want"

# 2. the README's quick start: the text block after "which prints", without its "..." line
cd "$root"
readme=$(sed -n '/^which prints/,/^```$/p' README.md | sed -n '/^```text$/,/^```$/p' |
         sed -e '1d' -e '$d' | grep -v '^\.\.\.$')
[ -n "$readme" ] || fail "no expected text in README.md's quick start"
prompt=$(sed -n 's/.*\.\/k3 run --prompt "\([^"]*\)".*/\1/p' README.md | head -1)
text=$(cd / && "$k3" run --prompt "$prompt" -q 2>"$tmp/err") ||
    fail "installed k3 run --prompt '$prompt': $(cat "$tmp/err")"
lines=$(printf '%s\n' "$readme" | wc -l)
head=$(printf '%s\n' "$text" | head -n "$lines")
[ "$head" = "$readme" ] || fail "installed k3 printed
$head
README.md shows
$readme"

# 3. man pages: one per command, rendering without warnings
for p in k3 k3-run k3-serve k3-setup k3-plan; do
    [ -f "$dest/usr/share/man/man1/$p.1" ] || fail "no man page $p.1"
done
if command -v man >/dev/null 2>&1; then
    for f in "$dest"/usr/share/man/man1/*.1; do
        w=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -E UTF-8 -l -Tutf8 -Z "$f" 2>&1 >/dev/null)
        [ -z "$w" ] || fail "$f: $w"
    done
    LC_ALL=C.UTF-8 man -l "$dest/usr/share/man/man1/k3-run.1" 2>/dev/null | grep -q -- '--prompt' ||
        fail "k3-run.1 does not show --prompt"
fi

# 4. uninstall removes every file install wrote
make --no-print-directory -s uninstall BUILD="$BUILD" DESTDIR="$dest" PREFIX=/usr
left=$(find "$dest" -type f -o -type l)
[ -z "$left" ] || fail "make uninstall left: $left"
echo "test-install: ok (installed k3 found /usr/share/k3/k3-tiny-kjv: 24 greedy ids as the" \
     "reference, the README's text; $(ls "$root/$BUILD/man" | wc -l) man pages; uninstall clean)"
