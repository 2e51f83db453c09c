#!/bin/sh
# make test-deb: the Debian package (debian/), built as a user would from a copy of the tree
# (git's files, committed or not; no build outputs): dpkg-buildpackage -b -us -uc, lintian
# (any error fails), then, as root, dpkg -i: k3 --version, k3 run with no MODEL_DIR (the
# bundled model in /usr/share/k3), the man pages, the k3 user, k3.service installed and
# disabled; dpkg --purge leaves no /usr/bin/k3. Each step that cannot run says SKIPPED and why.
set -eu
fail() { echo "FAIL test-deb: $*"; exit 1; }
for t in dpkg-buildpackage dh; do
    command -v $t >/dev/null 2>&1 || {
        echo "SKIPPED test-deb: $t is missing (apt-get install dpkg-dev debhelper;" \
             "scripts/install-deps.sh --with-wide installs them)"
        exit 0
    }
done
tmp=$(mktemp -d /tmp/k3-deb-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
version=$(dpkg-parsechangelog -S Version)
src=$tmp/k3-$version
mkdir -p "$src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    git ls-files -co --exclude-standard -z | xargs -0 tar cf - | tar xf - -C "$src"
else # a tree without .git: everything but build outputs
    tar cf - --exclude='./build*' --exclude=./k3 --exclude=./k3-lab --exclude=node_modules . |
        tar xf - -C "$src"
fi
start=$(date +%s)
(cd "$src" && DEB_BUILD_OPTIONS="parallel=$(nproc)" dpkg-buildpackage -b -us -uc \
    >"$tmp/build.log" 2>&1) ||
    { tail -30 "$tmp/build.log"; fail "dpkg-buildpackage failed (log above)"; }
deb=$(ls "$tmp"/k3_"$version"_*.deb)
echo "test-deb: built $(basename "$deb") ($(du -k "$deb" | cut -f1) kB) in $(($(date +%s) - start)) s"
dpkg-deb -c "$deb" | grep ' ./usr/bin/k3$' >/dev/null || fail "no /usr/bin/k3 in the package"
deps=$(dpkg-deb -f "$deb" Depends)
for lib in libcjson libcurl libmicrohttpd libpcre2-8 libssl libxxhash liburing; do
    case $deps in *$lib*) ;; *) fail "Depends lacks $lib: $deps" ;; esac
done

if command -v lintian >/dev/null 2>&1; then
    lintian --no-tag-display-limit "$deb" >"$tmp/lintian.log" 2>&1 || true
    if grep -q '^E: ' "$tmp/lintian.log"; then
        grep '^E: ' "$tmp/lintian.log"
        fail "lintian errors (above)"
    fi
    echo "test-deb: lintian: no errors ($(grep -c '^W: ' "$tmp/lintian.log" || true) warnings)"
else
    echo "SKIPPED test-deb lintian: lintian is missing (apt-get install lintian)"
fi

if [ "$(id -u)" != 0 ]; then
    echo "SKIPPED test-deb install: dpkg -i needs root (run as root, as CI does)"
    exit 0
fi
if dpkg -s k3 >/dev/null 2>&1; then
    echo "SKIPPED test-deb install: a k3 package is installed on this machine already"
    exit 0
fi
dpkg -i "$deb" >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log"; fail "dpkg -i failed"; }
trap 'dpkg --purge k3 >/dev/null 2>&1; rm -rf "$tmp"' EXIT
/usr/bin/k3 --version | head -1 | grep -qx "k3 ${version%%-*}" || fail "k3 --version: $(/usr/bin/k3 --version)"
out=$(cd / && /usr/bin/k3 run --prompt "And God said" --max-new 8 -q 2>&1) ||
    fail "k3 run from the package: $out"
[ -n "$out" ] || fail "k3 run printed nothing"
[ -f /usr/share/man/man1/k3-serve.1.gz ] || fail "no k3-serve man page"
[ -f /lib/systemd/system/k3.service ] || fail "no k3.service"
[ -f /etc/default/k3 ] || fail "no /etc/default/k3"
if ls /etc/systemd/system/*.wants/k3.service >/dev/null 2>&1; then fail "k3.service is enabled"; fi
if command -v systemd-sysusers >/dev/null 2>&1; then
    getent passwd k3 >/dev/null || fail "no user k3 after install"
fi
if command -v systemd-analyze >/dev/null 2>&1; then
    systemd-analyze verify /lib/systemd/system/k3.service >"$tmp/verify.log" 2>&1 ||
        { cat "$tmp/verify.log"; fail "systemd-analyze verify k3.service"; }
fi
dpkg --purge k3 >/dev/null 2>&1 || fail "dpkg --purge k3"
[ ! -e /usr/bin/k3 ] || fail "/usr/bin/k3 left after purge"
echo "test-deb: ok (dpkg -i: k3 --version, k3 run on /usr/share/k3/k3-tiny-kjv, man pages," \
     "k3.service disabled, user k3; purged)"
