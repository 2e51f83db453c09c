#!/bin/sh
# make test-container: the Containerfile. With podman or docker that works and the base
# images at hand, it is built and run (k3 serve answering /health, and refusing /v1 without
# the key). Otherwise (CI reaches no image registry) build and run print SKIPPED with the
# reason, and the file is checked without a container runtime:
#  - two stages on Debian 12: `FROM debian:12 AS build`, then debian:12-slim;
#  - the build stage installs every Build-Depends of debian/control (one list of what k3
#    builds with); the runtime stage no -dev package and no compiler;
#  - every library the built k3 links (readelf NEEDED, found with ldd, owned per dpkg -S) is
#    from a package the runtime stage installs (or from libc6, in the base image);
#  - ENTRYPOINT is the entry point script, VOLUME /models, EXPOSE 8000, a USER not root;
#  - the entry point refuses to start without K3_API_KEY, serves /models when given only
#    flags, and runs the installed k3 serve on 0.0.0.0: /health answers, /v1/models needs
#    the key.
set -eu
BUILD=${BUILD:-build}
cf=Containerfile
ep=scripts/container-entrypoint.sh
fail() { echo "FAIL test-container: $*"; exit 1; }
tmp=$(mktemp -d /tmp/k3-container-XXXXXX)
pid=""
trap '[ -z "$pid" ] || kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT

# ---- the stages
froms=$(grep -c '^FROM ' $cf)
[ "$froms" = 2 ] || fail "$cf has $froms stages, not 2 (build, runtime)"
grep -qx 'FROM debian:12 AS build' $cf || fail "the first stage is not FROM debian:12 AS build"
grep -q '^FROM debian:12-slim' $cf || fail "the runtime stage is not FROM debian:12-slim"
stage() { # the RUN apt-get install package names of stage $1 (1 or 2), one per line
    awk -v n="$1" '/^FROM /{s++} s==n' $cf | sed -e ':a' -e '/\\$/N; s/\\\n//; ta' |
        grep 'apt-get install' | sed 's/.*apt-get install//; s/&&.*//' | tr ' ' '\n' |
        grep -v '^-' | grep -v '^$'
}
build_pkgs=$(stage 1)
run_pkgs=$(stage 2)
for p in $(awk '/^Build-Depends:/{on=1; print; next} on && /^ /{print; next} {on=0}' \
               debian/control | tr ',' '\n' |
           sed 's/Build-Depends://; s/(.*)//; s/|.*//' | tr -d ' ' | grep -v '^debhelper-compat'); do
    echo "$build_pkgs" | grep -qx "$p" || fail "the build stage lacks $p (debian/control)"
done
echo "$run_pkgs" | grep -E -e '-dev$' -e '^(build-essential|gcc|make)$' &&
    fail "the runtime stage installs build tools (above)"

# ---- what k3 links, against the runtime stage's packages
[ -x "$BUILD/k3" ] || fail "$BUILD/k3 is not built"
if command -v readelf >/dev/null 2>&1 && command -v dpkg >/dev/null 2>&1; then
    n=0
    for so in $(readelf -d "$BUILD/k3" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        path=$(ldd "$BUILD/k3" | awk -v so="$so" '$1 == so {print $3}')
        [ -n "$path" ] || fail "ldd does not find $so"
        pkg=""
        real=$(readlink -f "$path")
        for f in "$path" "$real" "/usr${real#/usr}" "${real#/usr}"; do # usrmerge: either name
            [ -n "$pkg" ] || pkg=$(dpkg -S "$f" 2>/dev/null | head -1 | cut -d: -f1)
        done
        [ -n "$pkg" ] || fail "no Debian package owns $path ($so)"
        [ "$pkg" = libc6 ] && continue
        echo "$run_pkgs" | grep -qx "$pkg" || fail "k3 links $so from $pkg, which the runtime stage does not install"
        n=$((n + 1))
    done
    echo "test-container: the runtime stage installs the packages of all $n libraries k3 links (besides libc6)"
else
    echo "SKIPPED test-container libraries: readelf or dpkg is missing"
fi

# ---- entry point, volume, port, user
grep -qx 'ENTRYPOINT \["/usr/local/bin/k3-entrypoint"\]' $cf || fail "ENTRYPOINT is not the entry point script"
grep -q "^COPY $ep /usr/local/bin/k3-entrypoint" $cf || fail "$ep is not copied to /usr/local/bin/k3-entrypoint"
grep -qx 'VOLUME /models' $cf || fail "no VOLUME /models"
grep -qx 'EXPOSE 8000' $cf || fail "no EXPOSE 8000"
user=$(sed -n 's/^USER //p' $cf | tail -1)
[ -n "$user" ] && [ "$user" != root ] && [ "$user" != 0 ] || fail "the runtime runs as root"
sh -n $ep || fail "$ep: syntax"

# ---- the entry point with the k3 this tree installs (make install DESTDIR, as the build
# stage does), the bundled model, and port 0
make --no-print-directory -s install BUILD="$BUILD" DESTDIR="$tmp/root" PREFIX=/usr/local >/dev/null
export PATH="$tmp/root/usr/local/bin:$PATH"
if (unset K3_API_KEY; sh $ep >"$tmp/out" 2>&1); then fail "the entry point started without K3_API_KEY"; fi
grep -q "set K3_API_KEY" "$tmp/out" || fail "no hint without K3_API_KEY: $(cat "$tmp/out")"
mkdir -p "$tmp/fake" && printf '#!/bin/sh\necho "$@"\n' >"$tmp/fake/k3" && chmod +x "$tmp/fake/k3"
a=$(PATH="$tmp/fake:$PATH" K3_API_KEY=x K3_PORT= sh $ep --parallel 2)
[ "$a" = "serve /models --parallel 2 --host 0.0.0.0 --port 8000" ] ||
    fail "flags only: the entry point ran k3 $a"
a=$(PATH="$tmp/fake:$PATH" K3_API_KEY=x K3_PORT=9 sh $ep owner/name)
[ "$a" = "serve owner/name --host 0.0.0.0 --port 9" ] || fail "a name: the entry point ran k3 $a"
K3_API_KEY=sekrit K3_PORT=0 sh $ep "$tmp/root/usr/local/share/k3/k3-tiny-kjv" -q \
    >"$tmp/serve.log" 2>&1 &
pid=$!
port="" # up to 30 s: a loaded 2-core machine
for _ in $(seq 1 300); do
    port=$(sed -n 's|.*listening on http://0\.0\.0\.0:\([0-9]*\)/.*|\1|p' "$tmp/serve.log" | head -1)
    [ -n "$port" ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
done
[ -n "$port" ] || fail "k3 serve did not listen on 0.0.0.0: $(cat "$tmp/serve.log")"
if command -v curl >/dev/null 2>&1; then
    h=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")
    n=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/models")
    k=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer sekrit' \
        "http://127.0.0.1:$port/v1/models")
    [ "$h $n $k" = "200 401 200" ] || fail "/health $h, /v1/models without the key $n, with it $k"
    echo "test-container: entry point: refused without K3_API_KEY; k3 serve on 0.0.0.0:$port," \
         "/health 200, /v1/models 401 without the key, 200 with it"
else
    echo "SKIPPED test-container requests: curl is missing (k3 serve listened on 0.0.0.0:$port)"
fi
kill $pid; wait $pid 2>/dev/null || true
pid=""

# ---- build and run, where a container runtime and the base images are at hand
rt=""
for r in podman docker; do
    if command -v $r >/dev/null 2>&1 && $r info >/dev/null 2>&1; then rt=$r; break; fi
done
if [ -z "$rt" ]; then
    echo "SKIPPED test-container build/run: no working podman or docker on this machine" \
         "(the checks above ran without one)"
    exit 0
fi
for img in debian:12 debian:12-slim; do
    if ! $rt image inspect $img >/dev/null 2>&1 && ! $rt pull -q $img >/dev/null 2>&1; then
        echo "SKIPPED test-container build/run: base image $img is not here and cannot be" \
             "pulled (no registry reachable)"
        exit 0
    fi
done
$rt build -q -t k3-test -f $cf . >/dev/null || fail "$rt build"
$rt run --rm -e K3_API_KEY= k3-test >/dev/null 2>&1 && fail "the image started without K3_API_KEY"
cid=$($rt run -d -e K3_API_KEY=sekrit -p 127.0.0.1::8000 k3-test /usr/local/share/k3/k3-tiny-kjv)
trap '$rt rm -f "$cid" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
hp=$($rt port "$cid" 8000 | head -1 | sed 's/.*://')
for _ in $(seq 1 100); do
    curl -sf "http://127.0.0.1:$hp/health" >/dev/null 2>&1 && break
    sleep 0.2
done
curl -sf -H 'Authorization: Bearer sekrit' "http://127.0.0.1:$hp/v1/models" >/dev/null ||
    fail "the container does not answer /v1/models"
echo "test-container: built with $rt and ran: /v1/models answers with the key"
