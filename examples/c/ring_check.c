/*
 * ring_check: a plain C ring all-reduce, checked bit for bit against the
 * ring-ref conformance vectors (spec/vectors/ring_all_reduce_v1.txt).
 *
 *   cc -std=c99 -O2 -ffp-contract=off -o ring_check ring_check.c -lm
 *   ./ring_check ../../spec/vectors/ring_all_reduce_v1.txt
 *
 * Exit status 0 when every vector passes (final result and, where the vector
 * has them, every worker's buffers after every round), 1 otherwise.
 * Compile with -DPLANTED_BUG to make all-gather add instead of copy: the
 * program must then fail.
 *
 * Values are kept as IEEE bit patterns (uint64_t) throughout; only the
 * addition decodes them.  float32 and float64 add natively (SSE, no excess
 * precision, no contraction).  float16 and bfloat16 add exactly in double (or,
 * for far-apart bfloat16 exponents, with one rounding to 53 bits, which is
 * innocuous since 53 >= 2 * 8 + 2) and then round once to the 16-bit format
 * with round-half-to-even, overflowing to infinity.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { FLOAT16, BFLOAT16, FLOAT32, FLOAT64 };

/* A 16-bit binary format: mant_bits stored significand bits, exp_bits exponent bits. */
static double decode16(uint64_t bits, int mant_bits, int exp_bits) {
    int bias = (1 << (exp_bits - 1)) - 1;
    uint64_t mant = bits & ((1u << mant_bits) - 1);
    int exp = (int)((bits >> mant_bits) & ((1u << exp_bits) - 1));
    double sign = (bits >> (mant_bits + exp_bits)) & 1 ? -1.0 : 1.0;
    if (exp == (1 << exp_bits) - 1) return mant ? NAN : sign * INFINITY;
    if (exp == 0) return sign * ldexp((double)mant, 1 - bias - mant_bits);
    return sign * ldexp((double)(mant | (1u << mant_bits)), exp - bias - mant_bits);
}

/* Round a double to the 16-bit format, round-half-to-even, overflow to infinity. */
static uint64_t encode16(double v, int mant_bits, int exp_bits) {
    int bias = (1 << (exp_bits - 1)) - 1;
    int emin = 1 - bias;
    uint64_t sign = signbit(v) ? (uint64_t)1 << (mant_bits + exp_bits) : 0;
    uint64_t inf = (uint64_t)((1 << exp_bits) - 1) << mant_bits;
    double a = fabs(v);
    if (a == 0.0) return sign;
    if (isinf(a)) return sign | inf;
    if (isnan(a)) return sign | inf | ((uint64_t)1 << (mant_bits - 1)); /* quiet NaN: inf + -inf */
    int e2;
    frexp(a, &e2);
    int e = e2 - 1 < emin ? emin : e2 - 1;           /* exponent of the target quantum */
    double scaled = ldexp(a, mant_bits - e);          /* exact: a power-of-two scaling */
    uint64_t q = (uint64_t)nearbyint(scaled);         /* default rounding: half to even */
    if (q >> (mant_bits + 1)) {                       /* rounded up to the next binade */
        q >>= 1;
        e += 1;
    }
    if (q < ((uint64_t)1 << mant_bits)) return sign | q; /* subnormal (or zero) */
    if (e + bias >= (1 << exp_bits) - 1) return sign | inf;
    return sign | ((uint64_t)(e + bias) << mant_bits) | (q - ((uint64_t)1 << mant_bits));
}

static uint64_t add_bits(int dtype, uint64_t a, uint64_t b) {
    switch (dtype) {
    case FLOAT16:
        return encode16(decode16(a, 10, 5) + decode16(b, 10, 5), 10, 5);
    case BFLOAT16:
        return encode16(decode16(a, 7, 8) + decode16(b, 7, 8), 7, 8);
    case FLOAT32: {
        uint32_t ua = (uint32_t)a, ub = (uint32_t)b, ur;
        float fa, fb, fr;
        memcpy(&fa, &ua, 4);
        memcpy(&fb, &ub, 4);
        fr = fa + fb;
        memcpy(&ur, &fr, 4);
        return ur;
    }
    default: {
        double da, db, dr;
        uint64_t ur;
        memcpy(&da, &a, 8);
        memcpy(&db, &b, 8);
        dr = da + db;
        memcpy(&ur, &dr, 8);
        return ur;
    }
    }
}

/* ---- the ring: n workers, each a buffer of n chunks of `chunk` elements ---- */

typedef struct {
    int dtype, n;
    size_t chunk;        /* elements per chunk: (m / n) * prod(trailing) */
    uint64_t *cur, *next; /* n * n * chunk bit patterns each, worker-major */
} Ring;

static uint64_t *slot(const Ring *ring, uint64_t *buf, int worker, int c) {
    return buf + ((size_t)worker * (size_t)ring->n + (size_t)c) * ring->chunk;
}

/* One round, simultaneous: every send reads `cur`, every receive writes `next`. */
static void ring_round(Ring *ring, int all_gather, int r) {
    int n = ring->n;
    size_t total = (size_t)n * (size_t)n * ring->chunk;
    memcpy(ring->next, ring->cur, total * sizeof(uint64_t));
    for (int i = 0; i < n; i++) {
        int src = (i - 1 + n) % n;
        int c = all_gather ? ((src + 1 - r) % n + n) % n : ((src - r) % n + n) % n;
        uint64_t *in = slot(ring, ring->cur, src, c);
        uint64_t *own = slot(ring, ring->cur, i, c);
        uint64_t *out = slot(ring, ring->next, i, c);
        for (size_t k = 0; k < ring->chunk; k++) {
#ifdef PLANTED_BUG
            out[k] = add_bits(ring->dtype, in[k], own[k]);
#else
            out[k] = all_gather ? in[k] : add_bits(ring->dtype, in[k], own[k]);
#endif
        }
    }
    uint64_t *tmp = ring->cur;
    ring->cur = ring->next;
    ring->next = tmp;
}

/* ---- reading the token file (format: spec/vectors/README.md) ---- */

static void malformed(long tc, const char *what) {
    fprintf(stderr, "ring_check: malformed vector file at tcId %ld: %s\n", tc, what);
    exit(2);
}

static int read_word(FILE *f, char *word, size_t size) {
    int ch;
    for (;;) {
        if (fscanf(f, " ") < 0) return 0;
        ch = fgetc(f);
        if (ch == EOF) return 0;
        if (ch != '#') break;
        while (ch != '\n' && ch != EOF) ch = fgetc(f); /* comment line */
    }
    ungetc(ch, f);
    char fmt[16];
    snprintf(fmt, sizeof fmt, "%%%zus", size - 1);
    return fscanf(f, fmt, word) == 1;
}

static void expect_word(FILE *f, const char *want) {
    char word[64];
    if (!read_word(f, word, sizeof word) || strcmp(word, want) != 0) {
        fprintf(stderr, "ring_check: malformed vector file: expected '%s', got '%s'\n", want, word);
        exit(2);
    }
}

static long read_long(FILE *f) {
    char word[64], *end;
    if (!read_word(f, word, sizeof word)) {
        fprintf(stderr, "ring_check: malformed vector file: expected a number\n");
        exit(2);
    }
    long v = strtol(word, &end, 10);
    if (*end) {
        fprintf(stderr, "ring_check: malformed vector file: '%s' is not a number\n", word);
        exit(2);
    }
    return v;
}

/* `count` bit patterns of `digits` hex digits each (4, 8 or 16, by dtype). */
static void read_hex(FILE *f, uint64_t *out, size_t count, size_t digits) {
    char word[64], *end;
    for (size_t k = 0; k < count; k++) {
        if (!read_word(f, word, sizeof word)) {
            fprintf(stderr, "ring_check: malformed vector file: missing hex value\n");
            exit(2);
        }
        out[k] = strtoull(word, &end, 16);
        if (*end || strlen(word) != digits) {
            fprintf(stderr, "ring_check: malformed vector file: '%s' is not %zu hex digits\n", word, digits);
            exit(2);
        }
    }
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "ring_check: out of memory\n");
        exit(2);
    }
    return p;
}

static int dtype_of(const char *name) {
    if (!strcmp(name, "float16")) return FLOAT16;
    if (!strcmp(name, "bfloat16")) return BFLOAT16;
    if (!strcmp(name, "float32")) return FLOAT32;
    if (!strcmp(name, "float64")) return FLOAT64;
    fprintf(stderr, "ring_check: unknown dtype '%s'\n", name);
    exit(2);
}

/* Compare `count` bit patterns; print the first difference. Returns 1 when equal. */
static int same(long tc, const char *what, const uint64_t *got, const uint64_t *want, size_t count) {
    for (size_t k = 0; k < count; k++) {
        if (got[k] != want[k]) {
            printf("tcId %ld: %s differs at element %zu: got %llx, expected %llx\n", tc, what, k,
                   (unsigned long long)got[k], (unsigned long long)want[k]);
            return 0;
        }
    }
    return 1;
}

/* Read one vector (after its `test` keyword), run the ring, compare. Returns 1 on pass. */
static int run_vector(FILE *f) {
    char dtype_name[32], phase[32], label[96];
    long tc = read_long(f);
    if (!read_word(f, dtype_name, sizeof dtype_name)) malformed(tc, "missing dtype");
    Ring ring = {dtype_of(dtype_name), (int)read_long(f), 0, NULL, NULL};
    long m = read_long(f), dims = read_long(f);
    size_t row = 1;
    for (long d = 0; d < dims; d++) row *= (size_t)read_long(f);
    if (ring.n < 1 || m < 1 || m % ring.n) malformed(tc, "n must be at least 1 and m a positive multiple of n");
    size_t per_worker = (size_t)m * row, total = (size_t)ring.n * per_worker;
    size_t digits = ring.dtype == FLOAT64 ? 16 : ring.dtype == FLOAT32 ? 8 : 4;
    ring.chunk = per_worker / (size_t)ring.n;

    expect_word(f, "flags");
    for (long k = read_long(f); k > 0; k--) read_word(f, label, sizeof label);
    expect_word(f, "input");
    if ((size_t)read_long(f) != total) malformed(tc, "input count is not n * m * prod(trailing)");
    ring.cur = xmalloc(total * sizeof(uint64_t));
    ring.next = xmalloc(total * sizeof(uint64_t));
    read_hex(f, ring.cur, total, digits);
    expect_word(f, "expected");
    if ((size_t)read_long(f) != per_worker) malformed(tc, "expected count is not m * prod(trailing)");
    uint64_t *expected = xmalloc(per_worker * sizeof(uint64_t));
    read_hex(f, expected, per_worker, digits);
    expect_word(f, "rounds");
    long rounds = read_long(f);
    if (rounds != 0 && rounds != 2L * (ring.n - 1)) malformed(tc, "rounds is neither 0 nor 2(n - 1)");

    int ok = 1;
    uint64_t *want = xmalloc(total * sizeof(uint64_t));
    for (int phase_ag = 0; phase_ag < 2; phase_ag++) {
        for (int r = 0; r < ring.n - 1; r++) {
            ring_round(&ring, phase_ag, r);
            if (rounds == 0) continue;
            expect_word(f, "round");
            read_word(f, phase, sizeof phase);
            long got_r = read_long(f);
            if (strcmp(phase, phase_ag ? "all-gather" : "reduce-scatter") || got_r != r)
                malformed(tc, "rounds out of order");
            if ((size_t)read_long(f) != total) malformed(tc, "round buffer count is not n * m * prod(trailing)");
            read_hex(f, want, total, digits);
            snprintf(label, sizeof label, "buffers after %s round %d", phase, r);
            if (ok) ok = same(tc, label, ring.cur, want, total);
        }
    }
    expect_word(f, "end");
    if (ok) ok = same(tc, "result (worker 0)", ring.cur, expected, per_worker);
    free(ring.cur);
    free(ring.next);
    free(expected);
    free(want);
    return ok;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s ring_all_reduce_v1.txt\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(argv[1], "r");
    if (!f) {
        perror(argv[1]);
        return 2;
    }
    expect_word(f, "vectors");
    long count = read_long(f), passed = 0, failed = 0;
    char word[16];
    while (read_word(f, word, sizeof word)) {
        if (strcmp(word, "test") != 0) {
            fprintf(stderr, "ring_check: malformed vector file: expected 'test', got '%s'\n", word);
            return 2;
        }
        if (run_vector(f)) passed++;
        else failed++;
    }
    fclose(f);
    if (passed + failed != count) {
        fprintf(stderr, "ring_check: the file announces %ld vectors but holds %ld\n", count, passed + failed);
        return 2;
    }
    printf("ring_check: %ld vectors passed, %ld failed\n", passed, failed);
    return failed ? 1 : 0;
}
