/* worker.h — the worker's structs, shared by the files that make up the worker (internal to
 * src/server; see srv.h for the module's files):
 *
 *   queue.c      admission: N slots + a bounded FIFO of jobs (connection threads)
 *   clients.c    client polling: a hung-up client, a slow streaming client's backlog
 *   convcache.c  the state cache of kept conversations; the prompt cache (pcache.c) under it
 *   slot.c       one generation in a slot: its start, the generation loop's hooks, its end
 *   sched.c      the scheduler: each round's rows in one engine pass
 *   worker.c     the worker thread that owns every session, its start and stop
 *   testctl.c    the test build's controls (k3_server_test_control); empty in the product
 *
 * The worker thread is the only one that touches the sessions (whose token histories,
 * k3_session_tokens, are what "kept" means), the logits buffers and the multistep.
 * Arrows: worker.c -> sched.c -> slot.c -> convcache.c -> clients.c; queue.c beside them;
 * sched.c, slot.c and convcache.c -> pcache.c, which knows the engine and its folder only.
 */
#ifndef K3_SRV_WORKER_H
#define K3_SRV_WORKER_H

#include "../chat/parse.h"
#include "../chat/toolcall.h"
#include "../engine/generate.h"
#include "../engine/sampler.h"
#include "../engine/spec.h"
#include "pcache.h"
#include "srv.h"

/* The last chat reply, kept so that a request continuing it can reuse the state. */
typedef struct k3_last_chat {
    cJSON *messages;             /* the request's messages (a copy), or NULL = none */
    bool thinking;
    char effort[8], tool_choice[16];
    char *reasoning, *content;   /* the reply as the client saw it (before stop strings) */
} k3_last_chat;

/* One kept conversation (the state cache, server.h): a session, the logits after its last
 * fed token, and what its state means as a chat. */
typedef struct k3_conv {
    k3_session *sess;
    float *logits;        /* vocab_size floats: the logits after the last fed token */
    bool logits_valid;    /* logits belong to the last token the session holds */
    /* The last chat reply as a conversation: kept + the unfed last id + the closing ids of
     * the reply (k3_reply_parser_closing); virt_msgs = messages of that request, 0 = none. */
    int32_t *virt;
    size_t n_virt, virt_cap, virt_msgs;
    k3_last_chat last_chat;
    unsigned long long used; /* when a job last ran on it (k3_worker_state.clock); 0 never */
    bool busy;               /* a slot runs a job on it */
} k3_conv;

/* The job and its server, for the generation loop's hooks (the job's slot: j->slot). */
typedef struct job_ctx {
    k3_server *s;
    k3_job *j;
} job_ctx;

/* One running generation (--parallel N: N slots): its conversation and per-job state. */
typedef struct k3_slot {
    k3_job *j;            /* the job it runs; NULL = free */
    k3_conv *c;           /* the conversation (session) the job runs on */
    job_ctx ctx;          /* k3_gen_io.user */
    enum { K3_SLOT_FREE, K3_SLOT_PREFILL, K3_SLOT_DECODE } phase;
    unsigned long long admitted; /* admission order: prefill chunks go to the oldest first */
    unsigned long long round;    /* the last round that gave it a prefill chunk */
    k3_prefill pf;        /* prefill: the prompt through the one prefill path (k3.h) */
    size_t *marks;        /* --prompt-cache: prompt positions to snapshot at (k3_pcache_marks),
                             ascending; chunks end there */
    size_t n_marks, next_mark, marks_cap;
    size_t inner;         /* the last snapshot this prompt wrote inside a message (0: none),
                             dropped when the next one is written (k3_pcache_drop) */
    bool echo;            /* prefill with the logits of every prompt position (echo) */
    int fed_n;            /* the ids of its segment in this round's pass */
    int32_t next;         /* decode: the id k3_gen_next chose, fed in the next pass */
    k3_gen g;             /* decode */
    bool done;            /* the job ends after this round (finished, cancelled, failed) */
    bool waiting;         /* decode: sits out this round, its streaming client is behind */
    double wait_since;    /* ... since when (monotonic seconds), for o.stall_timeout_s */
    bool failed;          /* ... because it failed (err) */
    k3_err err;
    int32_t last;         /* the last sampled id (never fed) */
    k3_sampler sampler;
    k3_spec spec;         /* --spec (max_draft 0 = off), set up per job with the sampler */
    k3_reply_parser parser;
    k3_toolcall_parser tc;/* chat with tools: the reply's tools block (toolcall.h) */
    bool tc_entered;      /* the reply reached its tools block */
    size_t tc_sent;       /* calls of tc already given to the emitter */
    int32_t *script_cur;  /* the test build's scripted reply for this generation (testctl.c) */
    size_t script_cur_len, script_at;
    k3_detok_stream ds;   /* raw completions */
    char *text;           /* one push of visible text */
    size_t text_cap;
    k3_emitter *em;
} k3_slot;

typedef struct k3_worker_state {
    /* The state cache: cap_convs conversations at most (>= the slots, so a free slot always
     * finds one not in use), created as needed (n_convs so far). */
    k3_conv *convs;
    int n_convs, cap_convs;
    /* --prompt-cache: snapshots by prefix (pcache.h); NULL = off. eom: <|end_of_msg|>. */
    k3_pcache *pc;
    int32_t eom;
    unsigned long long clock;
    k3_slot *slots;
    int n_slots;
    unsigned long long admissions, rounds;
    /* The pass: segments of the slots' rows, their logits rows [logit_rows][vocab], and which
     * slot each segment is (k3_multistep_run; row budget: the chunk + each slot's decode row
     * and --spec drafts). */
    k3_multistep *ms;
    k3_multistep_seg *segs;
    k3_slot **seg_slot;
    float *rows;
    int max_rows;
    int logit_rows;       /* rows of `rows`: decode rows + an echo chunk + each prompt's last */
    int pass_segs;        /* segments in the pass that runs now (k3_sched_pass_unwanted) */
    k3_trace trace;       /* every conversation's session: on_layer = k3_sched_pass_unwanted */
    int chunk;            /* prompt ids per prefill pass, over all prefilling slots */
    int vocab;
    k3_stops stops;       /* end-of-message ids */
    /* The test build's scripted replies (testctl.c): generation i takes the ids of reply
     * i % n_script instead of sampling, then the end-of-message id. */
    int32_t **script;
    size_t *script_len, n_script, script_next;
} k3_worker_state;


/* ---- convcache.c ---- */
void k3_last_chat_clear(k3_last_chat *c);
/* After a failed feed the state is unknown: the next job on c starts fresh. Returns rc. */
int k3_kept_feed_failed(k3_conv *c, int rc);
/* Makes c a new, empty conversation of the state cache. */
int k3_kept_new(k3_server *s, k3_conv *c, k3_err *err);
void k3_kept_free(k3_conv *c);
/* --prompt-cache: adds what the cache did to /metrics. */
void k3_pcache_count(k3_server *s, const k3_pcache_stats *st);
/* The state cache's choice for job j (sets j->slot->c); the prompt ids reused, or -1. */
long k3_kept_pick(k3_server *s, k3_job *j, k3_err *err);
/* After a chat reply: what the state means as a conversation, for a continuing request. */
void k3_kept_remember_reply(k3_server *s, k3_job *j);

/* ---- clients.c ---- */
/* True when the job must end now: its client hung up, or the server is stopping. */
bool k3_job_abandoned(k3_server *s, k3_job *j);
/* Before a round: marks the decoding slots that sit out it, ends those whose client is gone;
 * returns their count. */
int k3_clients_mark_waiting(k3_server *s);
/* With s->mu held, after a round in which every running slot sat out: waits a tick. */
void k3_clients_wait_locked(k3_server *s);

/* ---- slot.c ---- */
void k3_slot_begin(k3_server *s, k3_slot *w, k3_job *j);
void k3_slot_start_decode(k3_server *s, k3_slot *w);
void k3_slot_failed(k3_slot *w);
/* --prompt-cache: the prefill reached the slot's next mark; stores the state there. */
void k3_slot_snapshot(k3_server *s, k3_slot *w);
/* Echo: the logprobs of prompt ids at + 1 .. at + n from the rows [n][vocab] after ids
 * at .. at + n - 1. */
void k3_slot_echo_rows(k3_server *s, k3_slot *w, size_t at, int n, const float *rows);
void k3_slot_finish(k3_server *s, k3_slot *w);
void k3_slot_free(k3_slot *w);
/* One pass of `rows` token rows that sess was in, for /metrics. */
void k3_srv_count_pass(k3_server *s, int rows, const k3_session *sess);

/* ---- testctl.c: the test build's controls (server.h, k3_server_test_control) ----
 * In the shipped build (no K3_TEST_CONTROLS) these are no-ops: nothing scripted, no delay,
 * the default stream backlog, speculation's own rule. */
#ifdef K3_TEST_CONTROLS
int k3_srv_test_start(k3_worker_state *w, const k3_tokenizer *tok, k3_err *err);
void k3_srv_test_free(k3_worker_state *w);
/* A new generation in slot w: its scripted reply; the spec rule off when asked. */
void k3_srv_test_begin(k3_worker_state *ws, k3_slot *w);
bool k3_srv_test_scripted(const k3_worker_state *w);
bool k3_srv_test_choose(void *user, int32_t *id); /* k3_gen_io.choose: the script, then end */
void k3_srv_test_after_token(void);
size_t k3_srv_test_stream_backlog(void); /* 0: the default */
/* The on_layer hook, after layer `layer` of a pass whose segment has n ids at positions pos..:
 * the one hold of K3_SERVER_TEST_PASS_HOLD (server.h), while a client of the pass stays. */
void k3_srv_test_hold_pass(k3_server *s, int pos, int n, int layer);
#else
static inline int k3_srv_test_start(k3_worker_state *w, const k3_tokenizer *tok, k3_err *err) {
    (void)w, (void)tok, (void)err;
    return 0;
}
static inline void k3_srv_test_free(k3_worker_state *w) { (void)w; }
static inline void k3_srv_test_begin(k3_worker_state *ws, k3_slot *w) { (void)ws, (void)w; }
static inline bool k3_srv_test_scripted(const k3_worker_state *w) { return (void)w, false; }
#define k3_srv_test_choose NULL
static inline void k3_srv_test_after_token(void) {}
static inline size_t k3_srv_test_stream_backlog(void) { return 0; }
static inline void k3_srv_test_hold_pass(k3_server *s, int pos, int n, int layer) {
    (void)s, (void)pos, (void)n, (void)layer;
}
#endif

/* The sessions' on_layer hook (k3_trace, pass.h; user: the server): nonzero, which stops the
 * pass after this layer, when every slot in the running pass is abandoned (client gone,
 * cancelled, server stopping). A long prompt pass whose client left ends within a layer; a
 * pass that still serves someone runs to its end. A stop puts every session in the pass back
 * where the pass began: its conversation keeps the prompt passes before it. */
int k3_sched_pass_unwanted(void *user, int pos, int n, int layer, int n_layers);

/* ---- sched.c ---- */
/* One round (one engine pass); true when nothing ran because every running slot sits out. */
bool k3_sched_round(k3_server *s);

#endif
