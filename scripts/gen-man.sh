#!/bin/sh
# gen-man.sh BIN OUTDIR — the man pages of a k3 binary, made from its own --help (which the
# option table prints, so the pages cannot disagree with the program): BIN.1 from `BIN --help`
# and, for every command its help lists, BIN-CMD.1 from `BIN CMD --help`. The date is
# SOURCE_DATE_EPOCH's when set (reproducible builds), else today's.
set -eu
bin=$1 out=$2
name=$(basename "$bin")
mkdir -p "$out"
version=$("$bin" --version | sed -n '1s/^[^ ]* //p')
if [ -n "${SOURCE_DATE_EPOCH:-}" ]; then
    date=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%d)
else
    date=$(date -u +%Y-%m-%d)
fi

# Help text as roff: verbatim (.nf), backslashes and minus signs escaped, and a line that
# starts with . or ' protected with \&.
roff_text() {
    sed -e 's/\\/\\e/g' -e 's/-/\\-/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"
}

# page FILE TITLE NAME_LINE SEE_ALSO < help text
page() {
    {
        printf '.TH %s 1 "%s" "k3 %s" "User Commands"\n' "$2" "$date" "$version"
        printf '.SH NAME\n%s\n' "$3"
        printf '.SH DESCRIPTION\n.nf\n'
        roff_text
        printf '.fi\n'
        if [ -n "$4" ]; then printf '.SH SEE ALSO\n%s\n' "$4"; fi
    } > "$1"
}

help=$("$bin" --help)
rname=$(printf '%s' "$name" | roff_text)
title=$(printf '%s\n' "$help" | sed -n '1s/^[^ ]* — //p')
# "  run [MODEL_DIR] --prompt TEXT   generate text ...": the command's name and its line
cmds=$(printf '%s\n' "$help" | sed -n '/^commands:/,/^$/s/^  \([a-z][a-z-]*\)[ ,].*/\1/p' |
       sort -u)
see=""
for c in $cmds; do see="$see${see:+, }\\fB$rname\\-$(printf '%s' "$c" | roff_text)\\fR(1)"; done
printf '%s\n' "$help" | page "$out/$name.1" "$(echo "$name" | tr a-z A-Z)" \
    "$rname \\- $(printf '%s' "$title" | roff_text)" "$see"
for c in $cmds; do
    # the command's line in the list: its synopsis, then (after 2+ spaces) what it does
    what=$(printf '%s\n' "$help" |
           sed -n "/^commands:/,/^\$/s/^  $c[ ,].*[^ ]  \\+\\([^ ].*\\)\$/\\1/p" | head -1)
    "$bin" "$c" --help | page "$out/$name-$c.1" "$(echo "$name-$c" | tr a-z A-Z)" \
        "$rname\\-$(printf '%s' "$c" | roff_text) \\- $(printf '%s' "${what:-$name $c}" | roff_text)" "\\fB$rname\\fR(1)"
done
