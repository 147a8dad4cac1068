/* Decodes Kafka record batches (magic 2, KIP-98) straight into Arrow buffers.
 *
 * librdkafka hands Python one Message object per record, and building Arrow columns from them
 * costs about a microsecond of CPU per record: more than Spark spends taking the rows. This
 * walks the record batches of a Fetch response once, in C, and fills the buffers of the key,
 * value, offset, timestamp and timestamp-type columns (and, when asked, the headers').
 *
 * decode(buf, pos, start, end, max_records, mode, with_headers) -> tuple, see decode_doc.
 *
 * It decodes uncompressed batches and skips control batches. It stops before a batch it does
 * not decode itself (compressed, an old message format, or in strict mode a transactional or control
 * batch, when aborted transactions must be filtered), so that the Python side can decompress
 * it or decide whether it was aborted, then call again.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEADER_SIZE 61
#define MAGIC_AT 16

enum { STOP_EXHAUSTED = 0, STOP_END = 1, STOP_BATCH = 2, STOP_FULL = 3 };
/* strict: stop before transactional and control batches; plain: decode transactional batches
 * as data and skip control batches; one: the batch at pos only, as plain (the caller vetted
 * it) */
enum { MODE_STRICT = 0, MODE_PLAIN = 1, MODE_ONE = 2 };

typedef struct {
    char *data;
    Py_ssize_t len, cap;
} growable;

static int grow(growable *g, Py_ssize_t more) {
    if (g->len + more <= g->cap)
        return 0;
    Py_ssize_t cap = g->cap ? g->cap : 4096;
    while (cap < g->len + more)
        cap *= 2;
    char *data = PyMem_Realloc(g->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    g->data = data;
    g->cap = cap;
    return 0;
}

static int put(growable *g, const void *src, Py_ssize_t n) {
    if (grow(g, n) < 0)
        return -1;
    memcpy(g->data + g->len, src, (size_t)n);
    g->len += n;
    return 0;
}

static PyObject *to_bytes(growable *g) {
    return PyBytes_FromStringAndSize(g->data ? g->data : "", g->len);
}

static int64_t be64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | p[i];
    return (int64_t)v;
}

static int32_t be32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     (uint32_t)p[3]);
}

static int16_t be16(const unsigned char *p) { return (int16_t)(((uint16_t)p[0] << 8) | p[1]); }

/* A zig-zag varint (Kafka's varint and varlong); -1 on a malformed or truncated one. */
static int varint(const unsigned char **p, const unsigned char *limit, int64_t *out) {
    uint64_t v = 0;
    int shift = 0;
    while (*p < limit && shift < 70) {
        unsigned char b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
            return 0;
        }
        shift += 7;
    }
    return -1;
}

typedef struct {
    growable key_offsets, key_data, key_valid, value_offsets, value_data, value_valid;
    growable offsets, timestamps, ts_types;
    Py_ssize_t count, key_nulls, value_nulls;
    /* with headers: per record the offset of its first header (a list column), and per
     * header its key (string) and value (binary, nullable) */
    int with_headers;
    growable header_lists, header_key_offsets, header_key_data, header_value_offsets,
        header_value_data, header_value_valid;
    Py_ssize_t header_count, header_value_nulls;
} columns;

static int set_valid(growable *bits, Py_ssize_t i, int valid) {
    if (i % 8 == 0) {
        unsigned char zero = 0;
        if (put(bits, &zero, 1) < 0)
            return -1;
    }
    if (valid)
        bits->data[i / 8] |= (char)(1 << (i % 8));
    return 0;
}

/* Appends element i of a binary column (n < 0: null). A column without a validity bitmap
 * (valid and nulls NULL) never holds a null: its callers reject negative lengths first. */
static int binary(growable *offs, growable *data, growable *valid, Py_ssize_t *nulls,
                  Py_ssize_t i, const unsigned char *src, int64_t n) {
    if (valid != NULL && set_valid(valid, i, n >= 0) < 0)
        return -1;
    if (n < 0 && nulls != NULL)
        (*nulls)++;
    else if (put(data, src, (Py_ssize_t)n) < 0)
        return -1;
    if (data->len > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "more than 2 GiB of keys or values in one chunk");
        return -1;
    }
    int32_t end = (int32_t)data->len;
    return put(offs, &end, 4);
}

static void release(columns *c) {
    growable *all[] = {&c->key_offsets, &c->key_data, &c->key_valid, &c->value_offsets,
                       &c->value_data, &c->value_valid, &c->offsets, &c->timestamps,
                       &c->ts_types, &c->header_lists, &c->header_key_offsets,
                       &c->header_key_data, &c->header_value_offsets, &c->header_value_data,
                       &c->header_value_valid};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        PyMem_Free(all[i]->data);
}

static PyObject *malformed(int64_t base, const char *what) {
    PyErr_Format(PyExc_ValueError, "malformed Kafka record batch at base offset %lld: %s",
                 (long long)base, what);
    return NULL;
}

/* One record's headers, appended to the header columns; 0, or -1 with an exception set. */
static int record_headers(columns *c, const unsigned char *p, const unsigned char *limit,
                          int64_t count, int64_t base) {
    for (int64_t h = 0; h < count; h++) {
        int64_t key_len, value_len;
        if (varint(&p, limit, &key_len) < 0 || key_len < 0 || key_len > limit - p)
            goto bad;
        const unsigned char *key = p;
        p += key_len;
        if (varint(&p, limit, &value_len) < 0 || value_len > limit - p)
            goto bad;
        const unsigned char *value = p;
        p += value_len > 0 ? value_len : 0;
        Py_ssize_t i = c->header_count;
        if (binary(&c->header_key_offsets, &c->header_key_data, NULL, NULL, i, key, key_len) <
                0 ||
            binary(&c->header_value_offsets, &c->header_value_data, &c->header_value_valid,
                   &c->header_value_nulls, i, value, value_len) < 0)
            return -1;
        c->header_count++;
    }
    return 0;
bad:
    malformed(base, "a record header overruns its record");
    return -1;
}

/* The records of one uncompressed batch; 0, or -1 with an exception set. */
static int records(columns *c, const unsigned char *p, const unsigned char *limit, int32_t count,
                   int64_t base, int64_t base_ts, int64_t max_ts, int log_append, int64_t start,
                   int64_t end) {
    int32_t ts_type = log_append ? 1 : 0;
    for (int32_t r = 0; r < count; r++) {
        int64_t length, ts_delta, offset_delta, key_len, value_len, headers;
        if (varint(&p, limit, &length) < 0 || length < 0 || length > limit - p)
            goto bad;
        const unsigned char *next = p + length;
        if (next - p < 1)
            goto bad;
        p++; /* attributes: unused */
        const unsigned char *key, *value;
        if (varint(&p, next, &ts_delta) < 0 || varint(&p, next, &offset_delta) < 0 ||
            varint(&p, next, &key_len) < 0 || (key_len > next - p))
            goto bad;
        key = p;
        p += key_len > 0 ? key_len : 0;
        if (varint(&p, next, &value_len) < 0 || value_len > next - p)
            goto bad;
        value = p;
        p += value_len > 0 ? value_len : 0;
        if (varint(&p, next, &headers) < 0 || headers < 0)
            goto bad;
        int64_t offset = base + offset_delta;
        if (offset < start) {
            p = next;
            continue;
        }
        if (offset >= end)
            return 0;
        if (c->with_headers && record_headers(c, p, next, headers, base) < 0)
            return -1;
        p = next;
        int64_t ts = log_append ? max_ts : base_ts + ts_delta;
        Py_ssize_t i = c->count;
        if (binary(&c->key_offsets, &c->key_data, &c->key_valid, &c->key_nulls, i, key,
                   key_len) < 0 ||
            binary(&c->value_offsets, &c->value_data, &c->value_valid, &c->value_nulls, i, value,
                   value_len) < 0 ||
            put(&c->offsets, &offset, 8) < 0 || put(&c->timestamps, &ts, 8) < 0 ||
            put(&c->ts_types, &ts_type, 4) < 0)
            return -1;
        if (c->with_headers) {
            int32_t lists = (int32_t)c->header_count;
            if (put(&c->header_lists, &lists, 4) < 0)
                return -1;
        }
        c->count++;
    }
    return 0;
bad:
    malformed(base, "a record overruns its batch");
    return -1;
}

PyDoc_STRVAR(decode_doc,
"decode(buf, pos, start, end, max_records, mode, with_headers=False)\n"
"\n"
"Decode the record batches of ``buf`` (a Fetch response's records) from byte ``pos``: the\n"
"records with ``start <= offset < end``, stopping at a batch boundary once ``max_records``\n"
"are decoded. ``mode``: 0 stops before transactional and control batches, 1 decodes\n"
"transactional batches as data and skips control batches, 2 decodes the batch at ``pos``\n"
"alone (as 1) and stops.\n"
"Returns (stop, pos, next_offset, count, key_offsets, key_data, key_validity, key_nulls,\n"
"value_offsets, value_data, value_validity, value_nulls, offsets, timestamps, ts_types):\n"
"stop is 0 (no complete batch left), 1 (end reached), 2 (the batch at pos needs the\n"
"caller: compressed, another magic, or transactional) or 3 (max_records decoded);\n"
"next_offset is the offset after the last batch consumed (start if none). Binary columns\n"
"come as Arrow's int32 offsets, data and validity bitmap; offsets and timestamps (ms) as\n"
"int64, timestamp types as int32 (0 CreateTime, 1 LogAppendTime). Last, the headers:\n"
"(count, list offsets, key offsets, key data, value offsets, value data, value validity,\n"
"value nulls), a list<struct<key: string, value: binary>> column's buffers (empty buffers\n"
"without ``with_headers``).");

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, max_records;
    long long start, end;
    int mode, with_headers = 0;
    if (!PyArg_ParseTuple(args, "y*nLLni|p", &view, &pos, &start, &end, &max_records, &mode,
                          &with_headers))
        return NULL;
    if (mode < MODE_STRICT || mode > MODE_ONE) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "mode must be 0, 1 or 2");
        return NULL;
    }
    const unsigned char *buf = view.buf;
    Py_ssize_t size = view.len;
    columns c;
    memset(&c, 0, sizeof(c));
    c.with_headers = with_headers;
    int32_t zero = 0;
    int stop = STOP_EXHAUSTED;
    int64_t next_offset = start;
    PyObject *result = NULL;
    if (put(&c.key_offsets, &zero, 4) < 0 || put(&c.value_offsets, &zero, 4) < 0 ||
        (with_headers &&
         (put(&c.header_lists, &zero, 4) < 0 || put(&c.header_key_offsets, &zero, 4) < 0 ||
          put(&c.header_value_offsets, &zero, 4) < 0)))
        goto done;
    for (int batches = 0;; batches++) {
        if (mode == MODE_ONE && batches == 1) {
            stop = STOP_BATCH;
            break;
        }
        if (next_offset >= end) {
            stop = STOP_END;
            break;
        }
        if (c.count >= max_records) {
            stop = STOP_FULL;
            break;
        }
        /* offset, length, then (v2) partition leader epoch or (v0/v1) crc: the magic byte
         * sits at 16 in every message format, and nothing after it may be read before it
         * says the format is v2 (a v0/v1 message is shorter than a v2 header, and its
         * timestamp and key length fill the bytes of lastOffsetDelta) */
        if (size - pos < MAGIC_AT + 1) {
            stop = STOP_EXHAUSTED;
            break;
        }
        const unsigned char *h = buf + pos;
        if ((int8_t)h[MAGIC_AT] != 2) {
            stop = STOP_BATCH; /* an old message format: the caller hands it over */
            break;
        }
        if (size - pos < HEADER_SIZE) {
            stop = STOP_EXHAUSTED;
            break;
        }
        int64_t base = be64(h);
        int32_t length = be32(h + 8);
        if (length < HEADER_SIZE - 12)
            goto bad_header;
        if ((Py_ssize_t)length + 12 > size - pos) {
            stop = STOP_EXHAUSTED; /* the broker cut the last batch at the fetch size */
            break;
        }
        int16_t attributes = be16(h + 21);
        int32_t last_delta = be32(h + 23);
        int64_t after = base + (int64_t)last_delta + 1;
        int control = attributes & 0x20, transactional = attributes & 0x10;
        if ((attributes & 0x07) != 0 ||
            (mode == MODE_STRICT && (control || transactional))) {
            if (after <= start) { /* wholly before the range: skip, whatever it is */
                pos += (Py_ssize_t)length + 12;
                continue;
            }
            stop = STOP_BATCH;
            break;
        }
        if (!control && after > start) {
            int32_t count = be32(h + 57);
            if (records(&c, h + HEADER_SIZE, h + 12 + length, count, base, be64(h + 27),
                        be64(h + 35), attributes & 0x08, start, end) < 0)
                goto done;
        }
        pos += (Py_ssize_t)length + 12;
        if (after > next_offset)
            next_offset = after;
    }
    {
        PyObject *parts[15] = {
            to_bytes(&c.key_offsets), to_bytes(&c.key_data),
            c.key_nulls ? to_bytes(&c.key_valid) : Py_NewRef(Py_None),
            to_bytes(&c.value_offsets), to_bytes(&c.value_data),
            c.value_nulls ? to_bytes(&c.value_valid) : Py_NewRef(Py_None),
            to_bytes(&c.offsets), to_bytes(&c.timestamps), to_bytes(&c.ts_types),
            /* the header columns, empty without with_headers */
            to_bytes(&c.header_lists), to_bytes(&c.header_key_offsets),
            to_bytes(&c.header_key_data), to_bytes(&c.header_value_offsets),
            to_bytes(&c.header_value_data),
            c.header_value_nulls ? to_bytes(&c.header_value_valid) : Py_NewRef(Py_None)};
        int ok = 1;
        for (int i = 0; i < 15; i++)
            ok &= parts[i] != NULL;
        if (ok)
            result = Py_BuildValue("(inLnNNNnNNNnNNN(nNNNNNNn))", stop, pos,
                                   (long long)next_offset, c.count, parts[0], parts[1], parts[2],
                                   c.key_nulls, parts[3], parts[4], parts[5], c.value_nulls,
                                   parts[6], parts[7], parts[8], c.header_count, parts[9],
                                   parts[10], parts[11], parts[12], parts[13], parts[14],
                                   c.header_value_nulls);
        else
            for (int i = 0; i < 15; i++)
                Py_XDECREF(parts[i]);
    }
    goto done;
bad_header:
    malformed(be64(buf + pos), "its length is shorter than a batch header");
done:
    release(&c);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, decode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_record_batch",
    "Kafka record batches (magic 2) decoded into Arrow buffers.", -1, methods,
};

PyMODINIT_FUNC PyInit__record_batch(void) { return PyModule_Create(&module); }
