/* spate.gateway._fastsend: a run of consumer deliveries handed to proton in one call (ADR 0030).

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

static PyMethodDef methods[] = {
    {"send_run", send_run, METH_VARARGS, send_run_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastsend",
    "A run of consumer deliveries handed to proton in one call (ADR 0030).", -1, methods,
};

PyMODINIT_FUNC PyInit__fastsend(void) { return PyModule_Create(&module); }
