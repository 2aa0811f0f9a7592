/* agent._bufferform: the Buffer-form byte array (`[1,2,..]`, JSON ints 0..255) <-> bytes in one
 * native pass, with the GIL released while it works.
 *
 * An OPTIONAL extension (setup.py builds it with optional=True): agent/protocol/bytearrays.py
 * imports it when it is there and falls back to the pysimdjson/orjson path when it is not, and
 * reports which one it chose.
 *
 * decode(buffer) -> bytes | None
 *   `buffer` is JSON text that must be exactly one array of integers 0..255 written plainly:
 *   `0` or a digit 1-9 followed by at most two digits, separated by commas, with JSON whitespace
 *   (space, tab, LF, CR) allowed wherever JSON allows it. Anything else -- a value above 255, a
 *   leading zero, a sign, a fraction or exponent, `true`/`false`/`null`, a string, a nested
 *   value, a trailing comma, text after the array -- answers None: "not the plain form". The
 *   caller then asks the pure path (bytearrays.pure_int_array: JSON's verdict, read in slices),
 *   whose verdict stands, so the native path can only ever agree with it
 *   (tests/protocol/test_bytearrays.py checks that differentially; tests/fuzz fuzzes it).
 *
 * encode(buffer) -> bytes
 *   The array text of the bytes in `buffer`, as JSON.stringify writes a Buffer's `data`: `[1,2]`
 *   with no whitespace.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* 1 for the ASCII digits, else 0 */
static unsigned char is_digit[256];

/* Parse [start, end) into out; returns the number of bytes written, or -1 when the text is not
 * a plain array of ints 0..255. No Python API: runs without the GIL.
 *
 * The hot loop reads four characters at a time and works out the value and its length without
 * a branch per digit (random bytes have 1, 2 and 3 digits in no pattern a branch predictor
 * could learn); the checks it defers are folded into `bad`, which fails the whole array. */
static Py_ssize_t parse_array(const unsigned char *p, const unsigned char *end, unsigned char *out)
{
    unsigned char *o = out;
    unsigned bad = 0;
    while (p < end && is_ws(*p)) p++;
    while (end > p && is_ws(end[-1])) end--;
    /* After trimming, the text must be `[` ... `]`: every digit run below then stops at the
     * final `]` at the latest, so the look-ahead reads never pass `end`. */
    if (end - p < 2 || *p != '[' || end[-1] != ']') return -1;
    p++;
    const unsigned char *last = end - 1; /* the closing bracket */
    while (p < last && is_ws(*p)) p++;
    if (p == last) return 0; /* [] */
    for (;;) {
        if (last - p >= 4) {
            unsigned c0 = p[0], c1 = p[1], c2 = p[2], c3 = p[3];
            unsigned a0 = is_digit[c0], a1 = is_digit[c1];
            unsigned a2 = a1 & is_digit[c2], a3 = a2 & is_digit[c3];
            unsigned d0 = c0 - '0', v = d0;
            v += a1 * (v * 9 + (c1 - '0'));
            v += a2 * (v * 9 + (c2 - '0'));
            /* not a digit first, a leading zero, four digits, above 255 */
            bad |= (a0 ^ 1u) | (a1 & (d0 == 0)) | a3 | (v > 255);
            *o++ = (unsigned char)v;
            p += 1 + a1 + a2;
        } else {
            unsigned d0 = (unsigned)p[0] - '0';
            if (d0 > 9) return -1;
            unsigned d1 = (unsigned)p[1] - '0';
            unsigned v;
            if (d1 > 9) {
                v = d0;
                p += 1;
            } else {
                if (d0 == 0) return -1; /* leading zero: not JSON */
                unsigned d2 = (unsigned)p[2] - '0';
                if (d2 > 9) {
                    v = d0 * 10 + d1;
                    p += 2;
                } else {
                    if ((unsigned)p[3] - '0' <= 9) return -1; /* four digits: above 255 */
                    v = d0 * 100 + d1 * 10 + d2;
                    if (v > 255) return -1;
                    p += 3;
                }
            }
            *o++ = (unsigned char)v;
        }
        /* the separator: a comma (the common case), or the end, with whitespace around */
        if (*p == ',') {
            p++;
        } else {
            while (p < last && is_ws(*p)) p++;
            if (p == last) return bad ? -1 : (Py_ssize_t)(o - out);
            if (*p != ',') return -1; /* `.`, `e`, a letter, a nested value, ... */
            p++;
        }
        if (p >= last) return -1; /* a trailing comma */
        if (!is_digit[*p]) {
            while (p < last && is_ws(*p)) p++;
            if (p >= last) return -1;
        }
    }
}

static const unsigned M0[4] = {0, 1, 10, 100};
static const unsigned M1[4] = {0, 0, 1, 10};
static const unsigned M2[4] = {0, 0, 0, 1};

/* One value [start, comma): its byte, or a mark in `*bad` (empty, leading zero, over three
 * digits, above 255). Reads start[0..2] whatever `len` is: the callers guarantee all three are
 * inside the text (the block loop stops 66 characters before the closing bracket). */
static inline unsigned char value_of(const unsigned char *start, Py_ssize_t len, unsigned *bad)
{
    unsigned L = len > 3 ? 0u : (unsigned)len;
    unsigned d0 = start[0] - (unsigned)'0', d1 = start[1] - (unsigned)'0';
    unsigned d2 = start[2] - (unsigned)'0';
    unsigned v = d0 * M0[L] + d1 * M1[L] + d2 * M2[L];
    *bad |= (L == 0) | ((d0 == 0) & (L > 1)) | (v > 255);
    return (unsigned char)v;
}

/* One value [start, start + len) read with no look-ahead: its byte, or -1 if it is not one. */
static int value_exact(const unsigned char *start, Py_ssize_t len)
{
    if (len < 1 || len > 3 || (len > 1 && start[0] == '0')) return -1;
    unsigned v = 0;
    for (Py_ssize_t k = 0; k < len; k++) v = v * 10 + (start[k] - (unsigned)'0');
    return v > 255 ? -1 : (int)v;
}

/* The canonical text (JSON.stringify's: digits and commas only between the brackets), the
 * common case, done by finding the commas 64 characters at a time (SSE2 on x86-64) and reading
 * each value off its position: no per-digit branch, no dependency from one value to the next
 * but the comma bitmask. [s, last) is the interior, `last` the closing bracket. -1: not the
 * canonical text, or not valid (the general parser decides). */
static Py_ssize_t parse_canonical(const unsigned char *s, const unsigned char *last,
                                  unsigned char *out, Py_ssize_t cap)
{
    unsigned char *o = out;
    const unsigned char *start = s;
    Py_ssize_t n = last - s, i = 0;
    unsigned bad = 0;
    /* 66, not 64: a value that starts at the block's last comma is read three characters
     * ahead (value_of), and those must still be inside the text. */
    for (; i + 66 <= n; i += 64) {
        uint64_t commas = 0, good = 0;
#if defined(__SSE2__)
        const __m128i comma = _mm_set1_epi8(','), zero = _mm_set1_epi8('0');
        const __m128i nine = _mm_set1_epi8(9);
        for (int k = 0; k < 4; k++) {
            __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 16 * k));
            __m128i is_comma = _mm_cmpeq_epi8(c, comma);
            __m128i x = _mm_sub_epi8(c, zero);
            __m128i is_digit_v = _mm_cmpeq_epi8(_mm_min_epu8(x, nine), x);
            uint64_t cm = (uint16_t)_mm_movemask_epi8(is_comma);
            uint64_t gm = (uint16_t)_mm_movemask_epi8(_mm_or_si128(is_comma, is_digit_v));
            commas |= cm << (16 * k);
            good |= gm << (16 * k);
        }
#else
        for (int k = 0; k < 64; k++) {
            unsigned char c = s[i + k];
            commas |= (uint64_t)(c == ',') << k;
            good |= (uint64_t)(c == ',' || is_digit[c]) << k;
        }
#endif
        if (good != ~(uint64_t)0) return -1;
        /* Text that is mostly commas has more values than the output can hold (it is sized
         * for a digit and a comma each); such text is not an array of bytes anyway. */
        if ((o - out) + __builtin_popcountll(commas) > cap) return -1;
        while (commas) {
            const unsigned char *e = s + i + __builtin_ctzll(commas);
            commas &= commas - 1;
            *o++ = value_of(start, e - start, &bad);
            start = e + 1;
        }
    }
    if (bad) return -1;
    for (; i < n; i++) {
        unsigned char c = s[i];
        if (c == ',') {
            int v = value_exact(start, s + i - start);
            if (v < 0 || o - out >= cap) return -1;
            *o++ = (unsigned char)v;
            start = s + i + 1;
        } else if (!is_digit[c]) {
            return -1;
        }
    }
    /* the last value, [start, last) */
    int v = value_exact(start, last - start);
    if (v < 0 || o - out >= cap) return -1;
    *o++ = (unsigned char)v;
    return (Py_ssize_t)(o - out);
}

/* Either parser, canonical first. */
static Py_ssize_t parse_any(const unsigned char *p, const unsigned char *end, unsigned char *out,
                            Py_ssize_t cap)
{
    if (end - p >= 3 && p[0] == '[' && end[-1] == ']') {
        Py_ssize_t n = parse_canonical(p + 1, end - 1, out, cap);
        if (n >= 0) return n;
    }
    return parse_array(p, end, out);
}

static PyObject *decode(PyObject *module, PyObject *arg)
{
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    /* A byte array has at most one value per two characters (a digit and a comma):
     * parse_array writes a value only after consuming at least that, and parse_canonical,
     * which counts commas before it writes, stops at `bound` (hostile text is mostly commas). */
    Py_ssize_t bound = view.len / 2 + 1;
    PyObject *result = PyBytes_FromStringAndSize(NULL, bound);
    if (result == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const unsigned char *text = (const unsigned char *)view.buf;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    Py_ssize_t written;
    Py_BEGIN_ALLOW_THREADS
    written = parse_any(text, text + view.len, out, bound);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (written < 0) {
        Py_DECREF(result);
        Py_RETURN_NONE;
    }
    if (_PyBytes_Resize(&result, written) < 0) return NULL;
    return result;
}

/* "0," .. "255," : the text of each byte followed by a comma, and its length. */
static char digits[256][4];
static unsigned char widths[256];

static void build_table(void)
{
    for (int c = '0'; c <= '9'; c++) is_digit[c] = 1;
    for (int i = 0; i < 256; i++) {
        char tmp[8];
        int n = snprintf(tmp, sizeof tmp, "%d,", i);
        memcpy(digits[i], tmp, 4);
        widths[i] = (unsigned char)n;
    }
}

static Py_ssize_t format_array(const unsigned char *p, Py_ssize_t n, char *out)
{
    char *o = out;
    *o++ = '[';
    for (Py_ssize_t i = 0; i < n; i++) {
        memcpy(o, digits[p[i]], 4); /* the buffer has room for four per byte */
        o += widths[p[i]];
    }
    if (n > 0) o--; /* the last comma */
    *o++ = ']';
    return (Py_ssize_t)(o - out);
}

static PyObject *encode(PyObject *module, PyObject *arg)
{
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (view.len > (PY_SSIZE_T_MAX - 2) / 4) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, view.len * 4 + 2);
    if (result == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t written;
    const unsigned char *data = (const unsigned char *)view.buf;
    char *out = PyBytes_AS_STRING(result);
    Py_BEGIN_ALLOW_THREADS
    written = format_array(data, view.len, out);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&result, written) < 0) return NULL;
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_O,
     "decode(buffer) -> bytes | None: a plain JSON array of ints 0..255 as bytes; None when the "
     "text is anything else (ask the pure path)."},
    {"encode", encode, METH_O, "encode(buffer) -> bytes: the JSON array text of the bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "agent._bufferform",
    "Native Buffer-form byte arrays: JSON int array text <-> bytes, GIL released.", -1, methods,
};

PyMODINIT_FUNC PyInit__bufferform(void)
{
    build_table();
    return PyModule_Create(&module_def);
}
