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
 *   The canonical text (digits and commas only between the brackets, what JSON.stringify
 *   writes) is read by a block kernel first: `wide` (AVX-512 with VBMI2, chosen at import where
 *   the CPU has it) or `portable` (SSE2 or plain C); anything a kernel does not take goes to the
 *   general parser, so a kernel can only ever answer what that parser would.
 *
 * decode_quick(buffer) -> bytes | None
 *   The wide kernel alone, the GIL held, for a caller on the event loop: a canonical array's
 *   bytes, else None (the caller then asks decode() in a worker thread); None on a CPU without
 *   the wide kernel.
 *
 * decode_with(buffer, kernel) -> bytes | None, kernels() -> tuple[str, ...]
 *   decode() on a named kernel; the kernels this CPU runs, the one decode() uses first (for the
 *   tests, which hold every kernel to the same answers, and the start-up line).
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

/* What a canonical kernel leaves after its blocks, value by value: [p, last) holds the text
 * still to read, `start` the value under way (it began at or before p), `o` the next byte of
 * `out` to write (at most `cap` in all). The number of bytes written, or -1. */
static Py_ssize_t parse_rest(const unsigned char *p, const unsigned char *last,
                             const unsigned char *start, unsigned char *out, unsigned char *o,
                             Py_ssize_t cap)
{
    for (; p < last; p++) {
        if (*p == ',') {
            int v = value_exact(start, p - start);
            if (v < 0 || o - out >= cap) return -1;
            *o++ = (unsigned char)v;
            start = p + 1;
        } else if (!is_digit[*p]) {
            return -1;
        }
    }
    /* the last value, [start, last) */
    int v = value_exact(start, last - start);
    if (v < 0 || o - out >= cap) return -1;
    *o++ = (unsigned char)v;
    return (Py_ssize_t)(o - out);
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
    return parse_rest(s + i, last, start, out, o, cap);
}

#if defined(__x86_64__) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 8))
#define HAVE_WIDE 1
#include <immintrin.h>

#define WIDE_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512vbmi2,popcnt")))

/* The canonical text 64 characters at a time with AVX-512 (VBMI2: byte compress), chosen at run
 * time where the CPU has it (`wide`). Every value ends at a comma; for the 64 positions of a
 * block the kernel loads the text at the position and one, two and three characters before it,
 * so at each comma it sees the value's last three characters and whether each is a digit. The
 * checks are masks over the block, all folded into `bad`:
 *   - a character that is neither a digit nor a comma;
 *   - a comma with no digit before it (an empty value: `[,`, `,,`);
 *   - a digit with three digits before it (a value of four digits or more);
 *   - a digit after a `0` that follows a comma or the bracket (a leading zero);
 *   - at a comma, a three-digit value above 255 (hundreds 2 and tens+units >= 56, or >= 3).
 * The values (units + 10 * tens + 100 * hundreds, read by table from the digits) are packed
 * to the output in comma order by one compress. What the blocks leave (fewer than 64
 * characters, and the value after the last comma) is read as parse_canonical reads its tail.
 * Reads stay inside [s - 1, last): s[-1] is the opening bracket, and the loads that would
 * reach before it (the first block's) are masked. */
WIDE_TARGET
static Py_ssize_t parse_canonical_wide(const unsigned char *s, const unsigned char *last,
                                       unsigned char *out, Py_ssize_t cap)
{
    unsigned char *o = out;
    const unsigned char *start = s;
    Py_ssize_t n = last - s, i = 0;
    const __m512i zero = _mm512_set1_epi8('0'), nine = _mm512_set1_epi8(9);
    const __m512i comma = _mm512_set1_epi8(',');
    const __m512i never = _mm512_set1_epi8(100); /* tens+units never reach 100 */
    /* indexed by a digit (vpermb reads the low 6 bits of each index) */
    const __m512i tens = _mm512_set_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 90, 80, 70, 60, 50,
        40, 30, 20, 10, 0);
    const __m512i hundreds = _mm512_set_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, (char)200, 100, 0);
    /* the least tens+units that makes a three-digit value too large, by its hundreds digit */
    const __m512i limit = _mm512_set_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 56, 100, 100);
    for (; i + 64 <= n; i += 64) {
        const unsigned char *b = s + i;
        __m512i c0 = _mm512_loadu_si512((const void *)b);
        __m512i c1 = _mm512_loadu_si512((const void *)(b - 1)); /* b[-1] >= s[-1], the bracket */
        __m512i c2, c3;
        if (i > 0) {
            c2 = _mm512_loadu_si512((const void *)(b - 2));
            c3 = _mm512_loadu_si512((const void *)(b - 3));
        } else { /* nothing before the bracket is read: those lanes are 0, not a digit */
            c2 = _mm512_maskz_loadu_epi8(~(__mmask64)1, (const void *)(b - 2));
            c3 = _mm512_maskz_loadu_epi8(~(__mmask64)3, (const void *)(b - 3));
        }
        __m512i x1 = _mm512_sub_epi8(c1, zero), x2 = _mm512_sub_epi8(c2, zero);
        __m512i x3 = _mm512_sub_epi8(c3, zero);
        uint64_t d0 = _mm512_cmple_epu8_mask(_mm512_sub_epi8(c0, zero), nine);
        uint64_t d1 = _mm512_cmple_epu8_mask(x1, nine);
        uint64_t d2 = _mm512_cmple_epu8_mask(x2, nine);
        uint64_t d3 = _mm512_cmple_epu8_mask(x3, nine);
        uint64_t cm = _mm512_cmpeq_epi8_mask(c0, comma);
        uint64_t z1 = _mm512_cmpeq_epi8_mask(c1, zero);
        uint64_t d12 = d1 & d2, d123 = d12 & d3;
        uint64_t bad = ~(d0 | cm) | (cm & ~d1) | (d0 & d123) | (d0 & z1 & ~d2);
        __m512i tu = _mm512_add_epi8(x1, _mm512_maskz_permutexvar_epi8(d12, x2, tens));
        __m512i lim = _mm512_mask_permutexvar_epi8(never, d123, x3, limit);
        bad |= _mm512_mask_cmpge_epu8_mask(cm, tu, lim);
        if (bad) return -1;
        /* every comma follows a digit now: at most 32 in a block, one value each */
        int k = __builtin_popcountll(cm);
        if ((o - out) + k > cap) return -1;
        __m512i v = _mm512_add_epi8(tu, _mm512_maskz_permutexvar_epi8(d123, x3, hundreds));
        _mm512_mask_storeu_epi8(o, (((__mmask64)1) << k) - 1, _mm512_maskz_compress_epi8(cm, v));
        o += k;
        if (cm) start = b + 64 - __builtin_clzll(cm);
    }
    return parse_rest(s + i, last, start, out, o, cap);
}

static int cpu_has_wide(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vbmi2") &&
           __builtin_cpu_supports("popcnt");
}
#endif

/* The canonical kernels: "portable" (parse_canonical, SSE2 or plain C) everywhere, "wide"
 * (AVX-512) where the CPU has it; `kernel` is the one decode() uses (the widest). */
enum { KERNEL_PORTABLE = 0, KERNEL_WIDE = 1 };
static const char *const kernel_names[] = {"portable", "wide"};
static int have_wide = 0;
static int kernel = KERNEL_PORTABLE;

/* Either parser, canonical first. */
static Py_ssize_t parse_any(const unsigned char *p, const unsigned char *end, unsigned char *out,
                            Py_ssize_t cap, int which)
{
    if (end - p >= 3 && p[0] == '[' && end[-1] == ']') {
        Py_ssize_t n;
#ifdef HAVE_WIDE
        if (which == KERNEL_WIDE)
            n = parse_canonical_wide(p + 1, end - 1, out, cap);
        else
#endif
            n = parse_canonical(p + 1, end - 1, out, cap);
        if (n >= 0) return n;
    }
    (void)which;
    return parse_array(p, end, out);
}

static PyObject *decode_by(PyObject *arg, int which)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    /* A byte array has at most one value per two characters (a digit and a comma):
     * parse_array writes a value only after consuming at least that, and the canonical
     * kernels, which count commas before they write, stop at `bound` (hostile text is mostly
     * commas). */
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
    written = parse_any(text, text + view.len, out, bound, which);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (written < 0) {
        Py_DECREF(result);
        Py_RETURN_NONE;
    }
    if (_PyBytes_Resize(&result, written) < 0) return NULL;
    return result;
}

static PyObject *decode(PyObject *module, PyObject *arg)
{
    (void)module;
    return decode_by(arg, kernel);
}

static PyObject *decode_with(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "decode_with(buffer, kernel) takes two arguments");
        return NULL;
    }
    const char *name = PyUnicode_Check(args[1]) ? PyUnicode_AsUTF8(args[1]) : NULL;
    if (name == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "the kernel is a name");
        return NULL;
    }
    if (strcmp(name, kernel_names[KERNEL_PORTABLE]) == 0) return decode_by(args[0], KERNEL_PORTABLE);
    if (strcmp(name, kernel_names[KERNEL_WIDE]) == 0 && have_wide)
        return decode_by(args[0], KERNEL_WIDE);
    PyErr_Format(PyExc_ValueError, "no kernel %s on this CPU", name);
    return NULL;
}

/* The wide kernel alone, with the GIL held (it is called on the event loop, where a short
 * decode costs less than handing it to a thread): the bytes of a canonical array, or None for
 * anything else, and always None on a CPU without the wide kernel. Never the general parser:
 * its time grows with what the peer sent, the wide kernel's stays a pass over the text. */
static PyObject *decode_quick(PyObject *module, PyObject *arg)
{
    (void)module;
    if (!have_wide) Py_RETURN_NONE;
#ifdef HAVE_WIDE
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *text = (const unsigned char *)view.buf;
    Py_ssize_t bound = view.len / 2 + 1, written = -1;
    PyObject *result = NULL;
    if (view.len >= 3 && text[0] == '[' && text[view.len - 1] == ']') {
        result = PyBytes_FromStringAndSize(NULL, bound);
        if (result != NULL)
            written = parse_canonical_wide(text + 1, text + view.len - 1,
                                           (unsigned char *)PyBytes_AS_STRING(result), bound);
    }
    PyBuffer_Release(&view);
    if (result == NULL && PyErr_Occurred()) return NULL;
    if (written < 0) {
        Py_XDECREF(result);
        Py_RETURN_NONE;
    }
    if (_PyBytes_Resize(&result, written) < 0) return NULL;
    return result;
#else
    (void)arg;
    Py_RETURN_NONE;
#endif
}

static PyObject *kernels(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (have_wide) return Py_BuildValue("(ss)", kernel_names[KERNEL_WIDE], kernel_names[KERNEL_PORTABLE]);
    return Py_BuildValue("(s)", kernel_names[KERNEL_PORTABLE]);
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
    {"decode_with", (PyCFunction)(void (*)(void))decode_with, METH_FASTCALL,
     "decode_with(buffer, kernel) -> bytes | None: decode() with the named canonical kernel "
     "(one of kernels())."},
    {"decode_quick", decode_quick, METH_O,
     "decode_quick(buffer) -> bytes | None: the wide kernel alone, GIL held: the bytes of a "
     "canonical array; None for anything else, or without the wide kernel."},
    {"kernels", kernels, METH_NOARGS,
     "kernels() -> tuple[str, ...]: the canonical kernels this CPU runs, the one decode() "
     "uses first."},
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
#ifdef HAVE_WIDE
    have_wide = cpu_has_wide();
#endif
    kernel = have_wide ? KERNEL_WIDE : KERNEL_PORTABLE;
    return PyModule_Create(&module_def);
}
