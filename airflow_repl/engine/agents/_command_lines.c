/*
 * The Log Reader Agent's hot path, compiled: one pgoutput row message (Insert, Update or
 * Delete, protocol version 1) of a published relation -> the line of COPY text format that
 * stores its command in airflow_repl.commands.
 *
 * The output is byte for byte what the Python path writes for the same message
 * (pgoutput.decode, change_mapping.row_commands, Command.to_json, dist_encoding.command_data,
 * dist_transactions.command_line and copy_escaping.copy_field); tests/unit/test_command_lines.py compares the two on generated
 * messages.  Everything else returns None and takes the Python path, which stays the one
 * definition of the behaviour: an UPDATE that becomes a DELETE + INSERT pair, an unchanged
 * TOASTed value the after image cannot take from the before image, binary values, bytes that
 * are not UTF-8, a malformed or cut-short message (which the Python path refuses with its
 * message), a column the relation does not have.
 *
 * Built when a C compiler is at hand (setup.py: optional); without it the agents run the
 * Python path alone (airflow_repl.engine.agents.command_lines).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* A tuple column as the message holds it. */
typedef struct {
    const unsigned char *p; /* the text value (kind 't') */
    Py_ssize_t len;
    char kind; /* 't' text, 'n' NULL, 'u' unchanged TOASTed value */
} Col;

/* PostgreSQL's MaxTupleAttributeNumber: no tuple has more columns. */
#define MAX_COLUMNS 1664
#define STACK_COLUMNS 64

static int32_t int32_at(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3]);
}

/* Strict UTF-8, as bytes.decode() accepts it (no surrogates, no overlong forms, nothing past
 * U+10FFFF). */
static int valid_utf8(const unsigned char *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            unsigned char lo = (c == 0xE0) ? 0xA0 : 0x80, hi = (c == 0xED) ? 0x9F : 0xBF;
            if (i + 2 >= n || s[i + 1] < lo || s[i + 1] > hi || (s[i + 2] & 0xC0) != 0x80) return 0;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            unsigned char lo = (c == 0xF0) ? 0x90 : 0x80, hi = (c == 0xF4) ? 0x8F : 0xBF;
            if (i + 3 >= n || s[i + 1] < lo || s[i + 1] > hi || (s[i + 2] & 0xC0) != 0x80 ||
                (s[i + 3] & 0xC0) != 0x80)
                return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* Read the tuple at *pos into cols (at most cap columns); 0 when it is one this module takes. */
static int read_tuple(const unsigned char *buf, Py_ssize_t end, Py_ssize_t *pos, Col *cols, int cap, int *ncols) {
    Py_ssize_t at = *pos;
    if (at + 2 > end) return -1;
    int n = (int16_t)(((unsigned)buf[at] << 8) | buf[at + 1]);
    at += 2;
    if (n < 0 || n > cap) return -1;
    for (int i = 0; i < n; i++) {
        if (at >= end) return -1;
        char kind = (char)buf[at];
        if (kind == 't') {
            if (at + 5 > end) return -1;
            int32_t size = int32_at(buf + at + 1);
            at += 5;
            if (size < 0 || size > end - at) return -1;
            if (!valid_utf8(buf + at, size)) return -1;
            cols[i].p = buf + at;
            cols[i].len = size;
            at += size;
        } else if (kind == 'n' || kind == 'u') {
            cols[i].p = NULL;
            cols[i].len = 0;
            at += 1;
        } else {
            return -1; /* 'b' (binary) or a protocol violation: the Python path's */
        }
        cols[i].kind = kind;
    }
    *pos = at;
    *ncols = n;
    return 0;
}

/* The bytes one value takes in the line: JSON's escapes (as orjson writes them), then COPY's
 * doubling of every backslash. */
static Py_ssize_t value_size(const Col *c) {
    if (c->kind == 'n') return 4;
    Py_ssize_t size = 2;
    for (Py_ssize_t i = 0; i < c->len; i++) {
        unsigned char ch = c->p[i];
        if (ch == '"') size += 3;                                   /* \\"  */
        else if (ch == '\\') size += 4;                             /* \\\\ */
        else if (ch == '\b' || ch == '\t' || ch == '\n' || ch == '\f' || ch == '\r') size += 3; /* \\n */
        else if (ch < 0x20) size += 7;                              /* \\u00XX */
        else size += 1;
    }
    return size;
}

static char *put_value(char *out, const Col *c) {
    static const char hex[] = "0123456789abcdef";
    if (c->kind == 'n') {
        memcpy(out, "null", 4);
        return out + 4;
    }
    *out++ = '"';
    for (Py_ssize_t i = 0; i < c->len; i++) {
        unsigned char ch = c->p[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\') {
            *out++ = (char)ch;
            continue;
        }
        *out++ = '\\';
        *out++ = '\\';
        switch (ch) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; *out++ = '\\'; break;
        case '\b': *out++ = 'b'; break;
        case '\t': *out++ = 't'; break;
        case '\n': *out++ = 'n'; break;
        case '\f': *out++ = 'f'; break;
        case '\r': *out++ = 'r'; break;
        default:
            memcpy(out, "u00", 3);
            out += 3;
            *out++ = hex[ch >> 4];
            *out++ = hex[ch & 15];
        }
    }
    *out++ = '"';
    return out;
}

static Py_ssize_t image_size(Col *const *image, Py_ssize_t n) {
    Py_ssize_t size = 2 + (n ? n - 1 : 0); /* [ ] and the commas */
    for (Py_ssize_t i = 0; i < n; i++) size += value_size(image[i]);
    return size;
}

static char *put_image(char *out, Col *const *image, Py_ssize_t n) {
    *out++ = '[';
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i) *out++ = ',';
        out = put_value(out, image[i]);
    }
    *out++ = ']';
    return out;
}

static int same(const Col *a, const Col *b) {
    if (a->kind != b->kind) return 0;
    return a->kind != 't' || (a->len == b->len && memcmp(a->p, b->p, (size_t)a->len) == 0);
}

/* The article's columns of a decoded tuple (positions: uint16 per article column). */
static uint16_t u16(const void *buf, Py_ssize_t i);

static int select_image(Col *cols, int ncols, const void *positions, Py_ssize_t n, Col **image) {
    for (Py_ssize_t i = 0; i < n; i++) {
        uint16_t at = u16(positions, i);
        if (at >= ncols) return -1;
        image[i] = &cols[at];
    }
    return 0;
}

static uint16_t u16(const void *buf, Py_ssize_t i) {
    uint16_t v;
    memcpy(&v, (const char *)buf + 2 * i, 2);
    return v;
}

static int any_unchanged(Col *const *image, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (image[i]->kind == 'u') return 1;
    return 0;
}

typedef struct {
    Py_buffer msg, positions, keys, prefix, article;
    int pairs;
    long long command_id;
} Args;

/* The line of one message, or Py_None.  old/new: the article's images (NULL when absent). */
static PyObject *build_line(const Args *a, char op, Col *const *old, Col *const *new, Py_ssize_t n) {
    char id[24];
    int id_len = snprintf(id, sizeof id, "%lld", a->command_id);
    Py_ssize_t size = a->prefix.len + id_len + 1 + a->article.len + 3 + 2 + 1;
    if (old) size += 4 + image_size(old, n) + (new ? 1 : 0);
    if (new) size += 4 + image_size(new, n);
    PyObject *line = PyBytes_FromStringAndSize(NULL, size);
    if (!line) return NULL;
    char *out = PyBytes_AS_STRING(line);
    memcpy(out, a->prefix.buf, (size_t)a->prefix.len);
    out += a->prefix.len;
    memcpy(out, id, (size_t)id_len);
    out += id_len;
    *out++ = '\t';
    memcpy(out, a->article.buf, (size_t)a->article.len);
    out += a->article.len;
    *out++ = '\t';
    *out++ = op;
    *out++ = '\t';
    *out++ = '{';
    if (old) {
        memcpy(out, "\"o\":", 4);
        out = put_image(out + 4, old, n);
        if (new) *out++ = ',';
    }
    if (new) {
        memcpy(out, "\"n\":", 4);
        out = put_image(out + 4, new, n);
    }
    *out++ = '}';
    *out++ = '\n';
    if (out - PyBytes_AS_STRING(line) != size) { /* the sizes above and the writers disagree */
        Py_DECREF(line);
        PyErr_SetString(PyExc_SystemError, "_command_lines: line size mismatch");
        return NULL;
    }
    return line;
}

/* The marker byte at pos, when it is one of allowed. */
static int marker(const unsigned char *buf, Py_ssize_t end, Py_ssize_t pos, const char *allowed) {
    return pos < end && buf[pos] != 0 && strchr(allowed, buf[pos]) != NULL;
}

static PyObject *line_of(const Args *a, Col *cols1, Col *cols2, Col **old, Col **new, int cap) {
    const unsigned char *buf = a->msg.buf;
    Py_ssize_t end = a->msg.len, pos = 6, n = a->positions.len / 2;
    const void *positions = a->positions.buf;
    int n1 = 0, n2 = 0;
    if (end < 6) Py_RETURN_NONE;
    char kind = (char)buf[0];
    if (kind == 'I') {
        if (!marker(buf, end, 5, "N") || read_tuple(buf, end, &pos, cols1, cap, &n1) ||
            select_image(cols1, n1, positions, n, new) || any_unchanged(new, n))
            Py_RETURN_NONE;
        return build_line(a, 'I', NULL, new, n);
    }
    if (kind == 'D') {
        if (!marker(buf, end, 5, "KO") || read_tuple(buf, end, &pos, cols1, cap, &n1) ||
            select_image(cols1, n1, positions, n, old) || any_unchanged(old, n))
            Py_RETURN_NONE;
        return build_line(a, 'D', old, NULL, n);
    }
    if (kind != 'U' || a->pairs || !marker(buf, end, 5, "KO") || read_tuple(buf, end, &pos, cols1, cap, &n1) ||
        !marker(buf, end, pos, "N"))
        Py_RETURN_NONE;
    pos += 1;
    if (read_tuple(buf, end, &pos, cols2, cap, &n2) || select_image(cols1, n1, positions, n, old) ||
        select_image(cols2, n2, positions, n, new) || any_unchanged(old, n))
        Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < n; i++)
        if (new[i]->kind == 'u') new[i] = old[i]; /* an unchanged TOASTed value: the before image's */
    for (Py_ssize_t i = 0; i < a->keys.len / 2; i++) {
        uint16_t k = u16(a->keys.buf, i);
        if (k >= n || !same(old[k], new[k])) Py_RETURN_NONE; /* a key changed: a pair */
    }
    return build_line(a, 'U', old, new, n);
}

PyDoc_STRVAR(row_line_doc,
             "row_line(message, positions, keys, pairs, prefix, command_id, article, /)\n--\n\n"
             "The COPY line of the command a pgoutput row message becomes, or None when the Python "
             "path must handle it.  positions and keys: uint16 per article column (its column in the "
             "relation) and per key column (its article position); pairs: every UPDATE is a pair; "
             "prefix: the line's publication and xact_seqno fields; article: the article's COPY field.");

static PyObject *row_line(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "row_line takes 7 arguments");
        return NULL;
    }
    Args a;
    memset(&a, 0, sizeof a);
    PyObject *result = NULL;
    a.pairs = PyObject_IsTrue(args[3]);
    a.command_id = PyLong_AsLongLong(args[5]);
    if (a.pairs < 0 || (a.command_id == -1 && PyErr_Occurred())) return NULL;
    if (PyObject_GetBuffer(args[0], &a.msg, PyBUF_SIMPLE) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &a.positions, PyBUF_SIMPLE) < 0) goto done;
    if (PyObject_GetBuffer(args[2], &a.keys, PyBUF_SIMPLE) < 0) goto done;
    if (PyObject_GetBuffer(args[4], &a.prefix, PyBUF_SIMPLE) < 0) goto done;
    if (PyObject_GetBuffer(args[6], &a.article, PyBUF_SIMPLE) < 0) goto done;
    Py_ssize_t n = a.positions.len / 2;
    if (n > MAX_COLUMNS) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* the relation's columns (the first tuple's count; an UPDATE's two tuples have the same) */
    const unsigned char *m = a.msg.buf;
    int relation_columns = a.msg.len >= 8 ? (int16_t)(((unsigned)m[6] << 8) | m[7]) : 0;
    if (n <= STACK_COLUMNS && relation_columns <= STACK_COLUMNS) {
        Col cols1[STACK_COLUMNS], cols2[STACK_COLUMNS];
        Col *old[STACK_COLUMNS], *new[STACK_COLUMNS];
        result = line_of(&a, cols1, cols2, old, new, STACK_COLUMNS);
    } else {
        Col *cols = PyMem_Malloc(sizeof(Col) * 2 * MAX_COLUMNS);
        Col **images = PyMem_Malloc(sizeof(Col *) * 2 * MAX_COLUMNS);
        if (!cols || !images) {
            PyMem_Free(cols);
            PyMem_Free(images);
            PyErr_NoMemory();
            goto done;
        }
        result = line_of(&a, cols, cols + MAX_COLUMNS, images, images + MAX_COLUMNS, MAX_COLUMNS);
        PyMem_Free(cols);
        PyMem_Free(images);
    }
done:
    PyBuffer_Release(&a.msg);
    if (a.positions.obj) PyBuffer_Release(&a.positions);
    if (a.keys.obj) PyBuffer_Release(&a.keys);
    if (a.prefix.obj) PyBuffer_Release(&a.prefix);
    if (a.article.obj) PyBuffer_Release(&a.article);
    return result;
}

/* ------------------------------------------------------------------ transactions
 * The per-transaction work, compiled: the pg_lsn text of a WAL position (lsn.int_to_lsn) and the
 * line of COPY text format that stores a transaction (dist_transactions.transaction_line with a
 * replication message's commit time, counts_json and copy_field), byte for byte. */

/* pg_lsn text: upper-case hex, no leading zeros, "%X/%X". */
static Py_ssize_t put_lsn(char *out, unsigned long long value) {
    static const char hex[] = "0123456789ABCDEF";
    char tmp[8];
    Py_ssize_t n = 0;
    for (int half = 1; half >= 0; half--) {
        uint32_t v = (uint32_t)(half ? value >> 32 : value & 0xFFFFFFFFu);
        int k = 0;
        do {
            tmp[k++] = hex[v & 15];
            v >>= 4;
        } while (v);
        while (k) out[n++] = tmp[--k];
        if (half) out[n++] = '/';
    }
    return n;
}

/* A WAL position from a Python int: 0 <= value < 2**64, else ValueError as lsn.int_to_lsn. */
static int lsn_arg(PyObject *arg, unsigned long long *value) {
    if (!PyLong_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "a WAL position is an int");
        return -1;
    }
    *value = PyLong_AsUnsignedLongLong(arg);
    if (*value == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyObject *text = PyObject_Str(arg);
        if (text) {
            PyErr_Format(PyExc_ValueError, "not a WAL position (pg_lsn): %U", text);
            Py_DECREF(text);
        }
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(lsn_text_doc,
             "lsn_text(value, /)\n--\n\n"
             "The pg_lsn text of a WAL position (lsn.int_to_lsn's: upper case, no leading zeros).");

static PyObject *lsn_text(PyObject *self, PyObject *arg) {
    (void)self;
    unsigned long long value;
    char out[24];
    if (lsn_arg(arg, &value) < 0) return NULL;
    return PyUnicode_FromStringAndSize(out, put_lsn(out, value));
}

/* A decimal number (printf's %lld, without printf's cost); digits: at least this many (zeros). */
static char *put_decimal(char *out, long long value, int digits) {
    char tmp[24];
    int k = 0;
    unsigned long long v = value < 0 ? 0ULL - (unsigned long long)value : (unsigned long long)value;
    if (value < 0) *out++ = '-';
    do {
        tmp[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v || k < digits);
    while (k) *out++ = tmp[--k];
    return out;
}

/* Days since 1970-01-01 -> civil date (proleptic Gregorian; H. Hinnant's algorithm). */
static void civil_from_days(long long z, long long *y, unsigned *m, unsigned *d) {
    z += 719468;
    long long era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    long long yy = (long long)yoe + era * 400;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = yy + (*m <= 2);
}

/* "YYYY-MM-DD HH:MM:SS.ffffff+00" of microseconds since 2000-01-01 UTC (29 bytes); 0 when the
 * year is outside 1000..9999: the Python path's (datetime refuses a year past 9999, and its
 * strftime writes a year before 1000 without leading zeros). */
static int put_time(char *out, long long us) {
    long long second = us / 1000000, fraction = us % 1000000;
    if (fraction < 0) {
        fraction += 1000000;
        second -= 1;
    }
    long long day = second / 86400, in_day = second % 86400;
    if (in_day < 0) {
        in_day += 86400;
        day -= 1;
    }
    long long y;
    unsigned m, d;
    civil_from_days(day + 10957, &y, &m, &d); /* 2000-01-01 is day 10957 of 1970 */
    if (y < 1000 || y > 9999) return 0;
    out = put_decimal(out, y, 4);
    *out++ = '-';
    out = put_decimal(out, m, 2);
    *out++ = '-';
    out = put_decimal(out, d, 2);
    *out++ = ' ';
    out = put_decimal(out, in_day / 3600, 2);
    *out++ = ':';
    out = put_decimal(out, in_day / 60 % 60, 2);
    *out++ = ':';
    out = put_decimal(out, in_day % 60, 2);
    *out++ = '.';
    out = put_decimal(out, fraction, 6);
    memcpy(out, "+00", 3);
    return 1;
}

/* Size and writer of a text as one COPY field (copy_escaping.copy_field) or, json set, as a
 * JSON string in a COPY field (put_value's escapes). */
static Py_ssize_t field_size(const char *p, Py_ssize_t n) {
    Py_ssize_t size = n;
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] == '\\' || p[i] == '\n' || p[i] == '\r' || p[i] == '\t') size++;
    return size;
}

static char *put_field(char *out, const char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' || c == '\n' || c == '\r' || c == '\t') {
            *out++ = '\\';
            *out++ = c == '\\' ? '\\' : c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
        } else {
            *out++ = c;
        }
    }
    return out;
}

PyDoc_STRVAR(transaction_line_doc,
             "transaction_line(publication, xact_seqno, xid, commit_us, end_lsn, command_count, "
             "article_rows, origin, schema_change, /)\n--\n\n"
             "dist_transactions.transaction_line's line for a commit time in microseconds since "
             "2000-01-01 UTC and an end LSN as an int, or None when the Python path must write it "
             "(a commit time outside years 1000 to 9999, an article name that is not UTF-8, a count "
             "beyond 64 bits).  publication: a COPY field; xact_seqno: pg_lsn text; origin: str or None.");

static PyObject *transaction_line(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "transaction_line takes 9 arguments");
        return NULL;
    }
    Py_buffer publication;
    Py_ssize_t xact_len, origin_len = 0;
    const char *xact, *origin = NULL;
    unsigned long long end_lsn;
    PyObject *rows = args[6], *result = NULL;
    if (!PyDict_Check(rows)) {
        PyErr_SetString(PyExc_TypeError, "article_rows is a dict");
        return NULL;
    }
    long long xid = PyLong_AsLongLong(args[2]), us = PyLong_AsLongLong(args[3]), count = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int schema_change = PyObject_IsTrue(args[8]);
    if (schema_change < 0 || lsn_arg(args[4], &end_lsn) < 0) return NULL;
    if (!(xact = PyUnicode_AsUTF8AndSize(args[1], &xact_len))) return NULL;
    if (args[7] != Py_None && !(origin = PyUnicode_AsUTF8AndSize(args[7], &origin_len))) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    char time[48];
    if (!put_time(time, us)) Py_RETURN_NONE;
    if (PyObject_GetBuffer(args[0], &publication, PyBUF_SIMPLE) < 0) return NULL;
    /* the article rows' JSON: {"name":count,...} with put_value's escapes */
    Py_ssize_t pos = 0, size = publication.len + xact_len + 2 * 21 + 24 + 29 + 2 + 9 + 2;
    size += origin ? field_size(origin, origin_len) : 2;
    PyObject *key, *value;
    while (PyDict_Next(rows, &pos, &key, &value)) {
        Py_ssize_t n;
        const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, &n) : NULL;
        if (!name || !PyLong_Check(value) || (PyLong_AsLongLong(value) == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            result = Py_NewRef(Py_None);
            goto done;
        }
        Col c = {(const unsigned char *)name, n, 't'};
        size += value_size(&c) + 1 + 21 + 1;
    }
    PyObject *line = PyBytes_FromStringAndSize(NULL, size);
    if (!line) goto done;
    char *start = PyBytes_AS_STRING(line), *out = start;
    memcpy(out, publication.buf, (size_t)publication.len);
    out += publication.len;
    *out++ = '\t';
    memcpy(out, xact, (size_t)xact_len);
    out += xact_len;
    *out++ = '\t';
    out = put_decimal(out, xid, 1);
    *out++ = '\t';
    memcpy(out, time, 29);
    out += 29;
    *out++ = '\t';
    out += put_lsn(out, end_lsn);
    *out++ = '\t';
    out = put_decimal(out, count, 1);
    *out++ = '\t';
    *out++ = '{';
    pos = 0;
    int first = 1;
    while (PyDict_Next(rows, &pos, &key, &value)) {
        Py_ssize_t n;
        const char *name = PyUnicode_AsUTF8AndSize(key, &n);
        Col c = {(const unsigned char *)name, n, 't'};
        if (!first) *out++ = ',';
        first = 0;
        out = put_value(out, &c);
        *out++ = ':';
        out = put_decimal(out, PyLong_AsLongLong(value), 1);
    }
    *out++ = '}';
    *out++ = '\t';
    if (origin) {
        out = put_field(out, origin, origin_len);
    } else {
        memcpy(out, "\\N", 2);
        out += 2;
    }
    *out++ = '\t';
    *out++ = schema_change ? 't' : 'f';
    *out++ = '\n';
    if (_PyBytes_Resize(&line, out - start) == 0) result = line;
done:
    PyBuffer_Release(&publication);
    return result;
}

static PyMethodDef methods[] = {
    {"row_line", (PyCFunction)(void (*)(void))row_line, METH_FASTCALL, row_line_doc},
    {"lsn_text", (PyCFunction)lsn_text, METH_O, lsn_text_doc},
    {"transaction_line", (PyCFunction)(void (*)(void))transaction_line, METH_FASTCALL, transaction_line_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_command_lines",
    .m_doc = "The Log Reader Agent's row messages and transactions as COPY lines, in C.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__command_lines(void) { return PyModule_Create(&module); }
