/* spate.gateway._fastsend: a run of consumer deliveries handed to proton in one call (ADR 0030),
   and a producer link's run of plain deliveries taken from proton in one call (ADR 0038).

   The egress hot path (spate.gateway.consumer, RESULTS §26/§31) spent about half of a delivered
   message's CPU in per-message Python: the splice of the delivery annotations into each record
   (sections.splice_run, a bytes object per message) and four cffi calls (pn_delivery,
   pn_link_send, pn_delivery_settle or pn_link_advance, the tag). `send_run` does the same for a
   whole run in C: each record's header, the run's annotation prefix, the offset's 20 digits,
   the suffix and the rest of the record are copied into one scratch buffer, which
   pn_link_send copies on (proton owns its bytes once it returns), then the delivery is settled
   (pre-settled links) or the link advanced. The wire is what the Python path sends, byte for
   byte: same frames, tags, annotations and settlement (tests/gateway/test_fastsend.py).

   Proton's functions come as addresses from the process's own cproton_ffi (`fastsend.py`), so
   this module links against nothing and always calls the proton the rest of the process uses
   (never the system's libqpid-proton, another version with other struct layouts).

   Header layouts read here, as in sections.splice_run: none (the record does not start with
   00 53 70), `00 53 70 45` (list0) and `00 53 70 c0 <size> ...` (list8). Anything else, or a
   record too short for those reads, stops the run at that record: the caller sends it the
   careful way (sections.splice_run) and calls again from the next one. */

#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    size_t size;
    const char *start;
} spate_pn_bytes_t; /* pn_bytes_t, i.e. pn_delivery_tag_t: {size, start} */

typedef void *(*delivery_fn)(void *link, spate_pn_bytes_t tag);
typedef Py_ssize_t (*send_fn)(void *link, const char *bytes, size_t n);
typedef _Bool (*advance_fn)(void *link);
typedef void (*settle_fn)(void *delivery);

#define OFFSET_DIGITS 20
#define TAG_BYTES 8

static char *scratch = NULL; /* grows to the largest delivery; used with the GIL held only */
static size_t scratch_bytes = 0;

static int ensure_scratch(size_t need) {
    if (need <= scratch_bytes) return 0;
    size_t size = scratch_bytes ? scratch_bytes : 4096;
    while (size < need) size *= 2;
    char *grown = PyMem_Realloc(scratch, size);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    scratch = grown;
    scratch_bytes = size;
    return 0;
}

/* The header's length, or -1: not a layout read here (the caller's careful path). */
static Py_ssize_t header_cut(const unsigned char *r, Py_ssize_t n) {
    if (n < 3 || r[0] != 0x00 || r[1] != 0x53) return -1;
    if (r[2] != 0x70) return 0; /* another section first: no header */
    if (n < 4) return -1;
    if (r[3] == 0x45) return 4;
    if (r[3] == 0xC0) {
        if (n < 5) return -1;
        Py_ssize_t cut = 5 + (Py_ssize_t)r[4];
        return cut <= n ? cut : -1;
    }
    return -1;
}

static void put_digits(char *at, unsigned long long value) {
    for (int i = OFFSET_DIGITS - 1; i >= 0; i--) {
        at[i] = (char)('0' + value % 10);
        value /= 10;
    }
}

PyDoc_STRVAR(send_run_doc,
"send_run(functions, link, records, start, first_offset, prefix, suffix, first_tag, presettled)\n"
"-> (stopped, bytes_sent)\n\n"
"Send records[start:] as deliveries on `link` (an address): record i gets the delivery\n"
"annotations prefix + '%020d' % (first_offset + i) + suffix after its header, and the 8-byte\n"
"little-endian tag first_tag + i. `functions`: the addresses of pn_delivery, pn_link_send,\n"
"pn_link_advance and pn_delivery_settle. Stops at the first record whose header is not read\n"
"here (the caller sends that one); returns its index (len(records): all were sent) and the\n"
"bytes handed to pn_link_send.");

static PyObject *send_run(PyObject *self, PyObject *args) {
    unsigned long long f_delivery, f_send, f_advance, f_settle, link_address;
    PyObject *records;
    Py_ssize_t start;
    unsigned long long first_offset, first_tag;
    const char *prefix, *suffix;
    Py_ssize_t prefix_len, suffix_len;
    int presettled;
    (void)self;
    if (!PyArg_ParseTuple(args, "(KKKK)KOnKy#y#Kp", &f_delivery, &f_send, &f_advance, &f_settle,
                          &link_address, &records, &start, &first_offset, &prefix, &prefix_len,
                          &suffix, &suffix_len, &first_tag, &presettled))
        return NULL;
    if (!f_delivery || !f_send || !f_advance || !f_settle || !link_address) {
        PyErr_SetString(PyExc_ValueError, "send_run: a null function or link address");
        return NULL;
    }
    delivery_fn new_delivery = (delivery_fn)(uintptr_t)f_delivery;
    send_fn send = (send_fn)(uintptr_t)f_send;
    advance_fn advance = (advance_fn)(uintptr_t)f_advance;
    settle_fn settle = (settle_fn)(uintptr_t)f_settle;
    void *link = (void *)(uintptr_t)link_address;

    PyObject *seq = PySequence_Fast(records, "send_run: records must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (start < 0 || start > count) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_IndexError, "send_run: start outside the records");
        return NULL;
    }
    unsigned char tag[TAG_BYTES];
    spate_pn_bytes_t tag_bytes = {TAG_BYTES, (const char *)tag};
    unsigned long long sent_bytes = 0;
    Py_ssize_t i = start;
    for (; i < count; i++) {
        Py_buffer view;
        if (PyObject_GetBuffer(items[i], &view, PyBUF_SIMPLE) < 0) {
            Py_DECREF(seq);
            return NULL; /* a bug upstream: records are bytes or memoryviews */
        }
        const unsigned char *r = (const unsigned char *)view.buf;
        Py_ssize_t n = view.len;
        Py_ssize_t cut = header_cut(r, n);
        if (cut < 0) {
            PyBuffer_Release(&view);
            break;
        }
        size_t total = (size_t)n + (size_t)prefix_len + OFFSET_DIGITS + (size_t)suffix_len;
        if (ensure_scratch(total) < 0) {
            PyBuffer_Release(&view);
            Py_DECREF(seq);
            return NULL;
        }
        char *at = scratch;
        memcpy(at, r, (size_t)cut);
        at += cut;
        memcpy(at, prefix, (size_t)prefix_len);
        at += prefix_len;
        put_digits(at, first_offset + (unsigned long long)i);
        at += OFFSET_DIGITS;
        memcpy(at, suffix, (size_t)suffix_len);
        at += suffix_len;
        memcpy(at, r + cut, (size_t)(n - cut));
        PyBuffer_Release(&view);

        unsigned long long value = first_tag + (unsigned long long)i;
        for (int b = 0; b < TAG_BYTES; b++) tag[b] = (unsigned char)(value >> (8 * b));
        void *delivery = new_delivery(link, tag_bytes);
        send(link, scratch, total);
        if (presettled)
            settle(delivery); /* advances the link past it as well */
        else
            advance(link);
        sent_bytes += total;
    }
    Py_DECREF(seq);
    return Py_BuildValue("nK", i, sent_bytes);
}

/* -- ingress (ADR 0038): a producer link's plain deliveries, taken in one call ----------------- */

typedef void *(*current_fn)(void *link);
typedef _Bool (*delivery_flag_fn)(void *delivery);
typedef size_t (*pending_fn)(void *delivery);
typedef Py_ssize_t (*recv_fn)(void *link, char *bytes, size_t n);
typedef void (*update_fn)(void *delivery, uint64_t state);
typedef void *(*peek_fn)(void *collector);
typedef _Bool (*pop_fn)(void *collector);
typedef int (*event_type_fn)(void *event);
typedef void *(*event_delivery_fn)(void *event);
typedef void *(*delivery_link_fn)(void *delivery);
typedef _Bool (*link_flag_fn)(void *link);

#define SMALL_MESSAGE_BYTES 1024 /* spate.core.filtering.SMALL_MESSAGE_BYTES */
#define SECTIONS_MAX 64          /* spate.gateway.sections.SECTIONS_MAX */
#define WIDTH_VAR8 100
#define WIDTH_VAR32 101
#define WIDTH_NO 102
static const int width_by_nibble[16] = {
    WIDTH_NO, WIDTH_NO, WIDTH_NO, WIDTH_NO, 0, 1, 2, 4, 8, 16,
    WIDTH_VAR8, WIDTH_VAR32, WIDTH_VAR8, WIDTH_VAR32, WIDTH_VAR8, WIDTH_VAR32,
};

static uint32_t be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static uint64_t be64(const unsigned char *p) {
    return ((uint64_t)be32(p) << 32) | be32(p + 4);
}

/* spate.gateway.sections.is_plain, step for step. */
static int is_plain(const unsigned char *raw, Py_ssize_t n) {
    Py_ssize_t i = 0;
    int last = 0, bodies = 0, count = 0;
    while (i < n) {
        if (n - i < 4 || raw[i] || raw[i + 1] != 0x53) return 0;
        int code = raw[i + 2];
        if (code <= last) {
            if (code != last || (code != 0x75 && code != 0x76)) return 0;
        } else if (code >= 0x75) {
            if (code > 0x77 || bodies) return 0;
        } else if (code < 0x70 || code == 0x71) {
            return 0;
        }
        if (code >= 0x75) bodies++;
        count++;
        Py_ssize_t j = i + 4;
        int width = width_by_nibble[raw[i + 3] >> 4];
        if (width < WIDTH_VAR8) {
            i = j + width;
        } else if (width == WIDTH_VAR8) {
            if (j >= n) return 0;
            i = j + 1 + raw[j];
        } else if (width == WIDTH_VAR32) {
            if (j + 4 > n) return 0;
            i = j + 4 + (Py_ssize_t)be32(raw + j);
        } else {
            return 0;
        }
        if (i > n) return 0;
        last = code;
    }
    return bodies > 0 && count <= SECTIONS_MAX;
}

/* spate.core.filtering._compound_end: -1 for None. */
static Py_ssize_t compound_end(const unsigned char *raw, Py_ssize_t n, Py_ssize_t i) {
    int code = raw[i];
    if (code == 0x40 || code == 0x45) return i + 1;
    if ((code == 0xC0 || code == 0xC1) && n > i + 1) return i + 2 + raw[i + 1];
    if ((code == 0xD0 || code == 0xD1) && n >= i + 5) return i + 5 + (Py_ssize_t)be32(raw + i + 1);
    return -1;
}

/* spate.core.filtering.key_search_end, step for step. */
static Py_ssize_t key_search_end(const unsigned char *raw, Py_ssize_t n) {
    if (n <= SMALL_MESSAGE_BYTES) return n;
    Py_ssize_t i = 0;
    for (int k = 0; k < 3; k++) {
        if (n < i + 4 || raw[i] != 0x00 || raw[i + 1] != 0x53) return n;
        int code = raw[i + 2];
        if (code != 0x70 && code != 0x71 && code != 0x72) return i;
        Py_ssize_t end = compound_end(raw, n, i + 3);
        if (end < 0 || end > n) return n;
        if (code == 0x72) return end;
        i = end;
    }
    return n;
}

/* 0 when every one of `count` proton function addresses is set, else -1 with a ValueError
   naming `caller`. */
static int check_functions(const unsigned long long *f, int count, const char *caller) {
    for (int k = 0; k < count; k++) {
        if (!f[k]) {
            PyErr_Format(PyExc_ValueError, "%s: a null function address", caller);
            return -1;
        }
    }
    return 0;
}

PyDoc_STRVAR(recv_run_doc,
"recv_run(functions, link, size_max, presettled, keys, id_prefix, last_id, id_section,\n"
"         records, deliveries, ids) -> (taken, unconfirmed, last_id, raw, delivery)\n\n"
"Take the producer link's complete deliveries in order while each is one the hot path takes\n"
"as it is: plain (sections.is_plain), none of `keys` where an annotation can be\n"
"(filtering.has_annotation_key), and, for a named link (`id_prefix` not None), its publishing\n"
"id at the learned offset and above `last_id` (then noted in `ids`, and the annotations\n"
"section cut when `id_section` >= 0). Each taken message is appended to `records`; its\n"
"delivery to `deliveries` (its address, or None when it came settled: it is settled here).\n"
"`functions`: the addresses of pn_link_current, pn_delivery_partial, pn_delivery_aborted,\n"
"pn_delivery_pending, pn_link_recv, pn_link_advance, pn_delivery_settled and\n"
"pn_delivery_settle. Stops before a delivery that is partial, aborted, empty or larger than\n"
"`size_max` (left current: the caller's loop reads it), or after receiving one it does not\n"
"take: `raw` (its bytes, the link advanced past it) and `delivery` (its address) for the\n"
"caller's careful path; else raw is None.");

static PyObject *recv_run(PyObject *self, PyObject *args) {
    unsigned long long f[8], link_address;
    Py_ssize_t size_max, id_section;
    int presettled;
    PyObject *keys, *id_prefix, *last_id_object, *records, *deliveries, *ids;
    (void)self;
    if (!PyArg_ParseTuple(args, "(KKKKKKKK)KnpO!OOnO!O!O!", &f[0], &f[1], &f[2], &f[3], &f[4],
                          &f[5], &f[6], &f[7], &link_address, &size_max, &presettled,
                          &PyTuple_Type, &keys, &id_prefix, &last_id_object, &id_section,
                          &PyList_Type, &records, &PyList_Type, &deliveries, &PyList_Type, &ids))
        return NULL;
    if (check_functions(f, 8, "recv_run") < 0) return NULL;
    if (!link_address || size_max <= 0) {
        PyErr_SetString(PyExc_ValueError, "recv_run: a null link or no size limit");
        return NULL;
    }
    current_fn current = (current_fn)(uintptr_t)f[0];
    delivery_flag_fn partial = (delivery_flag_fn)(uintptr_t)f[1];
    delivery_flag_fn aborted = (delivery_flag_fn)(uintptr_t)f[2];
    pending_fn pending = (pending_fn)(uintptr_t)f[3];
    recv_fn recv = (recv_fn)(uintptr_t)f[4];
    advance_fn advance = (advance_fn)(uintptr_t)f[5];
    delivery_flag_fn remote_settled = (delivery_flag_fn)(uintptr_t)f[6];
    settle_fn settle = (settle_fn)(uintptr_t)f[7];
    void *link = (void *)(uintptr_t)link_address;

    Py_ssize_t key_count = PyTuple_GET_SIZE(keys);
    for (Py_ssize_t k = 0; k < key_count; k++) {
        if (!PyBytes_Check(PyTuple_GET_ITEM(keys, k)) ||
            PyBytes_GET_SIZE(PyTuple_GET_ITEM(keys, k)) == 0) {
            PyErr_SetString(PyExc_TypeError, "recv_run: keys must be non-empty bytes");
            return NULL;
        }
    }
    int named = id_prefix != Py_None;
    const unsigned char *prefix = NULL;
    Py_ssize_t prefix_len = 0;
    if (named) {
        if (!PyBytes_Check(id_prefix)) {
            PyErr_SetString(PyExc_TypeError, "recv_run: id_prefix must be bytes or None");
            return NULL;
        }
        prefix = (const unsigned char *)PyBytes_AS_STRING(id_prefix);
        prefix_len = PyBytes_GET_SIZE(id_prefix);
    }
    /* last_id: -1 (nothing taken yet) or an unsigned 64-bit publishing id */
    int have_last = 0;
    unsigned long long last_id = 0;
    if (named) {
        int overflow = 0;
        long long signed_last = PyLong_AsLongLongAndOverflow(last_id_object, &overflow);
        if (signed_last == -1 && PyErr_Occurred()) return NULL;
        if (overflow > 0) {
            last_id = PyLong_AsUnsignedLongLong(last_id_object);
            if (PyErr_Occurred()) return NULL;
            have_last = 1;
        } else if (overflow == 0 && signed_last >= 0) {
            last_id = (unsigned long long)signed_last;
            have_last = 1;
        }
    }

    Py_ssize_t taken = 0, unconfirmed = 0;
    PyObject *handed = NULL;
    void *handed_delivery = NULL;
    for (;;) {
        void *delivery = current(link);
        if (delivery == NULL || partial(delivery) || aborted(delivery)) break;
        size_t size = pending(delivery);
        if (size == 0 || size > (size_t)size_max) break; /* the caller says why, or refuses it */
        PyObject *raw = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
        if (raw == NULL) goto fail;
        Py_ssize_t got = recv(link, PyBytes_AS_STRING(raw), size);
        advance(link);
        if (got != (Py_ssize_t)size) { /* not expected of a complete delivery: the careful way */
            if (_PyBytes_Resize(&raw, got > 0 ? got : 0) < 0) goto fail;
            handed = raw;
            handed_delivery = delivery;
            break;
        }
        const unsigned char *r = (const unsigned char *)PyBytes_AS_STRING(raw);
        Py_ssize_t n = (Py_ssize_t)size;
        int fast = is_plain(r, n);
        if (fast && key_count) {
            Py_ssize_t end = key_search_end(r, n);
            for (Py_ssize_t k = 0; k < key_count && fast; k++) {
                PyObject *key = PyTuple_GET_ITEM(keys, k);
                if (memmem(r, (size_t)end, PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key)))
                    fast = 0;
            }
        }
        if (fast && named) {
            if (n >= prefix_len + 8 && memcmp(r, prefix, (size_t)prefix_len) == 0) {
                unsigned long long publishing_id = be64(r + prefix_len);
                if (!have_last || publishing_id > last_id) {
                    PyObject *id = PyLong_FromUnsignedLongLong(publishing_id);
                    if (id == NULL || PyList_Append(ids, id) < 0) {
                        Py_XDECREF(id);
                        Py_DECREF(raw);
                        goto fail;
                    }
                    Py_DECREF(id);
                    last_id = publishing_id;
                    have_last = 1;
                    if (id_section >= 0 && id_section <= prefix_len) {
                        /* raw[:id_section] + raw[len(prefix) + 8:] */
                        Py_ssize_t rest = prefix_len + 8;
                        PyObject *cut = PyBytes_FromStringAndSize(NULL, id_section + n - rest);
                        if (cut == NULL) {
                            Py_DECREF(raw);
                            goto fail;
                        }
                        char *to = PyBytes_AS_STRING(cut);
                        memcpy(to, r, (size_t)id_section);
                        memcpy(to + id_section, r + rest, (size_t)(n - rest));
                        Py_DECREF(raw);
                        raw = cut;
                    }
                } else {
                    fast = 0;
                }
            } else {
                fast = 0;
            }
        }
        if (!fast) {
            handed = raw;
            handed_delivery = delivery;
            break;
        }
        PyObject *entry;
        if (presettled || remote_settled(delivery)) {
            settle(delivery);
            entry = Py_NewRef(Py_None);
        } else {
            entry = PyLong_FromVoidPtr(delivery);
            if (entry == NULL) {
                Py_DECREF(raw);
                goto fail;
            }
            unconfirmed++;
        }
        int failed = PyList_Append(deliveries, entry) < 0 || PyList_Append(records, raw) < 0;
        Py_DECREF(entry);
        Py_DECREF(raw);
        if (failed) goto fail;
        taken++;
    }
    PyObject *last = have_last ? PyLong_FromUnsignedLongLong(last_id) : PyLong_FromLong(-1);
    if (last == NULL) {
        Py_XDECREF(handed);
        return NULL;
    }
    if (handed == NULL) return Py_BuildValue("nnNOK", taken, unconfirmed, last, Py_None, 0ULL);
    return Py_BuildValue("nnNNK", taken, unconfirmed, last, handed,
                         (unsigned long long)(uintptr_t)handed_delivery);
fail:
    return NULL;
}

PyDoc_STRVAR(skip_events_doc,
"skip_events(functions, collector, delivery_type) -> int\n\n"
"Pop the collector's leading PN_DELIVERY events that nobody acts on: a producer (receiver)\n"
"link's delivery that is no longer readable (drained already by the event of the first one).\n"
"Stops at any other event, left for the caller. `functions`: the addresses of\n"
"pn_collector_peek, pn_collector_pop, pn_event_type, pn_event_delivery, pn_delivery_link,\n"
"pn_link_is_receiver and pn_delivery_readable. Returns how many were popped.");

static PyObject *skip_events(PyObject *self, PyObject *args) {
    unsigned long long f[7], collector_address;
    int delivery_type;
    (void)self;
    if (!PyArg_ParseTuple(args, "(KKKKKKK)Ki", &f[0], &f[1], &f[2], &f[3], &f[4], &f[5], &f[6],
                          &collector_address, &delivery_type))
        return NULL;
    if (check_functions(f, 7, "skip_events") < 0) return NULL;
    if (!collector_address) {
        PyErr_SetString(PyExc_ValueError, "skip_events: a null collector");
        return NULL;
    }
    peek_fn peek = (peek_fn)(uintptr_t)f[0];
    pop_fn pop = (pop_fn)(uintptr_t)f[1];
    event_type_fn event_type = (event_type_fn)(uintptr_t)f[2];
    event_delivery_fn event_delivery = (event_delivery_fn)(uintptr_t)f[3];
    delivery_link_fn delivery_link = (delivery_link_fn)(uintptr_t)f[4];
    link_flag_fn is_receiver = (link_flag_fn)(uintptr_t)f[5];
    delivery_flag_fn readable = (delivery_flag_fn)(uintptr_t)f[6];
    void *collector = (void *)(uintptr_t)collector_address;
    Py_ssize_t popped = 0;
    for (;;) {
        void *event = peek(collector);
        if (event == NULL || event_type(event) != delivery_type) break;
        void *delivery = event_delivery(event);
        if (delivery == NULL || !is_receiver(delivery_link(delivery)) || readable(delivery)) break;
        pop(collector);
        popped++;
    }
    return PyLong_FromSsize_t(popped);
}

PyDoc_STRVAR(accept_run_doc,
"accept_run(functions, deliveries, state) -> list\n\n"
"Give every delivery in `deliveries` that is an address (an int; None entries are skipped)\n"
"the outcome `state` and settle it. `functions`: the addresses of pn_delivery_update and\n"
"pn_delivery_settle. Returns the entries that are neither (the caller's pointers), in order.");

static PyObject *accept_run(PyObject *self, PyObject *args) {
    unsigned long long f_update, f_settle, state;
    PyObject *deliveries;
    (void)self;
    if (!PyArg_ParseTuple(args, "(KK)O!K", &f_update, &f_settle, &PyList_Type, &deliveries,
                          &state))
        return NULL;
    if (!f_update || !f_settle) {
        PyErr_SetString(PyExc_ValueError, "accept_run: a null function address");
        return NULL;
    }
    update_fn update = (update_fn)(uintptr_t)f_update;
    settle_fn settle = (settle_fn)(uintptr_t)f_settle;
    PyObject *others = PyList_New(0);
    if (others == NULL) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(deliveries);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *entry = PyList_GET_ITEM(deliveries, i);
        if (entry == Py_None) continue;
        if (PyLong_CheckExact(entry)) {
            void *delivery = PyLong_AsVoidPtr(entry);
            if (delivery == NULL) {
                Py_DECREF(others);
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_ValueError, "accept_run: a null delivery address");
                return NULL;
            }
            update(delivery, state);
            settle(delivery);
        } else if (PyList_Append(others, entry) < 0) {
            Py_DECREF(others);
            return NULL;
        }
    }
    return others;
}

/* -- the inbound guard's hot path (ADR 0038): format-0 transfers on producer links ------------ */

#define GUARD_HEAD_BYTES 1024 /* spate.gateway.inbound.HEAD_BYTES */

/* inbound.head_bytes: the bytes of a frame the guard reads (header, extended header, then
   GUARD_HEAD_BYTES of the body; the whole frame when shorter; at least the 8-byte header). */
static Py_ssize_t head_bytes(Py_ssize_t size, Py_ssize_t doff) {
    Py_ssize_t window = 4 * doff + GUARD_HEAD_BYTES;
    if (size < window) window = size;
    return window < 8 ? 8 : window;
}

/* inbound.InboundGuard._plain_transfer, with every read bounded by `end`, the end of the
   frame's head (a read at or past it answers "not plain": the Python step decides, from the
   same head) and the link looked up in `senders` (senders[channel * 256 + handle] is 1 for a
   link the client sends on). */
static int plain_transfer(const unsigned char *d, Py_ssize_t end, Py_ssize_t body,
                          unsigned channel, const unsigned char *senders,
                          Py_ssize_t senders_len) {
    if (end - body < 12) return 0;
    if (d[body] != 0 || d[body + 1] != 0x53 || d[body + 2] != 0x14) return 0;
    int kind = d[body + 3];
    Py_ssize_t count, at;
    if (kind == 0xC0) {
        count = d[body + 5];
        at = body + 6;
    } else if (kind == 0xD0) {
        count = (Py_ssize_t)be32(d + body + 8);
        at = body + 12;
    } else {
        return 0;
    }
    if (count < 4 || at + 2 > end) return 0;
    unsigned handle;
    if (d[at] == 0x43) {
        handle = 0;
        at += 1;
    } else if (d[at] == 0x52) {
        handle = d[at + 1];
        at += 2;
    } else {
        return 0;
    }
    Py_ssize_t index = (Py_ssize_t)channel * 256 + handle;
    if (index >= senders_len || !senders[index]) return 0;
    if (at >= end) return 0;
    if (d[at] == 0x52)
        at += 2;
    else if (d[at] == 0x43)
        at += 1;
    else if (d[at] == 0x70)
        at += 5;
    else
        return 0;
    if (at + 2 > end || d[at] != 0xA0) return 0;
    at += 2 + d[at + 1];
    return at < end && d[at] == 0x43;
}

PyDoc_STRVAR(scan_transfers_doc,
"scan_transfers(data, at, senders) -> (at, skip)\n\n"
"The inbound guard's hot path: from `at` (a frame boundary), pass over every frame that is a\n"
"format-0 transfer on a link the client sends on, in the encodings clients use\n"
"(InboundGuard._plain_transfer, reading each frame's head only: inbound.head_bytes). Stops at\n"
"the first other frame, or one whose head is not all in `data`, and returns its position;\n"
"`skip` is what the last frame passed over still has beyond `data` (then `at` is len(data)).");

static PyObject *scan_transfers(PyObject *self, PyObject *args) {
    Py_buffer data, senders;
    Py_ssize_t at;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*ny*", &data, &at, &senders)) return NULL;
    const unsigned char *d = (const unsigned char *)data.buf;
    Py_ssize_t n = data.len;
    Py_ssize_t skip = 0;
    if (at < 0) at = n;
    while (at < n) {
        if (n - at < 8) break;
        Py_ssize_t size = (Py_ssize_t)be32(d + at);
        Py_ssize_t doff = d[at + 4];
        Py_ssize_t window = head_bytes(size, doff);
        if (n - at < window) break;
        if (d[at + 5] != 0 || size < 8 || doff < 2 || doff * 4 > size) break;
        unsigned channel = ((unsigned)d[at + 6] << 8) | d[at + 7];
        if (!plain_transfer(d, at + window, at + 4 * doff, channel,
                            (const unsigned char *)senders.buf, senders.len))
            break;
        if (size <= n - at) {
            at += size;
        } else {
            skip = size - (n - at);
            at = n;
        }
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&senders);
    return Py_BuildValue("nn", at, skip);
}

/* The two readers recv_run decides with, callable alone so tests can hold them to the Python
   they mirror (tests/gateway/test_fastrecv.py). */
static PyObject *is_plain_py(PyObject *self, PyObject *raw) {
    (void)self;
    if (!PyBytes_Check(raw)) {
        PyErr_SetString(PyExc_TypeError, "is_plain: bytes expected");
        return NULL;
    }
    return PyBool_FromLong(
        is_plain((const unsigned char *)PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw)));
}

static PyObject *key_search_end_py(PyObject *self, PyObject *raw) {
    (void)self;
    if (!PyBytes_Check(raw)) {
        PyErr_SetString(PyExc_TypeError, "key_search_end: bytes expected");
        return NULL;
    }
    return PyLong_FromSsize_t(
        key_search_end((const unsigned char *)PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw)));
}

static PyMethodDef methods[] = {
    {"send_run", send_run, METH_VARARGS, send_run_doc},
    {"recv_run", recv_run, METH_VARARGS, recv_run_doc},
    {"is_plain", is_plain_py, METH_O, "sections.is_plain, as recv_run reads it."},
    {"key_search_end", key_search_end_py, METH_O,
     "filtering.key_search_end, as recv_run reads it."},
    {"skip_events", skip_events, METH_VARARGS, skip_events_doc},
    {"accept_run", accept_run, METH_VARARGS, accept_run_doc},
    {"scan_transfers", scan_transfers, METH_VARARGS, scan_transfers_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastsend",
    "Runs of deliveries handed to and taken from proton in one call (ADR 0030, 0038).", -1,
    methods,
};

PyMODINIT_FUNC PyInit__fastsend(void) { return PyModule_Create(&module); }
