/*
 * Ring all-reduce as N asynchronous workers: a Promela model for SPIN.
 *
 * Explained in spec/async_and_proofs.md, clauses `async-ring-model`,
 * `buffered-links` and `model-check-bound`; run by tools/model_check.py
 * (`make model-check`) and tests/test_spin.py.
 *
 * Each worker runs the spec's schedule on its own, with no global round
 * barrier: per round it sends one chunk slot to its right neighbour and
 * receives one from its left neighbour.  Worker w talks to its right
 * neighbour over link[w], a FIFO channel of CAP slots (CAP = 0 is a
 * rendezvous).  A slot holds provenance only: bit w set means worker w's
 * contribution is in it.  Values are not modelled; the Python reference
 * checks them.
 *
 * Configuration, with cpp -D flags (spin -DN=5 -DCAP=0 ...):
 *   N               number of workers, 2 .. 15 (bits fit a byte up to 8,
 *                   a short up to 15)
 *   CAP             slots per link (default 1)
 *   ALTERNATE       odd workers receive before they send (default: every
 *                   worker sends first)
 *   DIR, OFF        the ring of the schedule family (spec/schedules.md):
 *                   worker w sends to w + DIR (DIR = 1 or -1, default 1)
 *                   and chunk c's fold starts at worker c + OFF (default
 *                   0, |OFF| < N); the defaults are the spec's ring.  The
 *                   chunk layout does not change which chunk moves when.
 * Planted faults (each one must make SPIN report an error):
 *   FAULT_AG_ADD    all-gather adds the incoming slot instead of copying it
 *   FAULT_FORWARD   worker 0 receives first and forwards the slot it has just
 *                   received, instead of the slot the schedule names
 *   UNCHECKED_INDEX drop the received-chunk-index assertion, to show that
 *                   the provenance assertions catch FAULT_FORWARD on their own
 *
 * Every send and receive is printed, so that a random simulation
 * (spin -n<seed>) can be checked against ring_ref.schedule:
 *   SEND phase=<0 rs|1 ag> round=<r> src=<w> chunk=<c>
 *   RECV phase=<0 rs|1 ag> round=<r> dst=<w> src=<left> chunk=<c>
 */

#ifndef N
#define N 4
#endif
#ifndef CAP
#define CAP 1
#endif

/* provenance bits of one slot; short is signed 16-bit, so N <= 15 */
#if N > 8
#define SLOT short
#else
#define SLOT byte
#endif

#define FULL ((1 << N) - 1)
#define RS 0
#define AG 1

#ifndef DIR
#define DIR 1
#endif
#ifndef OFF
#define OFF 0
#endif
/* a multiple of N that keeps every sum below non-negative before % N */
#define WRAP (4 * N * N)

#define RIGHT(w) (((w) + N + (DIR)) % N)
#define LEFT(w) (((w) + N - (DIR)) % N)
/* rs-send-chunk: (w - r) mod N; ag-send-chunk: (w + 1 - r) mod N; for the family
   (schedule-family): w - OFF - r DIR, and the chunk owned by w - r DIR */
#define RS_SEND(w, r) (((w) + WRAP - (OFF) - (r) * (DIR)) % N)
/* rs-owned-chunk: w + 1; for the family w - OFF - (N - 1) DIR */
#define OWNED(w) (((w) + WRAP - (OFF) - (N - 1) * (DIR)) % N)
#define AG_SEND(w, r) OWNED(((w) + WRAP - (r) * (DIR)) % N)
#define SEND_CHUNK(ph, w, r) ((ph) == RS -> RS_SEND(w, r) : AG_SEND(w, r))

chan link[N] = [CAP] of { byte, SLOT };  /* chunk index, provenance bits */

/* Reduce-scatter addition: the two operands must hold disjoint sets of
   contributions, so no contribution is ever counted twice. */
inline join(c, bits) {
    assert((slot[c] & bits) == 0);
    slot[c] = slot[c] | bits
}

inline send_scheduled() {
    atomic {
        link[_pid] ! SEND_CHUNK(ph, _pid, r), slot[SEND_CHUNK(ph, _pid, r)];
        printf("SEND phase=%d round=%d src=%d chunk=%d\n", ph, r, _pid, SEND_CHUNK(ph, _pid, r))
    }
}

/* Leaves got and bits set (FAULT_FORWARD reads them); callers clear them with forget(). */
inline receive() {
    atomic {
        link[LEFT(_pid)] ? got, bits;
        printf("RECV phase=%d round=%d dst=%d src=%d chunk=%d\n", ph, r, _pid, LEFT(_pid), got);
#ifndef UNCHECKED_INDEX
        /* the chunk index received is the one the left neighbour must send */
        assert(got == SEND_CHUNK(ph, LEFT(_pid), r));
#endif
        if
        :: ph == RS -> join(got, bits)
#ifdef FAULT_AG_ADD
        :: ph == AG -> join(got, bits)
#else
        :: ph == AG -> slot[got] = bits   /* ag-copy-not-add */
#endif
        fi
    }
}

inline forget() {
    got = 0;
    bits = 0
}

active [N] proctype Worker() {
    SLOT slot[N];   /* slot[c]: provenance of this worker's chunk c */
    byte ph = RS;
    byte r = 0;
    byte got = 0;
    SLOT bits = 0;
    byte c = 0;

    d_step {
        for (c : 0 .. N - 1) {
            slot[c] = 1 << _pid
        }
        c = 0
    }

    do
    :: r < N - 1 ->
#ifdef FAULT_FORWARD
        if
        :: _pid == 0 ->
            receive();
            atomic {
                link[_pid] ! got, slot[got];
                printf("SEND phase=%d round=%d src=%d chunk=%d\n", ph, r, _pid, got);
                forget()
            }
        :: else ->
            send_scheduled();
            atomic { receive(); forget() }
        fi;
#else
#ifdef ALTERNATE
        if
        :: _pid % 2 == 1 ->
            atomic { receive(); forget() };
            send_scheduled()
        :: else ->
            send_scheduled();
            atomic { receive(); forget() }
        fi;
#else
        send_scheduled();
        atomic { receive(); forget() };
#endif
#endif
        r++
    :: r == N - 1 && ph == RS ->
        /* rs-owned-chunk: the owned chunk, and only it, is complete */
        d_step {
            for (c : 0 .. N - 1) {
                assert((c == OWNED(_pid)) == (slot[c] == FULL))
            }
            c = 0;
            ph = AG;
            r = 0
        }
    :: r == N - 1 && ph == AG ->
        /* ag-complete: this worker ends holding every chunk complete */
        d_step {
            for (c : 0 .. N - 1) {
                assert(slot[c] == FULL)
            }
            c = 0
        };
        break
    od
}
