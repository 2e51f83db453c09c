/* test_setup.c — unit tests of src/setup that need no server: byte-range sets (against a
 * bitmap), journals (torn and foreign records), the manifest, shard headers and expert spans
 * (against sizes computed from config.json), URLs. The HTTP paths are tested against nginx by
 * tests/setup/run.sh (make test-setup). */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../src/setup/setup_internal.h"
#include "../src/util/fileio.h"
#include "test.h"

#define NANO "tests/fixtures/k3-nano"

/* sn_ranges against a plain bitmap over [0, 256) under random adds. */
static void test_ranges_vs_bitmap(void) {
    enum { N = 256 };
    unsigned char bits[N] = {0};
    sn_ranges s = {0}, miss = {0};
    unsigned seed = 12345;
    for (int step = 0; step < 400; step++) {
        seed = seed * 1103515245u + 12345u;
        uint64_t a = (seed >> 8) % N, len = (seed >> 20) % 24, b = a + len > N ? N : a + len;
        CHECK(sn_ranges_add(&s, a, b) == 0);
        for (uint64_t i = a; i < b; i++) bits[i] = 1;
        uint64_t total = 0;
        for (int i = 0; i < N; i++) total += bits[i];
        CHECK(sn_ranges_bytes(&s) == total, "step %d: %llu vs %llu", step,
              (unsigned long long)sn_ranges_bytes(&s), (unsigned long long)total);
        for (int r = 1; r < s.n; r++) /* sorted, merged: a gap between neighbours */
            CHECK(s.r[r - 1][1] < s.r[r][0], "ranges %d and %d touch", r - 1, r);
        uint64_t qa = (seed >> 3) % N, qb = qa + (seed >> 13) % 40;
        if (qb > N) qb = N;
        int all = 1;
        for (uint64_t i = qa; i < qb; i++) all &= bits[i];
        CHECK(sn_ranges_covers(&s, qa, qb) == (all != 0), "covers [%llu, %llu)",
              (unsigned long long)qa, (unsigned long long)qb);
        CHECK(sn_ranges_missing(&s, qa, qb, &miss) == 0);
        uint64_t holes = 0;
        for (uint64_t i = qa; i < qb; i++) holes += !bits[i];
        CHECK(sn_ranges_bytes(&miss) == holes);
        for (int r = 0; r < miss.n; r++)
            for (uint64_t i = miss.r[r][0]; i < miss.r[r][1]; i++) CHECK(!bits[i]);
    }
    sn_ranges_free(&s);
    sn_ranges_free(&miss);
}

static void write_bytes(const char *path, const void *p, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        if (write(fd, p, n) != (ssize_t)n) n = 0;
        close(fd);
    }
}

static void rec(unsigned char *r, uint64_t off, uint64_t len) {
    for (int i = 0; i < 8; i++) r[i] = (unsigned char)(off >> (8 * i));
    for (int i = 0; i < 8; i++) r[8 + i] = (unsigned char)(len >> (8 * i));
}

/* A torn last record is ignored; a record past the end of the shard voids the journal. */
static void test_journal_torn_and_foreign(void) {
    char dir[] = "/tmp/k3-test-journal.XXXXXX", path[4096];
    CHECK(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/.k3", dir);
    mkdir(path, 0755);
    sn_shard sh = {.name = "s.safetensors", .bytes = 1000};
    unsigned char j[16 * 3 + 5];
    rec(j, 0, 100);
    rec(j + 16, 100, 50);
    rec(j + 32, 500, 10);
    memset(j + 48, 0xff, 5); /* torn */
    sn_journal_path(path, sizeof path, dir, sh.name);
    write_bytes(path, j, sizeof j);
    k3_err err = {0};
    CHECK(sn_journal_load(dir, &sh, &err) == K3_OK, "%s", err.msg);
    CHECK(sh.done.n == 2 && sn_ranges_covers(&sh.done, 0, 150) &&
          sn_ranges_covers(&sh.done, 500, 510) && !sn_ranges_covers(&sh.done, 150, 151),
          "%d ranges", sh.done.n);
    rec(j + 16, 990, 20); /* ends past the 1000-byte shard */
    write_bytes(path, j, 48);
    CHECK(sn_journal_load(dir, &sh, &err) == K3_OK);
    CHECK(sh.done.n == 0, "a foreign journal must be trusted for nothing");
    sn_ranges_free(&sh.done);
    unlink(path);
    snprintf(path, sizeof path, "%s/.k3", dir);
    rmdir(path);
    rmdir(dir);
}

/* Every expert of k3-nano is one span of exactly its six tensors, whose size follows from
 * config.json: w1 and w3 [inter, latent/2] + scales [inter, latent/32], w2 [latent, inter/2]
 * + scales [latent, inter/32] (MXFP4, group 32). */
static void test_spans_of_nano(void) {
    sn_install in = {0};
    const int n_shards = 11, n_moe_layers = 8, n_experts = 32, inter = 32, latent = 32;
    const uint64_t want = 2 * ((uint64_t)inter * latent / 2 + (uint64_t)inter * latent / 32) +
                          (uint64_t)latent * inter / 2 + (uint64_t)latent * inter / 32;
    in.shards = calloc(n_shards, sizeof *in.shards);
    CHECK(in.shards);
    k3_err err = {0};
    for (int i = 0; i < n_shards; i++) {
        sn_shard *sh = &in.shards[in.n_shards++];
        char name[64], path[256];
        snprintf(name, sizeof name, "model-%05d-of-000011.safetensors", i + 1);
        sh->name = strdup(name);
        snprintf(path, sizeof path, NANO "/%s", name);
        char *buf = NULL;
        size_t len = 0;
        CHECK(k3_read_file(path, 1 << 24, &buf, &len, &err) == K3_OK, "%s", err.msg);
        sh->bytes = len;
        uint64_t n = 0;
        for (int b = 7; b >= 0; b--) n = (n << 8) | (unsigned char)buf[b];
        CHECK(n + 8 <= len);
        char *hdr = malloc(n + 8);
        CHECK(hdr);
        memcpy(hdr, buf, n + 8);
        free(buf);
        CHECK(sn_parse_header(sh, hdr, n + 8, &err) == K3_OK, "%s", err.msg);
    }
    CHECK(sn_build_spans(&in, &err) == K3_OK, "%s", err.msg);
    CHECK(in.n_spans == n_moe_layers * n_experts, "%d spans", in.n_spans);
    for (int i = 0; i < in.n_spans; i++) {
        const k3_expert_span *sp = &in.spans[i];
        CHECK(sp->nbytes == want, "layer %d expert %d: %llu bytes, want %llu", sp->layer,
              sp->expert, (unsigned long long)sp->nbytes, (unsigned long long)want);
        CHECK(sp->shard == sp->layer, "layer %d lives in shard %d", sp->layer, sp->shard + 1);
        if (i > 0 && in.spans[i - 1].shard == sp->shard) /* sorted by offset, disjoint */
            CHECK(in.spans[i - 1].offset + in.spans[i - 1].nbytes <= sp->offset);
    }
    sn_install_free(&in);
}

static void test_manifest_roundtrip(void) {
    char dir[] = "/tmp/k3-test-manifest.XXXXXX", path[4096];
    CHECK(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/.k3", dir);
    mkdir(path, 0755);
    sn_file files[1] = {{.name = "config.json", .bytes = 4454}};
    sn_shard shards[1] = {{.name = "model-00001-of-000001.safetensors", .bytes = 1ull << 40,
                           .header_bytes = 4096}};
    memset(shards[0].sha256, 'a', 64);
    sn_install in = {.dest = dir, .endpoint = "https://example.invalid", .repo = "a/b",
                     .revision = "main", .files = files, .n_files = 1, .shards = shards,
                     .n_shards = 1, .net_retries = -1, .net_backoff_s = 0.25};
    snprintf(in.mode, sizeof in.mode, "stream");
    k3_err err = {0};
    CHECK(sn_manifest_write(&in, &err) == K3_OK, "%s", err.msg);
    sn_install back = {0};
    bool found = false;
    CHECK(sn_manifest_read(dir, &back, &found, &err) == K3_OK && found, "%s", err.msg);
    CHECK(!strcmp(back.endpoint, in.endpoint) && !strcmp(back.repo, "a/b") &&
          !strcmp(back.mode, "stream") && back.n_files == 1 && back.files[0].bytes == 4454 &&
          !back.files[0].sha256[0] && back.n_shards == 1 && back.shards[0].bytes == 1ull << 40 &&
          back.shards[0].header_bytes == 4096 && !strcmp(back.shards[0].sha256, shards[0].sha256) &&
          back.net_retries == -1 && back.net_backoff_s == 0.25);
    sn_install_free(&back);
    snprintf(path, sizeof path, "%s/" SN_MANIFEST, dir);
    write_bytes(path, "{\"files\": 3}", 12);
    CHECK(sn_manifest_read(dir, &back, &found, &err) == K3_ERR_CHECKPOINT, "code %d", err.code);
    sn_install_free(&back);
    unlink(path);
    snprintf(path, sizeof path, "%s/.k3", dir);
    rmdir(path);
    rmdir(dir);
}

static void test_urls(void) {
    char buf[256];
    CHECK(!strcmp(k3_hub_url(buf, sizeof buf, "https://hf.co/", "moonshotai/Kimi-K3", "main",
                             "config.json"),
                  "https://hf.co/moonshotai/Kimi-K3/resolve/main/config.json"), "%s", buf);
    CHECK(!strcmp(k3_url_for_humans(buf, sizeof buf, "https://user:secret@hf.co/a/b?x=1"),
                  "https://hf.co/a/b?x=1"), "%s", buf);
    CHECK(!strcmp(k3_url_for_humans(buf, sizeof buf, "http://hf.co/a@b"), "http://hf.co/a@b"),
          "%s", buf);
    k3_http *h = NULL;
    k3_err err = {0};
    k3_http_opts o = {.endpoint = "ftp://example.invalid"};
    CHECK(k3_http_new(&o, &h, &err) == K3_ERR_USAGE && !h, "ftp endpoint accepted");
}

/* The disk budget's bookkeeping (sn_disk): spans of 10 bytes under a 30-byte budget. The
 * victim is the least recently used span that is neither pinned (being read or fetched) nor
 * WRITING (its rename in progress); a span that fits beside those is not kept; the budget
 * holds after every reserve. */
static int evicted[16], n_evicted;
static void note_evict(void *user, int i) {
    (void)user;
    evicted[n_evicted++] = i;
}

static void test_disk_budget_pins(void) {
    uint64_t bytes[6] = {10, 10, 10, 10, 10, 40};
    sn_disk d;
    k3_err err = {0};
    n_evicted = 0;
    CHECK(sn_disk_init(&d, 6, bytes, 30, &err) == 0);
    for (int i = 0; i < 3; i++) { /* 0, 1, 2 kept: 30 bytes, full */
        CHECK(sn_disk_reserve(&d, i, note_evict, NULL) == 1);
        CHECK(sn_disk_reserve(&d, i, note_evict, NULL) == 0, "span %d reserved twice", i);
        sn_disk_commit(&d, i, true);
    }
    CHECK(d.kept_bytes == 30 && n_evicted == 0);
    sn_disk_hit(&d, 0);           /* recency now 1 (least), 2, 0 */
    d.pins[1] = 1;                /* 1 is being read: 2 is the victim */
    CHECK(sn_disk_reserve(&d, 3, note_evict, NULL) == 1);
    CHECK(n_evicted == 1 && evicted[0] == 2, "evicted %d", evicted[0]);
    CHECK(d.state[2] == SN_DISK_EMPTY && d.state[3] == SN_DISK_WRITING);
    CHECK(d.kept_bytes == 30, "kept %llu", (unsigned long long)d.kept_bytes);
    /* 3 is WRITING (not yet renamed), 0 and 1 pinned: nothing may go, 4 is not kept */
    d.pins[0] = 1;
    CHECK(sn_disk_reserve(&d, 4, note_evict, NULL) == 0 && n_evicted == 1);
    CHECK(d.kept_bytes <= d.budget);
    sn_disk_commit(&d, 3, true);  /* recency 1, 0, 3 */
    d.pins[0] = 0;                /* read done: 0 may go now, 1 (still pinned) and 3 stay */
    CHECK(sn_disk_reserve(&d, 4, note_evict, NULL) == 1);
    CHECK(n_evicted == 2 && evicted[1] == 0, "evicted %d", evicted[1]);
    sn_disk_commit(&d, 4, false); /* a failed write gives its bytes back */
    CHECK(d.kept_bytes == 20 && d.state[4] == SN_DISK_EMPTY);
    CHECK(sn_disk_reserve(&d, 5, note_evict, NULL) == 0, "a span above the budget kept");
    CHECK(d.peak_bytes == 30 && d.evicted == 2);
    /* a smaller budget (as at open) evicts down to it, pinned spans excepted */
    d.budget = 0;
    CHECK(sn_disk_make_room(&d, 0, note_evict, NULL) == 0, "pinned span 1 evicted");
    CHECK(d.kept_bytes == 10 && d.state[1] == SN_DISK_KEPT && d.state[3] == SN_DISK_EMPTY);
    CHECK(n_evicted == 3 && evicted[2] == 3);
    d.pins[1] = 0;
    CHECK(sn_disk_make_room(&d, 0, note_evict, NULL) == 1 && d.kept_bytes == 0);
    CHECK(n_evicted == 4 && evicted[3] == 1 && d.head == -1 && d.tail == -1);
    sn_disk_free(&d);
}

/* The default budget's margin: max(10%, min(20 GB, 25%)) of the file system. */
static void test_disk_margin(void) {
    CHECK(sn_disk_margin(1000000000000ull) == 100000000000ull);  /* 1 TB: 10% = 100 GB */
    CHECK(sn_disk_margin(100000000000ull) == 20000000000ull);    /* 100 GB: the 20 GB floor */
    CHECK(sn_disk_margin(40000000000ull) == 10000000000ull);     /* 40 GB: a quarter */
    CHECK(sn_disk_margin(1000000000ull) == 250000000ull);        /* 1 GB: a quarter */
    CHECK(sn_disk_margin(0) == 0);
}

const k3_test k3_suite_setup[] = {
    {"ranges_vs_bitmap", test_ranges_vs_bitmap},
    {"journal_torn_and_foreign", test_journal_torn_and_foreign},
    {"spans_of_nano", test_spans_of_nano},
    {"manifest_roundtrip", test_manifest_roundtrip},
    {"urls", test_urls},
    {"disk_budget_pins", test_disk_budget_pins},
    {"disk_margin", test_disk_margin},
    {0},
};
