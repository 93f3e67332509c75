/*
 * amqp_load: a native AMQP 1.0 load client for Spate's benchmarks (W1 publish, W2 consume,
 * W3 end-to-end latency), written against Debian's libqpid-proton (proactor API) so that the
 * client costs ~1 us of CPU per message and the server under test is the bottleneck.
 *
 *   amqp_load publish --address A [--count N] [--size S] [--window W] [--rate R --duration D]
 *   amqp_load consume --address A [--count N] [--credit C] [--offset first|last|next|INT]
 *   amqp_load latency --address A [--rate R] [--duration D] [--window W] [--credit C]
 *   common: [--host H] [--port P] [--user U --password P] [--partition ID]
 *           [--filter rabbitmq|oasis|none] [--timeout S] [--label TEXT]
 *   publish: [--producer-name NAME]  a deduplicating producer (ADR 0011): the link property
 *           spate:producer-name, and the message annotation x-opt-publishing-id = sequence
 *   publish: [--annotate]  the same annotation without a name (a control: same bytes, no dedup)
 *   publish: [--group-keys]  a message annotation event-streams-group-key = the sequence as 10
 *           decimal digits (a super stream's routing key, ADR 0014; on a plain stream a control)
 *   consume/latency: [--settled]  ask for deliveries sent settled (snd-settle-mode settled:
 *           at most once, no disposition per message; the stream protocol's consumers do not
 *           acknowledge messages either, they track offsets)
 *
 * Every run prints exactly one JSON line on stdout (field names as in
 * /work/shared/peers/benchlib.py output); diagnostics go to stderr. Exit status 0 when the run
 * completed (all messages confirmed / received), 1 otherwise (the JSON carries "error").
 *
 * Message (pre-encoded once, two fields patched per send):
 *   header section   00 53 70 c0 02 01 41            (durable = true)
 *   data section     00 53 75 a0 LEN | b0 LEN32      (vbin8 for SIZE <= 255, else vbin32)
 *   data bytes       u64le sequence (1..N) | u64le CLOCK_REALTIME ns at send | 'x' padding
 * Delivery tag = the u64 sequence, so a disposition maps back to its send time in O(1).
 *
 * publish: at most WINDOW unsettled deliveries, sends as link credit allows; a delivery is
 *   "confirmed" by any terminal remote state (accepted / rejected / released / modified).
 *   With --rate R --duration D it sends R*D messages paced every 2 ms (W3's producer).
 *   msgs_per_s = accepted / (first send -> last confirm).
 * consume: receiver with source filter (default rabbitmq:stream-offset-spec = "first"), link
 *   credit topped up to CREDIT when it falls below half, accepts every delivery, stops after N.
 *   msgs_per_s = N / (attach sent -> N-th delivery).
 * latency: consumer here, producer = this binary in `publish --rate` mode in a separate process,
 *   started once the consumer's link is attached. Latency = CLOCK_REALTIME now - body timestamp.
 */
#define _GNU_SOURCE
#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/delivery.h>
#include <proton/event.h>
#include <proton/link.h>
#include <proton/proactor.h>
#include <proton/sasl.h>
#include <proton/session.h>
#include <proton/terminus.h>
#include <proton/transport.h>

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MODE_PUBLISH, MODE_CONSUME, MODE_LATENCY };

#define PACE_TICK_MS 2      /* W3 producer pacing interval */
#define IDLE_TICK_MS 100    /* deadline check interval otherwise */
#define CLOSE_GRACE_MS 3000 /* after close(), wait this long for the transport to finish */
#define RECV_BUF_BYTES (4u * 1024u * 1024u)
#define ERR_CHARS 512
#define REDIRECT_HOPS_MAX 5 /* amqp:link:redirect followed at most this many times per run */
#define HOST_CHARS 256
#define ATTACH_RETRY_MS 100 /* pause before re-attaching after a refusal marked spate:retryable */

typedef struct {
    int mode;
    const char *host, *port, *address, *user, *password, *partition, *offset, *filter, *label;
    const char *producer_name; /* --producer-name: deduplicating producer, publishing id = seq */
    int annotate;              /* --annotate: the same x-opt-publishing-id, no producer name */
    int group_keys;            /* --group-keys: event-streams-group-key = sequence, 10 digits */
    int settled;               /* --settled: the receiver asks for pre-settled deliveries */
    const char *self_path;
    long count, size, window, credit;
    double rate, duration, timeout_s;

    pn_proactor_t *proactor;
    pn_connection_t *conn;
    pn_link_t *link;

    /* publish */
    uint8_t *msg;      /* pre-encoded message */
    size_t msg_len, seq_at, ts_at, id_at; /* id_at: publishing id (0 = unnamed) */
    size_t key_at;     /* the group key's 10 digits (0 = none) */
    long total;        /* messages to send */
    long sent, accepted, rejected, released, modified, settled_no_state;
    uint64_t *t_sent;  /* [total + 1] monotonic ns by sequence */
    uint64_t *lat;     /* confirm (publish) or end-to-end (latency) latencies, ns */
    long n_lat;
    uint64_t t_first, t_last, t_pace0;

    /* consume */
    long received, da_offset_seen, bad_body, seq_breaks;
    uint64_t first_seq, last_seq; /* body sequence numbers of the first and last counted */
    uint8_t *rbuf;
    size_t rlen;
    uint64_t t_attach;

    /* latency: the producer child */
    pid_t child;
    int child_fd;

    /* amqp:link:redirect (a node that does not lead the partition refuses a producer link with
     * the leader's network-host/port in the condition's info map): reconnect there */
    int redirects, redirect_pending, attach_retries, retry_pending;
    char redirect_host[HOST_CHARS], redirect_port[16];

    uint64_t deadline;
    uint64_t close_by;  /* 0 until we close */
    int attached, closing, done, transport_closed;
    char error[ERR_CHARS];
} app_t;

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t real_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void put_u64le(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64be(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[7 - i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_u64le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static uint32_t get_u32be(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void set_error(app_t *a, const char *fmt, const char *x, const char *y) {
    if (a->error[0]) return; /* keep the first */
    snprintf(a->error, sizeof a->error, fmt, x ? x : "", y ? y : "");
}

static void close_conn(app_t *a) {
    if (a->closing) return;
    a->closing = 1;
    a->close_by = mono_ns() + (uint64_t)CLOSE_GRACE_MS * 1000000ull;
    if (a->conn) pn_connection_close(a->conn);
}

/* ---- message encoding / scanning ------------------------------------------------------- */

static void encode_message(app_t *a) {
    static const uint8_t header[] = {0x00, 0x53, 0x70, 0xc0, 0x02, 0x01, 0x41};
    /* message-annotations {x-opt-publishing-id: ulong} (map8: size 31, count 2; sym8; ulong) */
    static const uint8_t annotations[] = {0x00, 0x53, 0x72, 0xc1, 31, 2, 0xa3, 19,
        'x', '-', 'o', 'p', 't', '-', 'p', 'u', 'b', 'l', 'i', 's', 'h', 'i', 'n', 'g', '-',
        'i', 'd', 0x80, 0, 0, 0, 0, 0, 0, 0, 0};
    /* message-annotations {event-streams-group-key: str8 of 10 digits} (map8: size 38) */
    static const uint8_t keyed[] = {0x00, 0x53, 0x72, 0xc1, 38, 2, 0xa3, 23,
        'e', 'v', 'e', 'n', 't', '-', 's', 't', 'r', 'e', 'a', 'm', 's', '-', 'g', 'r', 'o',
        'u', 'p', '-', 'k', 'e', 'y', 0xa1, 10, '0', '0', '0', '0', '0', '0', '0', '0', '0',
        '0'};
    size_t n = (size_t)a->size, pre = n <= 255 ? 5 : 8;
    const uint8_t *section = a->group_keys ? keyed : annotations;
    size_t ma = a->producer_name || a->annotate ? sizeof annotations
              : a->group_keys ? sizeof keyed : 0;
    a->msg_len = sizeof header + ma + pre + n;
    a->msg = malloc(a->msg_len);
    memcpy(a->msg, header, sizeof header);
    memcpy(a->msg + sizeof header, section, ma);
    a->id_at = ma && !a->group_keys ? sizeof header + ma - 8 : 0;
    a->key_at = a->group_keys ? sizeof header + ma - 10 : 0;
    uint8_t *p = a->msg + sizeof header + ma;
    p[0] = 0x00; p[1] = 0x53; p[2] = 0x75;
    if (n <= 255) {
        p[3] = 0xa0; p[4] = (uint8_t)n;
    } else {
        p[3] = 0xb0;
        p[4] = (uint8_t)(n >> 24); p[5] = (uint8_t)(n >> 16); p[6] = (uint8_t)(n >> 8); p[7] = (uint8_t)n;
    }
    uint8_t *body = p + pre;
    memset(body, 'x', n);
    a->seq_at = (size_t)(body - a->msg);
    a->ts_at = a->seq_at + 8;
    put_u64le(body, 0);
    put_u64le(body + 8, 0);
}

/* index just after the AMQP value starting at b[i], or 0 if it does not fit in n bytes */
static size_t skip_value(const uint8_t *b, size_t n, size_t i, int depth) {
    if (i >= n || depth > 8) return 0;
    uint8_t c = b[i++];
    if (c == 0x00) { /* described: descriptor, then value */
        size_t j = skip_value(b, n, i, depth + 1);
        return j ? skip_value(b, n, j, depth + 1) : 0;
    }
    size_t w;
    switch (c & 0xf0) {
    case 0x40: w = 0; break;
    case 0x50: w = 1; break;
    case 0x60: w = 2; break;
    case 0x70: w = 4; break;
    case 0x80: w = 8; break;
    case 0x90: w = 16; break;
    case 0xa0: case 0xc0: case 0xe0:
        if (i >= n) return 0;
        w = 1 + (size_t)b[i];
        break;
    case 0xb0: case 0xd0: case 0xf0:
        if (i + 4 > n) return 0;
        w = 4 + (size_t)get_u32be(b + i);
        break;
    default: return 0;
    }
    return i + w <= n ? i + w : 0;
}

/* section code at b[i] (numeric descriptors only), or -1 */
static long section_code(const uint8_t *b, size_t n, size_t i, size_t *value_at) {
    if (i + 3 > n || b[i] != 0x00) return -1;
    if (b[i + 1] == 0x53) { *value_at = i + 3; return b[i + 2]; }
    if (b[i + 1] == 0x80 && i + 10 <= n) { /* ulong descriptor, big-endian */
        uint64_t d = 0;
        for (int k = 0; k < 8; k++) d = (d << 8) | b[i + 2 + k];
        *value_at = i + 10;
        return d <= 0xff ? (long)d : -1;
    }
    return -1;
}

/* find the first data section's bytes; note whether a delivery-annotations section names
 * event-streams-offset. Returns 0 on success. */
static int scan_message(const uint8_t *b, size_t n, const uint8_t **data, size_t *len, int *has_da_offset) {
    static const char key[] = "\xa3\x14" "event-streams-offset";
    size_t i = 0;
    *has_da_offset = 0;
    while (i < n) {
        size_t v;
        long code = section_code(b, n, i, &v);
        if (code < 0) return -1;
        size_t end = skip_value(b, n, v, 0);
        if (!end) return -1;
        if (code == 0x71 && memmem(b + v, end - v, key, sizeof key - 1)) *has_da_offset = 1;
        if (code == 0x75) {
            if (b[v] == 0xa0) { *len = b[v + 1]; *data = b + v + 2; return 0; }
            if (b[v] == 0xb0) { *len = get_u32be(b + v + 1); *data = b + v + 5; return 0; }
            return -1;
        }
        i = end;
    }
    return -1;
}

/* ---- link setup ---------------------------------------------------------------------------- */

static void put_offset_value(pn_data_t *d, const char *offset) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(offset, &end, 10);
    if (*offset && end && *end == '\0' && errno == 0) pn_data_put_long(d, v);
    else pn_data_put_string(d, pn_bytes(strlen(offset), offset));
}

static void set_source_filter(app_t *a, pn_link_t *l) {
    if (!strcmp(a->filter, "none")) return;
    pn_data_t *f = pn_terminus_filter(pn_link_source(l));
    pn_data_put_map(f);
    pn_data_enter(f);
    if (!strcmp(a->filter, "oasis")) {
        /* 000 5.2.1: amqp:event-streams-delivery-annotations-filter, code 0x00000000:0x00000200,
         * here with the simple value Spate also accepts */
        const char *k = "amqp:event-streams-delivery-annotations-filter";
        pn_data_put_symbol(f, pn_bytes(strlen(k), k));
        pn_data_put_described(f);
        pn_data_enter(f);
        pn_data_put_ulong(f, 0x200);
        put_offset_value(f, a->offset);
        pn_data_exit(f);
    } else {
        const char *k = "rabbitmq:stream-offset-spec";
        pn_data_put_symbol(f, pn_bytes(strlen(k), k));
        put_offset_value(f, a->offset);
    }
    pn_data_exit(f);
}

static void put_property(pn_data_t *p, const char *k, const char *v) {
    pn_data_put_symbol(p, pn_bytes(strlen(k), k));
    pn_data_put_string(p, pn_bytes(strlen(v), v));
}

/* link properties: event-streams-partition (--partition), spate:producer-name (--producer-name) */
static void set_properties(app_t *a, pn_link_t *l) {
    int named = a->producer_name && a->mode == MODE_PUBLISH;
    if (!a->partition && !named) return;
    pn_data_t *p = pn_link_properties(l);
    pn_data_put_map(p);
    pn_data_enter(p);
    if (a->partition) put_property(p, "event-streams-partition", a->partition);
    if (named) put_property(p, "spate:producer-name", a->producer_name);
    pn_data_exit(p);
}

static void open_link(app_t *a) {
    pn_connection_t *c = a->conn;
    pn_session_t *s = pn_session(c);
    pn_connection_set_container(c, a->mode == MODE_PUBLISH ? "amqp_load-publish" : "amqp_load-consume");
    pn_connection_set_hostname(c, a->host);
    pn_connection_open(c);
    pn_session_set_incoming_capacity(s, 64u * 1024u * 1024u);
    pn_session_open(s);
    if (a->mode == MODE_PUBLISH) {
        a->link = pn_sender(s, "amqp_load-sender");
        pn_terminus_set_address(pn_link_target(a->link), a->address);
        pn_link_set_snd_settle_mode(a->link, PN_SND_UNSETTLED);
    } else {
        a->link = pn_receiver(s, "amqp_load-receiver");
        pn_terminus_set_address(pn_link_source(a->link), a->address);
        set_source_filter(a, a->link);
        if (a->settled) pn_link_set_snd_settle_mode(a->link, PN_SND_SETTLED);
    }
    set_properties(a, a->link);
    pn_link_open(a->link);
    if (a->mode != MODE_PUBLISH) {
        a->t_attach = mono_ns();
        pn_link_flow(a->link, (int)a->credit);
    }
}

/* ---- publish ------------------------------------------------------------------------------- */

static long confirmed(const app_t *a) {
    return a->accepted + a->rejected + a->released + a->modified + a->settled_no_state;
}

static void pump_send(app_t *a) {
    pn_link_t *l = a->link;
    if (!l || a->closing || !a->attached) return;
    long limit = a->total;
    if (a->rate > 0) { /* paced: what is due by now */
        uint64_t now = mono_ns();
        if (!a->t_pace0) a->t_pace0 = now;
        long due = (long)((double)(now - a->t_pace0) / 1e9 * a->rate) + 1;
        limit = due < a->total ? due : a->total;
    }
    while (a->sent < limit && pn_link_credit(l) > 0 && a->sent - confirmed(a) < a->window) {
        uint64_t seq = (uint64_t)++a->sent;
        put_u64le(a->msg + a->seq_at, seq);
        if (a->id_at) put_u64be(a->msg + a->id_at, seq);
        if (a->key_at) {
            char digits[11];
            snprintf(digits, sizeof digits, "%010llu", (unsigned long long)(seq % 10000000000ull));
            memcpy(a->msg + a->key_at, digits, 10);
        }
        put_u64le(a->msg + a->ts_at, real_ns());
        pn_delivery(l, pn_dtag((const char *)&seq, sizeof seq));
        uint64_t t = mono_ns();
        if (!a->t_first) a->t_first = t;
        a->t_sent[seq] = t;
        pn_link_send(l, (const char *)a->msg, a->msg_len);
        pn_link_advance(l);
    }
}

static void on_sender_delivery(app_t *a, pn_delivery_t *d) {
    if (a->done) return;
    if (!pn_delivery_updated(d) && !pn_delivery_settled(d)) return;
    uint64_t state = pn_delivery_remote_state(d);
    switch (state) {
    case PN_ACCEPTED: a->accepted++; break;
    case PN_REJECTED: {
        a->rejected++;
        pn_condition_t *c = pn_disposition_condition(pn_delivery_remote(d));
        set_error(a, "rejected: %s: %s", pn_condition_get_name(c), pn_condition_get_description(c));
        break;
    }
    case PN_RELEASED: a->released++; break;
    case PN_MODIFIED: a->modified++; break;
    default:
        if (!pn_delivery_settled(d)) return; /* non-terminal (e.g. received) */
        a->settled_no_state++;
        break;
    }
    pn_bytes_t tag = pn_delivery_tag(d);
    uint64_t seq = 0;
    if (tag.size == sizeof seq) memcpy(&seq, tag.start, sizeof seq);
    uint64_t now = mono_ns();
    if (seq >= 1 && seq <= (uint64_t)a->total && a->t_sent[seq]) {
        a->lat[a->n_lat++] = now - a->t_sent[seq];
        a->t_sent[seq] = 0;
    }
    pn_delivery_settle(d);
    if (confirmed(a) >= a->total) {
        a->t_last = now;
        a->done = 1;
        close_conn(a);
    } else {
        pump_send(a);
    }
}

/* ---- consume ------------------------------------------------------------------------------- */

static void on_receiver_delivery(app_t *a, pn_delivery_t *d) {
    if (a->done) { /* deliveries already in flight when the N-th arrived: not counted */
        pn_delivery_settle(d);
        return;
    }
    if (!pn_delivery_readable(d)) return;
    pn_link_t *l = pn_delivery_link(d);
    for (;;) {
        ssize_t r = pn_link_recv(l, (char *)a->rbuf + a->rlen, RECV_BUF_BYTES - a->rlen);
        if (r > 0) { a->rlen += (size_t)r; continue; }
        if (r == PN_EOS || r == 0) break;
        if (r == PN_ABORTED) { a->rlen = 0; pn_delivery_settle(d); pn_link_flow(l, 1); return; }
        set_error(a, "pn_link_recv failed: %s%s", pn_code((int)r), "");
        close_conn(a);
        return;
    }
    if (pn_delivery_partial(d)) {
        if (a->rlen >= RECV_BUF_BYTES) { set_error(a, "message over %s%s", "4 MiB", ""); close_conn(a); }
        return;
    }
    uint64_t now_real = a->mode == MODE_LATENCY ? real_ns() : 0;
    const uint8_t *data = NULL;
    size_t len = 0;
    int has_off = 0;
    if (scan_message(a->rbuf, a->rlen, &data, &len, &has_off) == 0 && len >= 16) {
        uint64_t seq = get_u64le(data);
        if (a->received == 0) a->first_seq = seq;
        else if (seq != a->last_seq + 1) a->seq_breaks++;
        a->last_seq = seq;
        if (a->mode == MODE_LATENCY && a->n_lat < a->total) {
            uint64_t ts = get_u64le(data + 8);
            a->lat[a->n_lat++] = now_real > ts ? now_real - ts : 0;
        }
    } else {
        a->bad_body++;
    }
    a->da_offset_seen += has_off;
    a->rlen = 0;
    if (!pn_delivery_settled(d)) pn_delivery_update(d, PN_ACCEPTED); /* sent settled: no outcome */
    pn_delivery_settle(d);
    a->received++;
    if (a->received >= a->total) {
        a->t_last = mono_ns();
        a->done = 1;
        close_conn(a);
        return;
    }
    int credit = pn_link_credit(l);
    if (credit < a->credit / 2) pn_link_flow(l, (int)a->credit - credit);
}

/* ---- the latency producer (a child process: this binary in publish mode) ------------------- */

static void start_producer(app_t *a) {
    int fds[2];
    if (pipe(fds) != 0) { set_error(a, "pipe: %s%s", strerror(errno), ""); close_conn(a); return; }
    char count[32], window[32], rate[32], duration[32], timeout[32];
    snprintf(count, sizeof count, "%ld", a->total);
    snprintf(window, sizeof window, "%ld", a->window);
    snprintf(rate, sizeof rate, "%.3f", a->rate);
    snprintf(duration, sizeof duration, "%.3f", a->duration);
    snprintf(timeout, sizeof timeout, "%.0f", a->duration + 60.0);
    const char *argv[32];
    int k = 0;
    argv[k++] = a->self_path; argv[k++] = "publish";
    argv[k++] = "--host"; argv[k++] = a->host; argv[k++] = "--port"; argv[k++] = a->port;
    argv[k++] = "--address"; argv[k++] = a->address; argv[k++] = "--count"; argv[k++] = count;
    argv[k++] = "--size"; char size[32]; snprintf(size, sizeof size, "%ld", a->size); argv[k++] = size;
    argv[k++] = "--window"; argv[k++] = window; argv[k++] = "--rate"; argv[k++] = rate;
    argv[k++] = "--duration"; argv[k++] = duration; argv[k++] = "--timeout"; argv[k++] = timeout;
    if (a->user) { argv[k++] = "--user"; argv[k++] = a->user; }
    if (a->password) { argv[k++] = "--password"; argv[k++] = a->password; }
    if (a->partition) { argv[k++] = "--partition"; argv[k++] = a->partition; }
    argv[k] = NULL;
    pid_t pid = fork();
    if (pid < 0) { set_error(a, "fork: %s%s", strerror(errno), ""); close_conn(a); return; }
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execv(a->self_path, (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    a->child = pid;
    a->child_fd = fds[0];
}

/* ---- event loop ---------------------------------------------------------------------------- */

static void check_condition(app_t *a, pn_condition_t *c, const char *where) {
    if (pn_condition_is_set(c)) {
        char buf[64];
        snprintf(buf, sizeof buf, "%s: %%s: %%s", where);
        set_error(a, buf, pn_condition_get_name(c), pn_condition_get_description(c));
        close_conn(a);
    }
}

/* copy a string-ish or integer pn_data value at the cursor into buf */
static int data_to_str(pn_data_t *d, char *buf, size_t n) {
    switch (pn_data_type(d)) {
    case PN_STRING: case PN_SYMBOL: {
        pn_bytes_t b = pn_data_type(d) == PN_STRING ? pn_data_get_string(d) : pn_data_get_symbol(d);
        if (b.size == 0 || b.size >= n) return -1;
        memcpy(buf, b.start, b.size);
        buf[b.size] = '\0';
        return 0;
    }
    case PN_USHORT: snprintf(buf, n, "%u", (unsigned)pn_data_get_ushort(d)); return 0;
    case PN_UINT: snprintf(buf, n, "%u", (unsigned)pn_data_get_uint(d)); return 0;
    case PN_INT: snprintf(buf, n, "%d", (int)pn_data_get_int(d)); return 0;
    case PN_ULONG: snprintf(buf, n, "%llu", (unsigned long long)pn_data_get_ulong(d)); return 0;
    case PN_LONG: snprintf(buf, n, "%lld", (long long)pn_data_get_long(d)); return 0;
    default: return -1;
    }
}

/* An attach refused before anything was sent or received, either
 *  - with amqp:link:redirect (AMQP 1.0 2.8.15: info network-host, port): remember where to go,
 *    at most REDIRECT_HOPS_MAX hops per run; or
 *  - with info spate:retryable = true (e.g. the partition has no leader during an election):
 *    attach again to the same node after ATTACH_RETRY_MS, until --timeout.
 * Returns 1 when the caller should close this connection (main() reconnects), else 0. */
static int take_redirect(app_t *a, pn_condition_t *c) {
    if (!pn_condition_is_set(c) || a->attached || a->closing) return 0;
    const char *name = pn_condition_get_name(c);
    if (!name) return 0;
    if (strcmp(name, "amqp:link:redirect")) {
        pn_data_t *info = pn_condition_info(c);
        char key[64];
        int retryable = 0;
        pn_data_rewind(info);
        if (pn_data_next(info) && pn_data_type(info) == PN_MAP) {
            pn_data_enter(info);
            while (pn_data_next(info)) {
                int ok = data_to_str(info, key, sizeof key) == 0;
                if (!pn_data_next(info)) break;
                if (ok && !strcmp(key, "spate:retryable") && pn_data_type(info) == PN_BOOL)
                    retryable = pn_data_get_bool(info);
            }
            pn_data_exit(info);
        }
        if (!retryable || mono_ns() + (uint64_t)ATTACH_RETRY_MS * 1000000ull > a->deadline) return 0;
        if (a->host != a->redirect_host) /* after a redirect, host already points there */
            snprintf(a->redirect_host, sizeof a->redirect_host, "%s", a->host);
        if (a->port != a->redirect_port)
            snprintf(a->redirect_port, sizeof a->redirect_port, "%s", a->port);
        a->redirect_pending = a->retry_pending = 1;
        if (a->attach_retries++ == 0)
            fprintf(stderr, "amqp_load: attach refused (%s: %s), retrying every %d ms\n", name,
                    pn_condition_get_description(c) ? pn_condition_get_description(c) : "",
                    ATTACH_RETRY_MS);
        return 1;
    }
    if (a->redirects >= REDIRECT_HOPS_MAX) {
        char hops[16];
        snprintf(hops, sizeof hops, "%d", REDIRECT_HOPS_MAX);
        set_error(a, "link: amqp:link:redirect: more than %s hops%s", hops, "");
        return 0;
    }
    char host[HOST_CHARS] = "", port[16] = "", key[64];
    pn_data_t *info = pn_condition_info(c);
    pn_data_rewind(info);
    if (pn_data_next(info) && pn_data_type(info) == PN_MAP) {
        pn_data_enter(info);
        while (pn_data_next(info)) {
            int ok = data_to_str(info, key, sizeof key) == 0;
            if (!pn_data_next(info)) break;
            if (!ok) continue;
            if (!strcmp(key, "network-host")) data_to_str(info, host, sizeof host);
            else if (!strcmp(key, "port")) data_to_str(info, port, sizeof port);
        }
        pn_data_exit(info);
    }
    if (!host[0] || !port[0]) {
        set_error(a, "link: amqp:link:redirect without network-host/port: %s%s",
                  pn_condition_get_description(c), "");
        return 0;
    }
    memcpy(a->redirect_host, host, sizeof host);
    memcpy(a->redirect_port, port, sizeof port);
    a->redirect_pending = 1;
    a->redirects++;
    fprintf(stderr, "amqp_load: redirected to %s:%s (%s)\n", host, port,
            pn_condition_get_description(c) ? pn_condition_get_description(c) : "");
    return 1;
}

static void handle(app_t *a, pn_event_t *e) {
    switch (pn_event_type(e)) {
    case PN_CONNECTION_INIT:
        open_link(a);
        break;
    case PN_LINK_REMOTE_OPEN: {
        /* a refused attach carries a null terminus and is followed by a detach (AMQP 2.6.3):
         * not attached, wait for the detach and its condition */
        pn_link_t *l = pn_event_link(e);
        pn_terminus_t *far = pn_link_is_sender(l) ? pn_link_remote_target(l) : pn_link_remote_source(l);
        if (pn_terminus_get_type(far) == PN_UNSPECIFIED) break;
        a->attached = 1;
        if (a->mode == MODE_LATENCY && !a->child) start_producer(a);
        if (a->mode == MODE_PUBLISH) pump_send(a);
        break;
    }
    case PN_LINK_FLOW:
        if (a->mode == MODE_PUBLISH) pump_send(a);
        break;
    case PN_DELIVERY: {
        pn_delivery_t *d = pn_event_delivery(e);
        if (pn_link_is_sender(pn_delivery_link(d))) on_sender_delivery(a, d);
        else on_receiver_delivery(a, d);
        break;
    }
    case PN_PROACTOR_TIMEOUT:
        /* the timer runs outside the connection's context: work on the connection (sends,
         * close) must happen in its own batch, so ask for a PN_CONNECTION_WAKE */
        if (!a->transport_closed) pn_connection_wake(a->conn);
        pn_proactor_set_timeout(a->proactor, a->rate > 0 && a->mode == MODE_PUBLISH ? PACE_TICK_MS : IDLE_TICK_MS);
        break;
    case PN_CONNECTION_WAKE:
        if (!a->closing && mono_ns() > a->deadline) {
            char lim[32];
            snprintf(lim, sizeof lim, "%.0f", a->timeout_s);
            set_error(a, "timeout after %ss%s", lim, "");
            close_conn(a);
        }
        if (a->mode == MODE_PUBLISH) pump_send(a);
        break;
    case PN_TRANSPORT_ERROR:
        if (a->redirect_pending) break;
        check_condition(a, pn_transport_condition(pn_event_transport(e)), "transport");
        break;
    case PN_TRANSPORT_CLOSED:
        if (!a->done) check_condition(a, pn_transport_condition(pn_event_transport(e)), "transport");
        if (!a->done && !a->error[0] && !a->redirect_pending)
            set_error(a, "connection closed before the run completed%s%s", "", "");
        a->closing = 1;
        a->transport_closed = 1;
        if (!a->close_by) a->close_by = mono_ns();
        break;
    case PN_CONNECTION_REMOTE_CLOSE:
        if (a->redirect_pending) { close_conn(a); break; }
        check_condition(a, pn_connection_remote_condition(pn_event_connection(e)), "connection");
        close_conn(a);
        break;
    case PN_SESSION_REMOTE_CLOSE:
        check_condition(a, pn_session_remote_condition(pn_event_session(e)), "session");
        close_conn(a);
        break;
    case PN_LINK_REMOTE_CLOSE:
    case PN_LINK_REMOTE_DETACH:
        if (take_redirect(a, pn_link_remote_condition(pn_event_link(e)))) {
            close_conn(a);
            break;
        }
        check_condition(a, pn_link_remote_condition(pn_event_link(e)), "link");
        if (!a->done && !a->error[0]) set_error(a, "link detached by the peer%s%s", "", "");
        close_conn(a);
        break;
    default:
        break;
    }
}

static void run(app_t *a) {
    pn_proactor_set_timeout(a->proactor, a->rate > 0 && a->mode == MODE_PUBLISH ? PACE_TICK_MS : IDLE_TICK_MS);
    for (;;) {
        pn_event_batch_t *b = pn_proactor_wait(a->proactor);
        pn_event_t *e;
        int inactive = 0;
        while ((e = pn_event_batch_next(b))) {
            if (pn_event_type(e) == PN_PROACTOR_INACTIVE) inactive = 1;
            handle(a, e);
        }
        pn_proactor_done(a->proactor, b);
        /* our recurring timer keeps the proactor from ever going inactive: stop on our own
         * transport's close, or when the close handshake overruns its grace period */
        if (inactive || a->transport_closed) return;
        if (a->closing && a->close_by && mono_ns() > a->close_by) return;
    }
}

/* ---- output -------------------------------------------------------------------------------- */

static int cmp_u64(const void *x, const void *y) {
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

/* nearest-rank percentiles as benchlib.pct; "null" when empty */
static void print_lat(FILE *f, const char *prefix, uint64_t *v, long n) {
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    const int ps[] = {50, 99};
    for (int i = 0; i < 2; i++) {
        if (!n) { fprintf(f, ", \"%s_p%d_ms\": null", prefix, ps[i]); continue; }
        long k = (long)ceil(ps[i] / 100.0 * (double)n) - 1;
        if (k < 0) k = 0;
        if (k > n - 1) k = n - 1;
        fprintf(f, ", \"%s_p%d_ms\": %.3f", prefix, ps[i], (double)v[k] / 1e6);
    }
    if (n) fprintf(f, ", \"%s_max_ms\": %.3f", prefix, (double)v[n - 1] / 1e6);
    else fprintf(f, ", \"%s_max_ms\": null", prefix);
}

static void print_common(app_t *a, const char *workload) {
    printf("{\"client\": \"c-proton\", \"protocol\": \"amqp1.0\", \"workload\": \"%s\", \"size\": %ld",
           workload, a->size);
    printf(", \"address\": ");
    json_str(stdout, a->address);
    printf(", \"endpoint\": \"%s:%s\", \"redirects\": %d, \"attach_retries\": %d", a->host, a->port,
           a->redirects, a->attach_retries);
    if (a->label) { printf(", \"label\": "); json_str(stdout, a->label); }
    if (a->partition) { printf(", \"partition\": "); json_str(stdout, a->partition); }
    if (a->producer_name) { printf(", \"producer_name\": "); json_str(stdout, a->producer_name); }
}

static void print_error(app_t *a) {
    if (a->error[0]) { printf(", \"error\": "); json_str(stdout, a->error); }
    else printf(", \"error\": null");
}

static void print_publish(app_t *a) {
    print_common(a, a->rate > 0 ? "w3-producer" : "w1");
    printf(", \"count\": %ld, \"window\": %ld, \"sent\": %ld, \"confirmed\": %ld, \"rejected\": %ld"
           ", \"released\": %ld, \"modified\": %ld, \"settled_no_state\": %ld",
           a->total, a->window, a->sent, a->accepted, a->rejected, a->released, a->modified,
           a->settled_no_state);
    if (a->rate > 0) printf(", \"rate\": %.1f, \"duration_s\": %.3f", a->rate, a->duration);
    if (a->t_first && a->t_last > a->t_first) {
        double el = (double)(a->t_last - a->t_first) / 1e9;
        printf(", \"elapsed_s\": %.3f, \"msgs_per_s\": %.1f", el, (double)a->accepted / el);
        /* CLOCK_MONOTONIC is system-wide: concurrent producers' spans can be merged */
        printf(", \"t_first_mono_ns\": %llu, \"t_last_mono_ns\": %llu",
               (unsigned long long)a->t_first, (unsigned long long)a->t_last);
    }
    print_lat(stdout, "confirm", a->lat, a->n_lat);
    print_error(a);
    printf("}\n");
}

static void print_consume(app_t *a) {
    print_common(a, "w2");
    printf(", \"count\": %ld, \"credit\": %ld, \"settled\": %s, \"offset\": ", a->total,
           a->credit, a->settled ? "true" : "false");
    json_str(stdout, a->offset);
    printf(", \"filter\": \"%s\", \"received\": %ld, \"da_offset_seen\": %ld, \"bad_body\": %ld"
           ", \"first_seq\": %llu, \"last_seq\": %llu, \"seq_breaks\": %ld",
           a->filter, a->received, a->da_offset_seen, a->bad_body,
           (unsigned long long)a->first_seq, (unsigned long long)a->last_seq, a->seq_breaks);
    if (a->t_last > a->t_attach) {
        double el = (double)(a->t_last - a->t_attach) / 1e9;
        printf(", \"elapsed_s\": %.3f, \"msgs_per_s\": %.1f", el, (double)a->received / el);
    }
    print_error(a);
    printf("}\n");
}

static void print_latency(app_t *a, const char *producer_json) {
    print_common(a, "w3");
    printf(", \"rate\": %.1f, \"duration_s\": %.3f, \"expected\": %ld, \"received\": %ld"
           ", \"credit\": %ld, \"da_offset_seen\": %ld, \"bad_body\": %ld, \"seq_breaks\": %ld",
           a->rate, a->duration, a->total, a->received, a->credit, a->da_offset_seen, a->bad_body,
           a->seq_breaks);
    print_lat(stdout, "e2e", a->lat, a->n_lat);
    printf(", \"producer\": %s", producer_json && *producer_json ? producer_json : "null");
    print_error(a);
    printf("}\n");
}

/* ---- main ---------------------------------------------------------------------------------- */

static void usage(void) {
    fprintf(stderr,
            "usage: amqp_load publish|consume|latency --address A [--host H] [--port P]\n"
            "  [--count N] [--size S] [--window W] [--credit C] [--rate R] [--duration D]\n"
            "  [--offset first|last|next|INT] [--filter rabbitmq|oasis|none]\n"
            "  [--user U --password P] [--partition ID] [--producer-name NAME] [--annotate] [--group-keys]\n"
            "  [--settled]\n"
            "  [--timeout S] [--label TEXT]\n");
    exit(2);
}

static long parse_long(const char *s, const char *name) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 0) { fprintf(stderr, "bad %s: %s\n", name, s); exit(2); }
    return v;
}

static double parse_double(const char *s, const char *name) {
    char *end;
    double v = strtod(s, &end);
    if (*end || v < 0) { fprintf(stderr, "bad %s: %s\n", name, s); exit(2); }
    return v;
}

static void connect_to(app_t *a) {
    a->conn = pn_connection();
    pn_transport_t *t = pn_transport();
    pn_sasl_t *sasl = pn_sasl(t);
    if (a->user) {
        pn_connection_set_user(a->conn, a->user);
        if (a->password) pn_connection_set_password(a->conn, a->password);
        pn_sasl_allowed_mechs(sasl, "PLAIN");
        pn_sasl_set_allow_insecure_mechs(sasl, true);
    } else {
        pn_sasl_allowed_mechs(sasl, "ANONYMOUS");
    }
    char addr[PN_MAX_ADDR];
    pn_proactor_addr(addr, sizeof addr, a->host, a->port);
    pn_proactor_connect2(a->proactor, a->conn, t, addr);
}

int main(int argc, char **argv) {
    app_t a;
    memset(&a, 0, sizeof a);
    a.host = "127.0.0.1"; a.port = "5672"; a.offset = NULL; a.filter = "rabbitmq";
    a.count = 200000; a.size = 100; a.window = 10000; a.credit = 10000;
    a.rate = 0; a.duration = 20; a.timeout_s = 300; a.child_fd = -1;
    if (argc < 2) usage();
    if (!strcmp(argv[1], "publish")) a.mode = MODE_PUBLISH;
    else if (!strcmp(argv[1], "consume")) a.mode = MODE_CONSUME;
    else if (!strcmp(argv[1], "latency")) a.mode = MODE_LATENCY;
    else usage();
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--annotate")) { a.annotate = 1; continue; } /* the flags */
        if (!strcmp(o, "--group-keys")) { a.group_keys = 1; continue; }
        if (!strcmp(o, "--settled")) { a.settled = 1; continue; }
        if (i + 1 >= argc) usage();
        const char *v = argv[++i];
        if (!strcmp(o, "--host")) a.host = v;
        else if (!strcmp(o, "--port")) a.port = v;
        else if (!strcmp(o, "--address")) a.address = v;
        else if (!strcmp(o, "--count")) a.count = parse_long(v, o);
        else if (!strcmp(o, "--size")) a.size = parse_long(v, o);
        else if (!strcmp(o, "--window")) a.window = parse_long(v, o);
        else if (!strcmp(o, "--credit")) a.credit = parse_long(v, o);
        else if (!strcmp(o, "--rate")) a.rate = parse_double(v, o);
        else if (!strcmp(o, "--duration")) a.duration = parse_double(v, o);
        else if (!strcmp(o, "--timeout")) a.timeout_s = parse_double(v, o);
        else if (!strcmp(o, "--offset")) a.offset = v;
        else if (!strcmp(o, "--filter")) a.filter = v;
        else if (!strcmp(o, "--user")) a.user = v;
        else if (!strcmp(o, "--password")) a.password = v;
        else if (!strcmp(o, "--partition")) a.partition = v;
        else if (!strcmp(o, "--producer-name")) a.producer_name = v;
        else if (!strcmp(o, "--label")) a.label = v;
        else usage();
    }
    if (!a.address) usage();
    if (a.group_keys && (a.producer_name || a.annotate)) {
        fprintf(stderr, "--group-keys goes without --producer-name and --annotate\n");
        exit(2);
    }
    if (a.size < 16) { fprintf(stderr, "--size must be >= 16 (sequence + timestamp)\n"); exit(2); }
    if (a.window < 1 || a.credit < 1 || a.credit > 1000000000) { fprintf(stderr, "bad window/credit\n"); exit(2); }
    if (strcmp(a.filter, "rabbitmq") && strcmp(a.filter, "oasis") && strcmp(a.filter, "none")) usage();
    if (!a.offset) a.offset = "first";
    if (a.mode == MODE_LATENCY && a.rate <= 0) a.rate = 5000;
    a.total = (a.mode == MODE_LATENCY || (a.mode == MODE_PUBLISH && a.rate > 0))
                  ? (long)llround(a.rate * a.duration) : a.count;
    if (a.mode == MODE_PUBLISH && a.rate > 0 && a.count > 0 && a.count < a.total) a.total = a.count;
    if (a.total < 1) { fprintf(stderr, "nothing to do (count or rate*duration is 0)\n"); exit(2); }

    static char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl <= 0) { perror("readlink /proc/self/exe"); exit(2); }
    self[sl] = '\0';
    a.self_path = self;

    if (a.mode == MODE_PUBLISH) {
        encode_message(&a);
        a.t_sent = calloc((size_t)a.total + 1, sizeof *a.t_sent);
    } else {
        a.rbuf = malloc(RECV_BUF_BYTES);
    }
    a.lat = calloc((size_t)a.total + 1, sizeof *a.lat);
    if ((a.mode == MODE_PUBLISH && (!a.msg || !a.t_sent)) || (a.mode != MODE_PUBLISH && !a.rbuf) || !a.lat) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }

    a.deadline = mono_ns() + (uint64_t)(a.timeout_s * 1e9);
    a.proactor = pn_proactor();
    connect_to(&a);
    run(&a);
    while (a.redirect_pending && !a.error[0] && mono_ns() < a.deadline) {
        /* the refused connection is closed and freed by the proactor: start over there */
        if (a.retry_pending) usleep(ATTACH_RETRY_MS * 1000);
        a.retry_pending = 0;
        a.host = a.redirect_host;
        a.port = a.redirect_port;
        a.redirect_pending = 0;
        a.attached = a.closing = a.transport_closed = 0;
        a.close_by = 0;
        a.link = NULL;
        connect_to(&a);
        run(&a);
    }
    if (a.redirect_pending && !a.error[0]) set_error(&a, "timeout while following redirects%s%s", "", "");

    char producer[8192] = "";
    if (a.child > 0) {
        int status = 0;
        uint64_t wait_until = mono_ns() + (uint64_t)(a.done ? a.duration + 60.0 : 5.0) * 1000000000ull;
        pid_t r = 0;
        while ((r = waitpid(a.child, &status, WNOHANG)) == 0 && mono_ns() < wait_until) usleep(20000);
        if (r == 0) { /* ours and overdue: stop it */
            kill(a.child, SIGTERM);
            usleep(200000);
            if (waitpid(a.child, &status, WNOHANG) == 0) { kill(a.child, SIGKILL); waitpid(a.child, &status, 0); }
            set_error(&a, "producer did not finish%s%s", "", "");
        }
        size_t got = 0;
        ssize_t n;
        while (got < sizeof producer - 1 && (n = read(a.child_fd, producer + got, sizeof producer - 1 - got)) > 0)
            got += (size_t)n;
        producer[got] = '\0';
        while (got && (producer[got - 1] == '\n' || producer[got - 1] == '\r')) producer[--got] = '\0';
        close(a.child_fd);
        if (!got) set_error(&a, "producer printed nothing%s%s", "", "");
    }

    pn_proactor_cancel_timeout(a.proactor);
    if (a.mode == MODE_PUBLISH) print_publish(&a);
    else if (a.mode == MODE_CONSUME) print_consume(&a);
    else print_latency(&a, producer);
    fflush(stdout);
    pn_proactor_free(a.proactor);
    return a.done && !a.error[0] ? 0 : 1;
}
