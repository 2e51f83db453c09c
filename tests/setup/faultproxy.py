#!/usr/bin/env python3
"""Fault-injecting HTTP proxy for the k3 setup tests (loopback only, stdlib only).

usage: faultproxy.py LISTEN_PORT UPSTREAM_PORT RULES_FILE LOG_FILE

Prints the port it listens on once it does (LISTEN_PORT 0: one the system picks).

Forwards GET requests (Range and Authorization headers included) to nginx on
127.0.0.1:UPSTREAM_PORT. RULES_FILE is read at each request and taken anew (its counts
reset) whenever its text changed; lines starting with # are comments; each other line is
    MODE PATH_SUBSTRING COUNT [ARG]
and the first matching rule whose COUNT is not used up (-1 = forever) is applied:
    reset     headers and half the body, then a TCP reset (SO_LINGER 0)
    truncate  headers (full Content-Length) and half the body, then a clean close
    status    answer HTTP ARG (e.g. 500, 404) without asking upstream
    badrange  Content-Range shifted by one byte (the body unchanged)
    stall     headers and half the body, then ARG seconds of silence, then close
    slow      the whole answer at ARG bytes per second (4096-byte bursts)
    drip      the body one byte at a time, ARG bytes per second (never a second without one)
Every request is logged as: PATH RANGE STATUS MODE
"""
import http.client, http.server, socket, struct, sys, threading, time

LISTEN, UPSTREAM, RULES, LOG = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
lock = threading.Lock()
state = {"text": None, "rules": [], "used": []}


def pick(path):
    with lock:
        try:
            with open(RULES) as f:
                text = f.read()
        except FileNotFoundError:
            text = ""
        if text != state["text"]:
            rules = []
            for line in text.splitlines():
                f = line.split()
                if len(f) >= 3 and not f[0].startswith("#"):
                    rules.append((f[0], f[1], int(f[2]), f[3] if len(f) > 3 else ""))
            state.update(text=text, rules=rules, used=[0] * len(rules))
        for i, (mode, sub, count, arg) in enumerate(state["rules"]):
            if sub in path and (count < 0 or state["used"][i] < count):
                state["used"][i] += 1
                return mode, arg
    return "pass", ""


def log(path, rng, status, mode):
    with lock, open(LOG, "a") as f:
        f.write(f"{path} {rng or '-'} {status} {mode}\n")


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        mode, arg = pick(self.path)
        rng = self.headers.get("Range")
        if mode == "status":
            body = b"injected\n"
            self.send_response(int(arg))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            log(self.path, rng, int(arg), mode)
            return
        up = http.client.HTTPConnection("127.0.0.1", UPSTREAM, timeout=30)
        hdrs = {k: v for k, v in self.headers.items() if k.lower() in ("range", "authorization")}
        up.request("GET", self.path, headers=hdrs)
        r = up.getresponse()
        body = r.read()
        up.close()
        headers = [(k, v) for k, v in r.getheaders()
                   if k.lower() not in ("connection", "keep-alive", "transfer-encoding")]
        if mode == "badrange":
            fixed = []
            for k, v in headers:
                if k.lower() == "content-range":
                    a, rest = v.split(" ")[1].split("-")
                    b, total = rest.split("/")
                    d = -1 if int(a) > 0 else 1
                    v = f"bytes {int(a) + d}-{int(b) + d}/{total}"
                fixed.append((k, v))
            headers = fixed
        self.send_response(r.status)
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        half = body[: len(body) // 2]
        log(self.path, rng, r.status, mode)
        if mode in ("reset", "truncate", "stall"):
            self.wfile.write(half)
            self.wfile.flush()
            if mode == "stall":
                time.sleep(float(arg or 5))
            if mode == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return
        if mode == "drip":
            try:
                for i in range(len(body)):
                    self.wfile.write(body[i:i + 1])
                    self.wfile.flush()
                    time.sleep(1 / float(arg))
            except OSError:
                pass  # the client gave up
            self.close_connection = True
            return
        if mode == "slow":
            rate, step = float(arg), 4096
            for i in range(0, len(body), step):
                self.wfile.write(body[i:i + step])
                self.wfile.flush()
                time.sleep(step / rate)
            return
        self.wfile.write(body)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        pass  # a client that went away (killed k3) is not an error here


server = Server(("127.0.0.1", LISTEN), Proxy)
print(server.server_address[1], flush=True)  # the port (LISTEN_PORT 0: a free one, no race)
server.serve_forever()
