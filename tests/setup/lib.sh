# tests/setup/lib.sh — shared by run.sh and bench.sh: a temp folder cleaned at exit, and nginx
# on a free loopback port serving $SRC (default: the k3-nano fixture) under the Hugging Face hub
# layout {endpoint}/{repo}/resolve/main/{file}, with each file's sha256 as X-Linked-Etag (as the
# hub sends it). Needs: ROOT, NGINX; sets T, EP, NPORT; PIDS collects processes to stop.
SRC=${SRC:-$ROOT/tests/fixtures/k3-nano}
COMMIT=0123456789abcdef0123456789abcdef01234567 # what the test hub says main points to
T=$(mktemp -d /tmp/k3-setup-test.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    [ "${K3_KEEP_TMP:-0}" = 1 ] && echo "kept $T" || rm -rf "$T"
}
trap cleanup EXIT

# ---- servers ---------------------------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start_nginx() {
    mkdir -p "$T/ng/tmp"
    local sha_map="" f s
    for f in $(cd "$SRC" && ls); do
        [ -f "$SRC/$f" ] || continue
        s=$(sha256sum "$SRC/$f" | cut -d' ' -f1)
        sha_map+="        moonshotai/$f \"\\\"$s\\\"\";"$'\n'
    done
    # badsha/: one shard announced with a wrong sha256
    sha_map+="        badsha/model-00010-of-000011.safetensors \"\\\"$(printf '0%.0s' $(seq 64))\\\"\";"$'\n'
    for attempt in 1 2 3 4 5; do
        NPORT=$(free_port)
        cat > "$T/ng/nginx.conf" <<EOF
daemon off; master_process off; worker_processes 1;
error_log $T/ng/error.log; pid $T/ng/nginx.pid;
events { worker_connections 256; }
http {
    log_format k3 '\$uri \$http_range \$status \$body_bytes_sent "\$http_authorization"';
    access_log $T/ng/access.log k3;
    client_body_temp_path $T/ng/tmp/body; proxy_temp_path $T/ng/tmp/proxy;
    fastcgi_temp_path $T/ng/tmp/fcgi; uwsgi_temp_path $T/ng/tmp/uwsgi; scgi_temp_path $T/ng/tmp/scgi;
    default_type application/octet-stream;
    keepalive_requests 100000;
    map_hash_bucket_size 256;
    map "\$org/\$file" \$k3_sha {
        default "";
$sha_map    }
    server {
        listen 127.0.0.1:$NPORT;
        # /resolve/main/ answers with the commit main points to (as the hub does); the commit
        # itself resolves too, so an install pins it
        location ~ ^/(?<org>moonshotai|badsha)/Kimi-K3/resolve/(main|$COMMIT)/(?<file>[^/]+)\$ {
            alias $SRC/\$file;
            add_header X-Linked-Etag \$k3_sha;
            add_header X-Repo-Commit $COMMIT;
        }
        location ~ ^/redirect/Kimi-K3/resolve/(.*)\$ { return 302 /moonshotai/Kimi-K3/resolve/\$1; }
        location ~ ^/offsite/Kimi-K3/resolve/(.*)\$ {
            return 302 http://localhost:$NPORT/moonshotai/Kimi-K3/resolve/\$1;
        }
    }
}
EOF
        "$NGINX" -p "$T/ng" -c "$T/ng/nginx.conf" 2>>"$T/ng/start.log" &
        local pid=$!
        for i in $(seq 50); do
            curl -s -o /dev/null "http://127.0.0.1:$NPORT/moonshotai/Kimi-K3/resolve/main/config.json" && break
            kill -0 $pid 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 $pid 2>/dev/null; then PIDS+=($pid); EP="http://127.0.0.1:$NPORT"; return 0; fi
    done
    echo "FAIL: nginx did not start:"; cat "$T/ng/start.log" "$T/ng/error.log" 2>/dev/null; exit 1
}
