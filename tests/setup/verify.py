#!/usr/bin/env python3
"""Independent checks for the k3 setup tests (stdlib only): it reads the fixture's
safetensors headers itself, so nothing here trusts k3's own accounting.

  verify.py need SRC                 -> "STREAM_BYTES FULL_BYTES": bytes a --stream / --full
                                        install writes (metadata files + shard bytes)
  verify.py stream-ok SRC DEST       -> every complete shard identical; every partial one holds
                                        the source's header and text spine bytes, and is
                                        exactly as long as the source
  verify.py experts SRC              -> number of routed experts (layer, expert) in SRC
  verify.py journal DEST SHARD       -> the journaled ranges "a-b" (one per line, merged)
  verify.py overlap LOG JOURNALS...  -> exit 1 if a logged range request re-fetched bytes
                                        that a journal (or a complete shard) already held
  verify.py disk-trace SRC TRACE     -> the most bytes DEST/.k3/experts can have held, from an
                                        `strace -f` of creates, renames and unlinks there: a
                                        file counts at its full span size (from SRC's headers)
                                        from the start of the call that creates it to the end
                                        of the call that removes it (an over-estimate)
"""
import json, os, re, struct, sys

META = ["config.json", "model.safetensors.index.json", "tiktoken.model",
        "tokenizer_config.json", "generation_config.json"]
EXPERT = re.compile(r"layers\.(\d+)\..*\.experts\.(\d+)\.")


def header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
    out = []
    for name, e in h.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        kind = "vision" if name.startswith(("vision_tower.", "mm_projector.")) else \
               "expert" if EXPERT.search(name) else "spine"
        out.append((name, 8 + n + a, 8 + n + b, kind))
    return 8 + n, out


def shards(src):
    return sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))


def need(src):
    meta = sum(os.path.getsize(os.path.join(src, m)) for m in META if os.path.exists(os.path.join(src, m)))
    stream = full = meta
    for s in shards(src):
        hb, ts = header(os.path.join(src, s))
        full += os.path.getsize(os.path.join(src, s))
        stream += hb + sum(b - a for _, a, b, k in ts if k == "spine")
    print(stream, full)


def stream_ok(src, dest):
    bad = 0
    for s in shards(src):
        sp, fin, part = os.path.join(src, s), os.path.join(dest, s), os.path.join(dest, ".k3", "partial", s)
        data = open(sp, "rb").read()
        if os.path.exists(fin):
            if open(fin, "rb").read() != data:
                print("differs:", fin); bad += 1
            continue
        if not os.path.exists(part):
            print("missing:", fin); bad += 1
            continue
        got = open(part, "rb").read()
        if len(got) != len(data):
            print("wrong length:", part); bad += 1
            continue
        hb, ts = header(sp)
        for name, a, b, k in [("header", 0, hb, "spine")] + ts:
            if k == "spine" and got[a:b] != data[a:b]:
                print("differs:", part, name); bad += 1
    sys.exit(1 if bad else 0)


def experts(src):
    ids = set()
    for s in shards(src):
        for name, _, _, k in header(os.path.join(src, s))[1]:
            if k == "expert":
                ids.add(EXPERT.search(name).groups())
    print(len(ids))


def journal(dest, shard):
    path = os.path.join(dest, ".k3", shard + ".done")
    rs = []
    if os.path.exists(path):
        raw = open(path, "rb").read()
        for i in range(0, len(raw) - len(raw) % 16, 16):
            off, n = struct.unpack("<QQ", raw[i:i + 16])
            rs.append((off, off + n))
    rs.sort()
    merged = []
    for a, b in rs:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def overlap(log, jfiles):
    held = {}
    for jf in jfiles:  # "SHARD=a-b,a-b" or "SHARD=all"
        shard, spec = jf.split("=", 1)
        held[shard] = spec
    bad = 0
    for line in open(log):
        path, rng = line.split()[:2]
        shard = path.rsplit("/", 1)[-1]
        if shard not in held or rng == "-":
            continue
        a, b = map(int, rng.split("=")[1].split("-"))
        spec = held[shard]
        if spec == "all" and shard.endswith(".safetensors"):
            print("re-fetched a complete shard:", line.strip()); bad += 1
            continue
        for r in filter(None, spec.split(",")):
            x, y = map(int, r.split("-"))
            if a < y and b + 1 > x:
                print("re-fetched journaled bytes:", line.strip(), "held", r); bad += 1
    sys.exit(1 if bad else 0)


def span_bytes(src):
    lo, hi = {}, {}
    for s in shards(src):
        for name, a, b, k in header(os.path.join(src, s))[1]:
            if k == "expert":
                key = tuple(map(int, EXPERT.search(name).groups()))
                lo[key], hi[key] = min(lo.get(key, a), a), max(hi.get(key, b), b)
    return {k: hi[k] - lo[k] for k in lo}


def disk_trace(src, trace):
    size = span_bytes(src)
    path_re = re.compile(r'"([^"]*/\.k3/experts/(\d+)/(\d+)\.bin[^"]*)"')
    live, pending, now, most = {}, {}, 0, 0

    def add(path):
        nonlocal now, most
        if path not in live:
            m = path_re.search('"' + path + '"')
            live[path] = size[(int(m.group(2)), int(m.group(3)))]
            now += live[path]
            most = max(most, now)

    def drop(path):
        nonlocal now
        now -= live.pop(path, 0)

    for line in open(trace):
        pid, rest = line.split(None, 1)
        if "resumed>" in rest:  # the end of a call whose start was printed earlier
            call, paths = pending.pop(pid, (None, []))
            rest = (call or "") + "(" + " ".join(f'"{p}"' for p in paths) + rest.split("resumed>", 1)[1]
        name = rest.split("(", 1)[0].strip()
        paths = [m.group(1) for m in path_re.finditer(rest)]
        if "<unfinished" in rest:
            pending[pid] = (name, paths)
            if name == "openat" and "O_CREAT" in rest:
                add(paths[0])  # counted from the call's start
            continue
        ok = re.search(r"=\s*0\s*$", rest) is not None or (name == "openat" and "= -1" not in rest)
        if name == "openat" and "O_CREAT" in rest and paths:
            add(paths[0])
            if not ok:
                drop(paths[0])
        elif name.startswith("rename") and len(paths) == 2 and ok:
            n = live.pop(paths[0], 0)
            now -= n
            drop(paths[1])
            add(paths[1])
        elif name.startswith("unlink") and paths and ok:
            drop(paths[0])
    print(most)


cmd = sys.argv[1]
if cmd == "need": need(sys.argv[2])
elif cmd == "stream-ok": stream_ok(sys.argv[2], sys.argv[3])
elif cmd == "experts": experts(sys.argv[2])
elif cmd == "journal": print(",".join(f"{a}-{b}" for a, b in journal(sys.argv[2], sys.argv[3])))
elif cmd == "overlap": overlap(sys.argv[2], sys.argv[3:])
elif cmd == "disk-trace": disk_trace(sys.argv[2], sys.argv[3])
else: sys.exit("unknown command " + cmd)
