/* agent._sha256pair: a running sha256 that also gives the sha256 of each piece added to it,
 * both in ONE pass over the bytes where the CPU has the SHA extensions (SHA-NI).
 *
 * Why: staging and the closures hash every byte twice, the whole object's sha256 (the manifest's
 * proof) and each Corestore chunk's (its PUT carries it), and at 1.2 GB/s per core that was a
 * fifth of the agent's CPU per GiB. The message schedule of a block is the same for both
 * digests, and the two round chains are independent, so one pass that runs both chains
 * side by side costs about 1.45x one digest, not 2x (docs/benchmarks.md, "One byte budget").
 *
 * Where the CPU lacks SHA-NI, `available()` is False and the agent uses hashlib twice
 * (agent/chunking.py); the answers are the same, held to hashlib's by tests/test_sha256pair.py.
 * The algorithm is FIPS 180-4's; the instruction sequence per four rounds is the one Intel's
 * SHA extensions documentation describes (sha256rnds2 twice, sha256msg1/msg2 for the schedule).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_SHANI 1
#endif

static const uint32_t IV[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

/* Bytes at or above this are hashed with the GIL released. */
#define RELEASE_GIL_MIN 8192

#ifdef HAVE_SHANI
static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define SHANI __attribute__((target("sha,sse4.1,ssse3")))

/* The state as the instructions want it: ABEF and CDGH. */
typedef struct {
    __m128i abef, cdgh;
} lane;

SHANI static lane lane_load(const uint32_t s[8])
{
    __m128i dcba = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&s[0]), 0xB1);
    __m128i efgh = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&s[4]), 0x1B);
    lane l = {_mm_alignr_epi8(dcba, efgh, 8), _mm_blend_epi16(efgh, dcba, 0xF0)};
    return l;
}

SHANI static void lane_store(lane l, uint32_t s[8])
{
    __m128i feba = _mm_shuffle_epi32(l.abef, 0x1B);
    __m128i dchg = _mm_shuffle_epi32(l.cdgh, 0xB1);
    _mm_storeu_si128((__m128i *)&s[0], _mm_blend_epi16(feba, dchg, 0xF0));
    _mm_storeu_si128((__m128i *)&s[4], _mm_alignr_epi8(dchg, feba, 8));
}

/* Four rounds of one chain with `msg` = W[t..t+3] + K[t..t+3]. */
#define FOUR_ROUNDS(l, msg)                                                                     \
    do {                                                                                        \
        (l).cdgh = _mm_sha256rnds2_epu32((l).cdgh, (l).abef, (msg));                           \
        (l).abef = _mm_sha256rnds2_epu32((l).abef, (l).cdgh, _mm_shuffle_epi32((msg), 0x0E));  \
    } while (0)

/* `blocks` 64-byte blocks into `count` (1 or 2) states, the schedule computed once. */
SHANI static inline void compress(uint32_t *states[2], int count, const unsigned char *p, size_t blocks)
{
    const __m128i order = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    lane a = lane_load(states[0]);
    lane b = count == 2 ? lane_load(states[1]) : a;
    for (; blocks; blocks--, p += 64) {
        lane a0 = a, b0 = b;
        __m128i w[4];
        for (int i = 0; i < 4; i++)
            w[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), order);
        for (int g = 0; g < 16; g++) {
            __m128i msg = _mm_add_epi32(w[g & 3], _mm_loadu_si128((const __m128i *)&K[4 * g]));
            FOUR_ROUNDS(a, msg);
            if (count == 2)
                FOUR_ROUNDS(b, msg);
            if (g < 12) {
                /* W[t..t+3], t = 4g + 16, from W[t-16..t-1] held in w[] */
                __m128i t = _mm_sha256msg1_epu32(w[g & 3], w[(g + 1) & 3]);
                t = _mm_add_epi32(t, _mm_alignr_epi8(w[(g + 3) & 3], w[(g + 2) & 3], 4));
                w[g & 3] = _mm_sha256msg2_epu32(t, w[(g + 3) & 3]);
            }
        }
        a.abef = _mm_add_epi32(a.abef, a0.abef);
        a.cdgh = _mm_add_epi32(a.cdgh, a0.cdgh);
        if (count == 2) {
            b.abef = _mm_add_epi32(b.abef, b0.abef);
            b.cdgh = _mm_add_epi32(b.cdgh, b0.cdgh);
        }
    }
    lane_store(a, states[0]);
    if (count == 2)
        lane_store(b, states[1]);
}

static int cpu_has_shani(void)
{
    unsigned int eax, ebx, ecx, edx;
    __builtin_cpu_init();
    /* CPUID leaf 7, sub-leaf 0: EBX bit 29 is SHA. */
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx))
        return 0;
    return ((ebx >> 29) & 1) && __builtin_cpu_supports("sse4.1") &&
           __builtin_cpu_supports("ssse3");
}
#endif

static int have_shani = 0;

/* One running digest: state, the bytes of an unfinished block, the length so far. */
typedef struct {
    uint32_t state[8];
    unsigned char block[64];
    uint64_t length;
} running;

static void running_init(running *r)
{
    memcpy(r->state, IV, sizeof IV);
    r->length = 0;
}

static void running_update(running *r, const unsigned char *p, size_t n)
{
#ifdef HAVE_SHANI
    uint32_t *states[2] = {r->state, NULL};
    size_t held = (size_t)(r->length % 64);
    r->length += n;
    if (held) {
        size_t take = 64 - held < n ? 64 - held : n;
        memcpy(r->block + held, p, take);
        p += take, n -= take;
        if (held + take < 64)
            return;
        compress(states, 1, r->block, 1);
    }
    compress(states, 1, p, n / 64);
    memcpy(r->block, p + n - n % 64, n % 64);
#else
    (void)r, (void)p, (void)n;
#endif
}

static void running_digest(const running *r, unsigned char out[32])
{
#ifdef HAVE_SHANI
    running last = *r;
    uint32_t *states[2] = {last.state, NULL};
    size_t held = (size_t)(last.length % 64);
    unsigned char tail[128] = {0};
    memcpy(tail, last.block, held);
    tail[held] = 0x80;
    size_t size = held < 56 ? 64 : 128;
    uint64_t bits = last.length * 8;
    for (int i = 0; i < 8; i++)
        tail[size - 1 - i] = (unsigned char)(bits >> (8 * i));
    compress(states, 1, tail, size / 64);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(last.state[i] >> 24);
        out[4 * i + 1] = (unsigned char)(last.state[i] >> 16);
        out[4 * i + 2] = (unsigned char)(last.state[i] >> 8);
        out[4 * i + 3] = (unsigned char)last.state[i];
    }
#else
    (void)r;
    memset(out, 0, 32);
#endif
}

/* Add `p[0:n]` to `whole`; `piece` is the digest of `p[0:n]` alone. One pass over the blocks
 * when the whole has no unfinished block (the pieces of a stream cut at multiples of 64). */
static void update_pair(running *whole, running *piece, const unsigned char *p, size_t n)
{
#ifdef HAVE_SHANI
    running_init(piece);
    if (whole->length % 64 != 0) {
        running_update(whole, p, n);
        running_update(piece, p, n);
        return;
    }
    size_t blocks = n / 64, rest = n % 64;
    uint32_t *states[2] = {whole->state, piece->state};
    compress(states, 2, p, blocks);
    whole->length += n - rest;
    piece->length += n - rest;
    running_update(whole, p + n - rest, rest);
    running_update(piece, p + n - rest, rest);
#else
    (void)whole, (void)piece, (void)p, (void)n;
#endif
}

/* --- the Python type ------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD running whole;
    int busy; /* a call runs without the GIL: another call on the same object is refused */
} Sha256Pair;

static int enter(Sha256Pair *self)
{
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Sha256Pair is in use by another thread");
        return -1;
    }
    self->busy = 1;
    return 0;
}

static PyObject *pair_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (!have_shani) {
        PyErr_SetString(PyExc_RuntimeError, "this CPU has no SHA extensions (see available())");
        return NULL;
    }
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "Sha256Pair() takes no arguments");
        return NULL;
    }
    Sha256Pair *self = (Sha256Pair *)type->tp_alloc(type, 0);
    if (self != NULL)
        running_init(&self->whole);
    return (PyObject *)self;
}

/* Add the bytes of `data` to the whole, and (with `piece`) make `piece` their own digest's
 * state; the GIL released for large ones. -1 with an exception set. */
static int add(Sha256Pair *self, PyObject *data, running *piece)
{
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0)
        return -1;
    if (enter(self) < 0) {
        PyBuffer_Release(&view);
        return -1;
    }
    const unsigned char *p = view.buf;
    size_t n = (size_t)view.len;
    int release = view.len >= RELEASE_GIL_MIN;
    PyThreadState *saved = release ? PyEval_SaveThread() : NULL;
    if (piece != NULL)
        update_pair(&self->whole, piece, p, n);
    else
        running_update(&self->whole, p, n);
    if (release)
        PyEval_RestoreThread(saved);
    self->busy = 0;
    PyBuffer_Release(&view);
    return 0;
}

static PyObject *pair_update(Sha256Pair *self, PyObject *data)
{
    if (add(self, data, NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *pair_update_piece(Sha256Pair *self, PyObject *data)
{
    running piece;
    unsigned char out[32];
    if (add(self, data, &piece) < 0)
        return NULL;
    running_digest(&piece, out);
    return PyBytes_FromStringAndSize((const char *)out, 32);
}

static PyObject *pair_digest(Sha256Pair *self, PyObject *Py_UNUSED(ignored))
{
    unsigned char out[32];
    if (enter(self) < 0)
        return NULL;
    running_digest(&self->whole, out);
    self->busy = 0;
    return PyBytes_FromStringAndSize((const char *)out, 32);
}

static PyMethodDef pair_methods[] = {
    {"update", (PyCFunction)pair_update, METH_O,
     "update(data) -> None: add data to the running digest."},
    {"update_piece", (PyCFunction)pair_update_piece, METH_O,
     "update_piece(data) -> bytes: add data to the running digest; the sha256 of data alone."},
    {"digest", (PyCFunction)pair_digest, METH_NOARGS,
     "digest() -> bytes: the sha256 of every byte added so far (the object goes on)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Sha256PairType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "agent._sha256pair.Sha256Pair",
    .tp_basicsize = sizeof(Sha256Pair),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Sha256Pair(): a running sha256 that also gives each piece's own sha256 in the "
              "same pass over its bytes.",
    .tp_new = pair_new,
    .tp_methods = pair_methods,
};

static PyObject *available(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(have_shani);
}

static PyMethodDef methods[] = {
    {"available", available, METH_NOARGS,
     "available() -> bool: whether this CPU runs Sha256Pair (it has the SHA extensions)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "agent._sha256pair",
    "A running sha256 that gives each piece's sha256 in the same pass (SHA-NI).", -1, methods,
};

PyMODINIT_FUNC PyInit__sha256pair(void)
{
#ifdef HAVE_SHANI
    have_shani = cpu_has_shani();
#endif
    if (PyType_Ready(&Sha256PairType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    Py_INCREF(&Sha256PairType);
    if (PyModule_AddObject(module, "Sha256Pair", (PyObject *)&Sha256PairType) < 0) {
        Py_DECREF(&Sha256PairType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
