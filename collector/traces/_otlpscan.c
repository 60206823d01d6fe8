/*
 * _otlpscan: the hot path of trace ingestion, in C.
 *
 * scan(body, wanted, record) walks a serialized OTLP ExportTraceServiceRequest (protobuf wire
 * format) and calls record(trace_id, span_id, name, start, end, attributes, resource, events,
 * status_error) for every span, returning the list of results. Only attributes whose key is in
 * `wanted` (a set of str, or None for all) are turned into Python objects: a span carries a dozen
 * attributes and llmslo reads a few, and building Python objects for the rest is what made the
 * pure-Python path (collector/traces/otlp.py: spans_of) slow.
 *
 * The body has already been parsed by protobuf's own decoder (upb), which decides what is valid
 * (wire format, UTF-8 of strings, nesting depth): this walker never decides that a body is good.
 * It reads the canonical encoding that every OTLP exporter writes. Where an encoding needs
 * protobuf's merge semantics that this walker does not implement (a KeyValue with two values, an
 * AnyValue whose array or kvlist arrives in two parts), it returns NotImplemented and the caller
 * uses the pure-Python path for that request. Every read is bounds-checked against the buffer it
 * came from; a malformed body raises ValueError and never reads outside the input.
 *
 * Field numbers (opentelemetry-proto, trace/v1 and common/v1):
 *   ExportTraceServiceRequest: 1 resource_spans
 *   ResourceSpans: 1 resource, 2 scope_spans        Resource: 1 attributes
 *   ScopeSpans: 2 spans
 *   Span: 1 trace_id, 2 span_id, 5 name, 7 start_time_unix_nano (fixed64), 8 end_time_unix_nano
 *         (fixed64), 9 attributes, 11 events, 15 status
 *   Event: 1 time_unix_nano (fixed64), 2 name       Status: 3 code
 *   KeyValue: 1 key, 2 value
 *   AnyValue (oneof): 1 string, 2 bool, 3 int64, 4 double, 5 array, 6 kvlist, 7 bytes
 *   ArrayValue: 1 values      KeyValueList: 1 values
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { VARINT = 0, FIXED64 = 1, LEN = 2, FIXED32 = 5 };
#define MAX_DEPTH 100 /* protobuf's own default recursion limit */

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
} Buf;

/* The wanted keys as a small open-addressing hash table of their UTF-8 bytes: an attribute key
 * is looked up straight from the wire, so an unwanted key never becomes a Python object and a
 * wanted one reuses the set's own str. */
#define SLOTS 256
typedef struct {
    const char *s; /* NULL: empty slot */
    Py_ssize_t n;
    uint64_t hash;
    PyObject *key; /* borrowed from the wanted set, which outlives the scan */
} Slot;

typedef struct {
    int fallback;  /* set when the input needs the pure-Python path: scan() returns NotImplemented */
    int use_table; /* 0: look keys up in the set itself (too many wanted keys for the table) */
    Slot table[SLOTS];
} Ctx;

static uint64_t fnv1a(const uint8_t *p, Py_ssize_t n) {
    uint64_t h = 14695981039346656037ULL;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static int build_table(Ctx *ctx, PyObject *wanted) {
    if (PySet_GET_SIZE(wanted) > SLOTS / 2) return 0; /* keep probes short: fall back to the set */
    PyObject *it = PyObject_GetIter(wanted), *key;
    if (it == NULL) return -1;
    while ((key = PyIter_Next(it)) != NULL) {
        Py_ssize_t n;
        const char *s = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, &n) : NULL;
        Py_DECREF(key); /* the set keeps it alive */
        if (s == NULL) {
            Py_DECREF(it);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "wanted must hold str keys");
            return -1;
        }
        uint64_t h = fnv1a((const uint8_t *)s, n);
        size_t i = h & (SLOTS - 1);
        while (ctx->table[i].s != NULL) i = (i + 1) & (SLOTS - 1);
        ctx->table[i] = (Slot){s, n, h, key};
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) return -1;
    ctx->use_table = 1;
    return 0;
}

static PyObject *table_lookup(const Ctx *ctx, const uint8_t *s, Py_ssize_t n) {
    uint64_t h = fnv1a(s, n);
    for (size_t i = h & (SLOTS - 1); ctx->table[i].s != NULL; i = (i + 1) & (SLOTS - 1)) {
        const Slot *slot = &ctx->table[i];
        if (slot->hash == h && slot->n == n && memcmp(slot->s, s, (size_t)n) == 0) return slot->key;
    }
    return NULL;
}

static int malformed(const char *what) {
    PyErr_Format(PyExc_ValueError, "malformed OTLP protobuf: %s", what);
    return -1;
}

static int read_varint(Buf *b, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (b->p >= b->end) return malformed("truncated varint");
        uint8_t c = *b->p++;
        v |= (uint64_t)(c & 0x7F) << shift;
        if (c < 0x80) {
            *out = v;
            return 0;
        }
    }
    return malformed("varint longer than 10 bytes");
}

static int read_fixed64(Buf *b, uint64_t *out) {
    if (b->end - b->p < 8) return malformed("truncated fixed64");
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b->p[i]; /* little-endian on the wire */
    b->p += 8;
    *out = v;
    return 0;
}

static int read_len(Buf *b, Buf *sub) {
    uint64_t n;
    if (read_varint(b, &n)) return -1;
    if (n > (uint64_t)(b->end - b->p)) return malformed("length beyond the end of its message");
    sub->p = b->p;
    sub->end = b->p + n;
    b->p += n;
    return 0;
}

static int read_tag(Buf *b, uint32_t *field, uint32_t *wire) {
    uint64_t tag;
    if (read_varint(b, &tag)) return -1;
    *field = (uint32_t)(tag >> 3);
    *wire = (uint32_t)(tag & 7);
    if (*field == 0 || tag >> 32) return malformed("invalid field number");
    return 0;
}

static int skip(Buf *b, uint32_t wire) {
    uint64_t ignored;
    Buf sub;
    switch (wire) {
    case VARINT: return read_varint(b, &ignored);
    case FIXED64: return read_fixed64(b, &ignored);
    case LEN: return read_len(b, &sub);
    case FIXED32:
        if (b->end - b->p < 4) return malformed("truncated fixed32");
        b->p += 4;
        return 0;
    default: return malformed("unsupported wire type (groups are not used by OTLP)");
    }
}

static PyObject *utf8(Buf s) { return PyUnicode_DecodeUTF8((const char *)s.p, s.end - s.p, "strict"); }

static PyObject *bytes_of(Buf s) { return PyBytes_FromStringAndSize((const char *)s.p, s.end - s.p); }

static PyObject *any_value(Ctx *ctx, Buf b, int depth);

/* KeyValue -> (key, value) into dict; with `wanted`, other keys are skipped unconverted. */
static int key_value(Ctx *ctx, Buf b, PyObject *wanted, PyObject *dict, int depth) {
    static const uint8_t empty[1] = {0};
    Buf key = {empty, empty}, value = {NULL, NULL}; /* no key field: the empty string */
    int values = 0;
    while (b.p < b.end) {
        uint32_t field, wire;
        if (read_tag(&b, &field, &wire)) return -1;
        if (field == 1 && wire == LEN) {
            if (read_len(&b, &key)) return -1;
        } else if (field == 2 && wire == LEN) {
            if (read_len(&b, &value)) return -1;
            values++;
        } else if (skip(&b, wire)) {
            return -1;
        }
    }
    if (values > 1) { /* two values merge into one message: not done here */
        ctx->fallback = 1;
        return 0;
    }
    PyObject *k;
    if (wanted != Py_None && ctx->use_table) {
        k = table_lookup(ctx, key.p, key.end - key.p);
        if (k == NULL) return 0; /* not wanted */
        Py_INCREF(k);
    } else if ((k = utf8(key)) == NULL) {
        return -1;
    } else if (wanted != Py_None) {
        int in = PySet_Contains(wanted, k);
        if (in <= 0) {
            Py_DECREF(k);
            return in; /* 0: not wanted, -1: error */
        }
    }
    PyObject *v;
    if (value.p) {
        v = any_value(ctx, value, depth + 1);
    } else {
        v = Py_NewRef(Py_None);
    }
    if (v == NULL) {
        Py_DECREF(k);
        return -1;
    }
    int rc = PyDict_SetItem(dict, k, v);
    Py_DECREF(k);
    Py_DECREF(v);
    return rc;
}

/* ArrayValue (list of AnyValue) or KeyValueList (dict): both keep their elements in field 1. */
static PyObject *container(Ctx *ctx, Buf b, int is_kvlist, int depth) {
    PyObject *out = is_kvlist ? PyDict_New() : PyList_New(0);
    if (out == NULL) return NULL;
    while (b.p < b.end) {
        uint32_t field, wire;
        Buf sub;
        if (read_tag(&b, &field, &wire)) goto fail;
        if (field == 1 && wire == LEN) {
            if (read_len(&b, &sub)) goto fail;
            if (is_kvlist) {
                if (key_value(ctx, sub, Py_None, out, depth + 1)) goto fail;
            } else {
                PyObject *item = any_value(ctx, sub, depth + 1);
                if (item == NULL) goto fail;
                int rc = PyList_Append(out, item);
                Py_DECREF(item);
                if (rc) goto fail;
            }
        } else if (skip(&b, wire)) {
            goto fail;
        }
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* AnyValue -> str | bool | int | float | list | dict | None (bytes values are None, as in otlp._value). */
static PyObject *any_value(Ctx *ctx, Buf b, int depth) {
    if (depth > MAX_DEPTH) {
        malformed("attribute values nested too deeply");
        return NULL;
    }
    PyObject *result = NULL;
    uint32_t kind = 0; /* the oneof member last seen: the last one wins */
    while (b.p < b.end) {
        uint32_t field, wire;
        uint64_t n;
        Buf sub;
        PyObject *v = NULL;
        if (read_tag(&b, &field, &wire)) goto fail;
        if (field == 1 && wire == LEN) {
            if (read_len(&b, &sub) || (v = utf8(sub)) == NULL) goto fail;
        } else if (field == 2 && wire == VARINT) {
            if (read_varint(&b, &n)) goto fail;
            v = PyBool_FromLong(n != 0);
        } else if (field == 3 && wire == VARINT) {
            if (read_varint(&b, &n)) goto fail;
            v = PyLong_FromLongLong((long long)n);
        } else if (field == 4 && wire == FIXED64) {
            double d;
            if (read_fixed64(&b, &n)) goto fail;
            memcpy(&d, &n, sizeof d);
            v = PyFloat_FromDouble(d);
        } else if ((field == 5 || field == 6) && wire == LEN) {
            if (kind == field) { /* the same container again: protobuf would merge the two parts */
                ctx->fallback = 1;
                Py_XDECREF(result);
                return Py_NewRef(Py_None);
            }
            if (read_len(&b, &sub) || (v = container(ctx, sub, field == 6, depth)) == NULL) goto fail;
        } else if (field == 7 && wire == LEN) {
            if (read_len(&b, &sub)) goto fail;
            v = Py_NewRef(Py_None);
        } else if (field == 8 && wire == VARINT) {
            /* string_value_strindex: an index into a dictionary only profiles carry; in a span
               it names nothing (None, as bytes), and as a oneof member it replaces what came before */
            if (read_varint(&b, &n)) goto fail;
            v = Py_NewRef(Py_None);
        } else {
            if (skip(&b, wire)) goto fail;
            continue;
        }
        if (v == NULL) goto fail;
        Py_XSETREF(result, v);
        kind = field;
    }
    return result ? result : Py_NewRef(Py_None);
fail:
    Py_XDECREF(result);
    return NULL;
}

/* The repeated KeyValue field `attr_field` of message b, into dict. */
static int attributes(Ctx *ctx, Buf b, uint32_t attr_field, PyObject *wanted, PyObject *dict) {
    while (b.p < b.end) {
        uint32_t field, wire;
        Buf sub;
        if (read_tag(&b, &field, &wire)) return -1;
        if (field == attr_field && wire == LEN) {
            if (read_len(&b, &sub) || key_value(ctx, sub, wanted, dict, 0)) return -1;
        } else if (skip(&b, wire)) {
            return -1;
        }
    }
    return 0;
}

static PyObject *span(Ctx *ctx, Buf b, PyObject *wanted, PyObject *resource, PyObject *record) {
    Buf trace_id = {b.p, b.p}, span_id = {b.p, b.p}, name = {b.p, b.p};
    uint64_t start = 0, end = 0, code = 0;
    PyObject *attrs = PyDict_New(), *events = NULL, *args[9] = {NULL};
    PyObject *out = NULL;
    if (attrs == NULL) return NULL;
    while (b.p < b.end) {
        uint32_t field, wire;
        Buf sub;
        if (read_tag(&b, &field, &wire)) goto done;
        if (wire == LEN && (field == 1 || field == 2 || field == 5)) {
            if (read_len(&b, field == 1 ? &trace_id : field == 2 ? &span_id : &name)) goto done;
        } else if (wire == FIXED64 && (field == 7 || field == 8)) {
            if (read_fixed64(&b, field == 7 ? &start : &end)) goto done;
        } else if (field == 9 && wire == LEN) {
            if (read_len(&b, &sub) || key_value(ctx, sub, wanted, attrs, 0)) goto done;
        } else if (field == 11 && wire == LEN) {
            Buf ev_name = {NULL, NULL};
            uint64_t ev_time = 0;
            if (read_len(&b, &sub)) goto done;
            while (sub.p < sub.end) {
                uint32_t f, w;
                if (read_tag(&sub, &f, &w)) goto done;
                if (f == 1 && w == FIXED64) {
                    if (read_fixed64(&sub, &ev_time)) goto done;
                } else if (f == 2 && w == LEN) {
                    if (read_len(&sub, &ev_name)) goto done;
                } else if (skip(&sub, w)) {
                    goto done;
                }
            }
            if (events == NULL && (events = PyList_New(0)) == NULL) goto done;
            PyObject *ev = ev_name.p ? utf8(ev_name) : PyUnicode_FromStringAndSize("", 0);
            if (ev == NULL) goto done;
            PyObject *pair = Py_BuildValue("(NK)", ev, (unsigned long long)ev_time);
            if (pair == NULL || PyList_Append(events, pair)) {
                Py_XDECREF(pair);
                goto done;
            }
            Py_DECREF(pair);
        } else if (field == 15 && wire == LEN) {
            if (read_len(&b, &sub)) goto done;
            while (sub.p < sub.end) { /* Status fields are scalars: a second Status merges field by field */
                uint32_t f, w;
                if (read_tag(&sub, &f, &w)) goto done;
                if (f == 3 && w == VARINT) {
                    if (read_varint(&sub, &code)) goto done;
                } else if (skip(&sub, w)) {
                    goto done;
                }
            }
        } else if (skip(&b, wire)) {
            goto done;
        }
    }
    if (ctx->fallback) goto done;
    args[0] = bytes_of(trace_id);
    args[1] = bytes_of(span_id);
    args[2] = utf8(name);
    args[3] = PyLong_FromUnsignedLongLong(start);
    args[4] = PyLong_FromUnsignedLongLong(end);
    args[5] = Py_NewRef(attrs);
    args[6] = Py_NewRef(resource);
    args[7] = events ? PyList_AsTuple(events) : PyTuple_New(0);
    args[8] = PyBool_FromLong(code == 2); /* STATUS_CODE_ERROR */
    for (int i = 0; i < 9; i++)
        if (args[i] == NULL) goto done;
    out = PyObject_Vectorcall(record, args, 9, NULL);
done:
    for (int i = 0; i < 9; i++) Py_XDECREF(args[i]);
    Py_DECREF(attrs);
    Py_XDECREF(events);
    return out;
}

static int resource_spans(Ctx *ctx, Buf b, PyObject *wanted, PyObject *record, PyObject *out) {
    /* the resource may follow its spans on the wire: read it first, in a pass of its own */
    PyObject *resource = PyDict_New();
    if (resource == NULL) return -1;
    Buf pass = b;
    while (pass.p < pass.end) {
        uint32_t field, wire;
        Buf sub;
        if (read_tag(&pass, &field, &wire)) goto fail;
        if (field == 1 && wire == LEN) {
            if (read_len(&pass, &sub) || attributes(ctx, sub, 1, wanted, resource)) goto fail;
        } else if (skip(&pass, wire)) {
            goto fail;
        }
    }
    while (b.p < b.end) {
        uint32_t field, wire;
        Buf scope;
        if (read_tag(&b, &field, &wire)) goto fail;
        if (!(field == 2 && wire == LEN)) {
            if (skip(&b, wire)) goto fail;
            continue;
        }
        if (read_len(&b, &scope)) goto fail;
        while (scope.p < scope.end) {
            uint32_t f, w;
            Buf sp;
            if (read_tag(&scope, &f, &w)) goto fail;
            if (!(f == 2 && w == LEN)) {
                if (skip(&scope, w)) goto fail;
                continue;
            }
            if (read_len(&scope, &sp)) goto fail;
            PyObject *rec = span(ctx, sp, wanted, resource, record);
            if (ctx->fallback) {
                Py_XDECREF(rec);
                Py_DECREF(resource);
                return 0;
            }
            if (rec == NULL) goto fail;
            int rc = PyList_Append(out, rec);
            Py_DECREF(rec);
            if (rc) goto fail;
        }
    }
    Py_DECREF(resource);
    return 0;
fail:
    Py_DECREF(resource);
    return -1;
}

static PyObject *scan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "scan(body, wanted, record) takes 3 arguments");
        return NULL;
    }
    PyObject *wanted = args[1], *record = args[2];
    if (wanted != Py_None && !PyAnySet_Check(wanted)) {
        PyErr_SetString(PyExc_TypeError, "wanted must be a set, a frozenset or None");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE)) return NULL;
    Buf b = {(const uint8_t *)view.buf, (const uint8_t *)view.buf + view.len};
    Ctx ctx = {0};
    PyObject *out = NULL;
    if (wanted != Py_None && build_table(&ctx, wanted)) goto fail;
    out = PyList_New(0);
    if (out == NULL) goto fail;
    while (b.p < b.end) {
        uint32_t field, wire;
        Buf sub;
        if (read_tag(&b, &field, &wire)) goto fail;
        if (field == 1 && wire == LEN) {
            if (read_len(&b, &sub) || resource_spans(&ctx, sub, wanted, record, out)) goto fail;
            if (ctx.fallback) {
                Py_DECREF(out);
                PyBuffer_Release(&view);
                return Py_NewRef(Py_NotImplemented);
            }
        } else if (skip(&b, wire)) {
            goto fail;
        }
    }
    PyBuffer_Release(&view);
    return out;
fail:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_FASTCALL,
     "scan(body, wanted, record) -> list | NotImplemented: one record(...) per span of an OTLP "
     "ExportTraceServiceRequest, with the attributes named in wanted."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_otlpscan", .m_doc = NULL, .m_size = -1, .m_methods = methods,
};

PyMODINIT_FUNC PyInit__otlpscan(void) { return PyModule_Create(&module); }
