// gTop-k's tree all-reduce over the rounds' own sockets in one compiled call
// (gtopk/reducers/native/__init__.py loads it through ctypes; `make setup` builds it).
//
// The same schedule as gtopk.reducers.schedules' tree_reduce + tree_broadcast, the same wire
// bytes as gtopk.reducers.wire.SparseCodec (k indices, int32 or int64, then k float32 values),
// the same merge as gtopk.reducers.sparse._merge_np, bit for bit: the union of two ascending
// index lists, a + b at a shared index, the k largest |value| kept, ties to the smaller index.
// The caller's thread runs every round without returning to Python (ctypes releases the GIL).
//
// Waiting: a receive that finds no bytes retries for `spin_ns` (sched_yield between tries),
// then sleeps in poll(2); nothing moves for `timeout_s`: -1 (the peer in stats[ERR_PEER]).
// A closed peer: -2. A NaN in a merge: -3 (the NumPy merge cannot give k entries either).
// Other socket errors: -4 (errno in stats[ERR_NO]).
//
// Time: events and merge times are read from CLOCK_MONOTONIC (Python's perf_counter) over D,
// the time dilation; with D > 1 each reading first paces the CPU time spent since the previous
// one, as gtopk.host._pace does (its state passed in and out in `pace`).
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

enum Kind { ROUND = 0, POST_SEND = 1, POST_RECV = 2, SENT = 3, RECEIVED = 4, MERGED = 5 };
enum Stat { MSGS = 0, BYTES_SENT = 1, BYTES_RECV = 2, MERGE_S = 3, N_EVENTS = 4, ERR_PEER = 5, ERR_NO = 6, SPAN0 = 7, SPAN1 = 8 };
constexpr int N_STATS = 9;
enum Align { BEFORE = 1, AFTER = 2 };  // TreeArgs.align: the barriers of align_timing inside the call

double mono() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

double cpu_s() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

struct Ctx {
    const int* fds;
    int rank, P;
    int64_t k;
    int ibytes;
    double timeout_s;
    double spin_s;
    int dilation;
    double threads;
    double* pace;  // [last wall, last cpu per thread, credit, overrun]; pace[0] < 0: none yet
    double* stats;
    double* events;  // 4 per event: t, kind, a, b
    int64_t max_events;
    int64_t n_events = 0;

    double now() {  // virtual seconds, paced (gtopk.host.now)
        if (dilation == 1) return mono();
        double wall = mono(), cpu = cpu_s() / threads;
        if (pace[0] >= 0) {
            double debt = dilation * (cpu - pace[1]) - (wall - pace[0]);
            double owed = debt - pace[2];
            if (debt <= 0) {
                pace[2] = 0;
            } else if (owed <= pace[3]) {
                pace[2] = -owed;
            } else {
                double asked = owed - pace[3];
                timespec ts{static_cast<time_t>(asked), static_cast<long>((asked - (time_t)asked) * 1e9)};
                nanosleep(&ts, nullptr);
                double after = mono();
                pace[3] += 0.125 * (std::max(0.0, after - wall - asked) - pace[3]);
                pace[2] = (after - wall) - owed;
                wall = after;
            }
        }
        pace[0] = wall;
        pace[1] = cpu;
        return wall / dilation;
    }

    void event(int kind, int64_t a = 0, int64_t b = 0) {
        double t = now();
        if (events && n_events < max_events) {
            double* e = events + 4 * n_events++;
            e[0] = t, e[1] = kind, e[2] = static_cast<double>(a), e[3] = static_cast<double>(b);
        }
    }

    // Wait until fd is ready for `what` (POLLIN/POLLOUT); false with stats set on a timeout.
    bool wait(int peer, short what, double& idle_since) { return wait2(peer, what, -1, 0, idle_since); }

    // The same for two peers at once (peer b < 0 or what_b 0: one); a timeout names peer a.
    bool wait2(int a, short what_a, int b, short what_b, double& idle_since) {
        double t = mono();
        if (spin_s > 0 && t - idle_since < spin_s) {
            sched_yield();
            return true;
        }
        pollfd p[2] = {{a >= 0 ? fds[a] : -1, what_a, 0}, {b >= 0 ? fds[b] : -1, what_b, 0}};
        int np = (b >= 0 && what_b) ? 2 : 1;
        if (!what_a) p[0] = p[1], np = 1;
        double left = timeout_s - (t - idle_since);
        int ms = left <= 0 ? 0 : static_cast<int>(std::min(left * 1e3 + 1, 2e9));
        int got = poll(p, np, ms);
        if (got < 0 && errno != EINTR) return fail(a, -4);
        if (got == 0 && mono() - idle_since >= timeout_s) return fail(what_a ? a : b, -1);
        return true;
    }

    int code = 0;
    bool fail(int peer, int c) {
        code = c;
        stats[ERR_PEER] = peer;
        stats[ERR_NO] = errno;
        return false;
    }

    bool send(int peer, const uint8_t* buf, int64_t n) {
        event(POST_SEND, peer, n);
        int64_t done = 0;
        double idle = mono();
        while (done < n) {
            ssize_t w = ::send(fds[peer], buf + done, n - done, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (w > 0) {
                done += w;
                idle = mono();
            } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                if (!wait(peer, POLLOUT, idle)) return false;
            } else {
                return fail(peer, errno == EPIPE || errno == ECONNRESET ? -2 : -4);
            }
        }
        event(SENT, peer, n);
        stats[MSGS] += 1;
        stats[BYTES_SENT] += n;
        return true;
    }

    bool recv(int peer, uint8_t* buf, int64_t n) {
        int64_t done = 0;
        double idle = mono();
        while (done < n) {
            ssize_t r = ::recv(fds[peer], buf + done, n - done, MSG_DONTWAIT);
            if (r > 0) {
                done += r;
                idle = mono();
            } else if (r == 0) {
                return fail(peer, -2);
            } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                if (!wait(peer, POLLIN, idle)) return false;
            } else {
                return fail(peer, errno == ECONNRESET ? -2 : -4);
            }
        }
        event(RECEIVED, peer, n);
        stats[BYTES_RECV] += n;
        return true;
    }

    // Send n bytes to `peer` and receive m bytes from it at once (the peer does the same).
    bool exchange(int peer, const uint8_t* sbuf, int64_t n, uint8_t* rbuf, int64_t m) {
        event(POST_SEND, peer, n);
        if (!sendrecv(peer, sbuf, n, peer, rbuf, m)) return false;
        event(SENT, peer, n);
        event(RECEIVED, peer, m);
        stats[MSGS] += 1;
        stats[BYTES_SENT] += n;
        stats[BYTES_RECV] += m;
        return true;
    }

    // Send n bytes to `dst` while receiving m bytes from `src` (either may be nothing): both
    // directions move as the sockets allow, so that no rank blocks in a full buffer. Uncounted.
    bool sendrecv(int dst, const uint8_t* sbuf, int64_t n, int src, uint8_t* rbuf, int64_t m) {
        int64_t sent = 0, got = 0;
        double idle = mono();
        while (sent < n || got < m) {
            bool moved = false;
            if (sent < n) {
                ssize_t w = ::send(fds[dst], sbuf + sent, n - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
                if (w > 0) {
                    sent += w, moved = true;
                } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                    return fail(dst, errno == EPIPE || errno == ECONNRESET ? -2 : -4);
                }
            }
            if (got < m) {
                ssize_t r = ::recv(fds[src], rbuf + got, m - got, MSG_DONTWAIT);
                if (r > 0) {
                    got += r, moved = true;
                } else if (r == 0) {
                    return fail(src, -2);
                } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                    return fail(src, errno == ECONNRESET ? -2 : -4);
                }
            }
            if (moved) {
                idle = mono();
            } else if (!wait2(dst, sent < n ? POLLOUT : 0, src, got < m ? POLLIN : 0, idle)) {
                return false;
            }
        }
        return true;
    }

    // A dissemination barrier: in round s each rank sends one byte to rank + 2^s and reads one
    // from rank - 2^s (mod P). Neither its events nor its bytes count as the call's.
    bool barrier() {
        double* keep = events;
        double counts[3] = {stats[MSGS], stats[BYTES_SENT], stats[BYTES_RECV]};
        events = nullptr;
        uint8_t byte = 0;
        bool ok = true;
        for (int step = 1; ok && step < P; step <<= 1)
            ok = send((rank + step) % P, &byte, 1) && recv((rank - step + P) % P, &byte, 1);
        events = keep;
        stats[MSGS] = counts[0], stats[BYTES_SENT] = counts[1], stats[BYTES_RECV] = counts[2];
        return ok;
    }
};

// A sparse vector between rounds: ascending int64 indices, float32 values.
struct Sparse {
    std::vector<int64_t> idx;
    std::vector<float> val;
};

int64_t index_at(const uint8_t* msg, int ibytes, int64_t i) {
    if (ibytes == 4) {
        int32_t v;
        std::memcpy(&v, msg + 4 * i, 4);
        return v;
    }
    int64_t v;
    std::memcpy(&v, msg + 8 * i, 8);
    return v;
}

// own = merge(own, message of k entries); dropped entries appended to drop_i/drop_v (if given).
// False on a NaN.
bool merge(Sparse& own, const uint8_t* msg, int64_t k, int ibytes, std::vector<int64_t>& ui, std::vector<float>& uv,
           std::vector<float>& mag, std::vector<float>& part, int64_t* drop_i, float* drop_v, int64_t* n_drop) {
    const float* vb = reinterpret_cast<const float*>(msg + ibytes * k);  // 4-byte aligned: k * ibytes
    const int64_t na = own.idx.size(), nb = k;
    ui.clear();
    uv.clear();
    int64_t a = 0, b = 0;
    while (a < na || b < nb) {
        int64_t ib = b < nb ? index_at(msg, ibytes, b) : 0;
        if (b == nb || (a < na && own.idx[a] < ib)) {
            ui.push_back(own.idx[a]);
            uv.push_back(own.val[a++]);
        } else if (a == na || ib < own.idx[a]) {
            ui.push_back(ib);
            float v;
            std::memcpy(&v, vb + b++, 4);
            uv.push_back(v);
        } else {
            float v;
            std::memcpy(&v, vb + b++, 4);
            ui.push_back(own.idx[a]);
            uv.push_back(own.val[a++] + v);
        }
    }
    const int64_t n = ui.size();
    if (n_drop) *n_drop = 0;
    mag.resize(n);
    for (int64_t i = 0; i < n; ++i) {
        if (std::isnan(uv[i])) return false;
        mag[i] = std::fabs(uv[i]);
    }
    if (n <= k) {
        own.idx.assign(ui.begin(), ui.end());
        own.val.assign(uv.begin(), uv.end());
        return true;
    }
    part.assign(mag.begin(), mag.end());
    std::nth_element(part.begin(), part.begin() + (n - k), part.end());
    const float thr = part[n - k];  // the k-th largest |value|
    int64_t above = 0;
    for (int64_t i = 0; i < n; ++i) above += mag[i] > thr;
    int64_t ties = k - above;  // of |value| == thr, the first (smaller index) are kept
    own.idx.clear();
    own.val.clear();
    int64_t d = 0;
    for (int64_t i = 0; i < n; ++i) {
        if (mag[i] > thr || (mag[i] == thr && ties-- > 0)) {
            own.idx.push_back(ui[i]);
            own.val.push_back(uv[i]);
        } else if (drop_i) {
            drop_i[d] = ui[i];
            drop_v[d++] = uv[i];
        }
    }
    if (n_drop) *n_drop = d;
    return true;
}

void encode(const Sparse& s, int ibytes, bool with_values, std::vector<uint8_t>& out) {
    const int64_t k = s.idx.size();
    out.resize(k * ibytes + (with_values ? 4 * k : 0));
    for (int64_t i = 0; i < k; ++i) {
        if (ibytes == 4) {
            int32_t v = static_cast<int32_t>(s.idx[i]);
            std::memcpy(out.data() + 4 * i, &v, 4);
        } else {
            std::memcpy(out.data() + 8 * i, &s.idx[i], 8);
        }
    }
    if (with_values) std::memcpy(out.data() + k * ibytes, s.val.data(), 4 * k);
}

}  // namespace

extern "C" {
// One rank's part of gTop-k's tree all-reduce (collective: every rank of the sockets' group
// calls it), its arguments in one struct (one pointer to pass through ctypes). fds[p]: the connected socket to rank p (fds[rank] unused). in_*: this rank's k
// entries, ascending indices. with_values: 1 broadcast indices and values (the paper's
// put-back), 0 indices only (the exact put-back; out_v untouched). out_*: the final k entries.
// drop_* ([ceil(log2 P)][2k], n_drop [ceil(log2 P)], or null): what each merge of this rank
// dropped. stats [N_STATS]: see Stat. events: [max_events][4] or null. align: Align's bits, the
// barriers of align_timing run in the call (BEFORE: stats[SPAN0] is read as every rank leaves
// it; AFTER: stats[SPAN1], the end of the last round, is read before it). Returns 0 or a
// failure code.
struct TreeArgs {
    const int* fds;
    int64_t rank, P, k, ibytes;
    const int64_t* in_i;
    const float* in_v;
    int64_t with_values;
    int64_t* out_i;
    float* out_v;
    int64_t* drop_i;
    float* drop_v;
    int64_t* n_drop;
    double timeout_s, spin_s;
    int64_t dilation;
    double threads;
    double* pace;
    double* stats;
    double* events;
    int64_t max_events;
    int64_t align;
};

int gtopk_tree_allreduce(const TreeArgs* x) {
    const int* fds = x->fds;
    const int rank = static_cast<int>(x->rank), P = static_cast<int>(x->P), ibytes = static_cast<int>(x->ibytes);
    const int64_t k = x->k;
    const int64_t *in_i = x->in_i;
    const float* in_v = x->in_v;
    const bool with_values = x->with_values != 0;
    int64_t *out_i = x->out_i, *drop_i = x->drop_i, *n_drop = x->n_drop;
    float *out_v = x->out_v, *drop_v = x->drop_v;
    double* stats = x->stats;
    Ctx c{fds, rank, P, k, ibytes, x->timeout_s, x->spin_s, static_cast<int>(x->dilation), x->threads, x->pace,
          stats, x->events, x->max_events};
    std::memset(stats, 0, N_STATS * sizeof(double));
    if ((x->align & BEFORE) && !c.barrier()) return c.code;
    stats[SPAN0] = c.now();
    int rounds = 0;
    while ((1 << rounds) < P) ++rounds;
    const int64_t nbytes = k * ibytes + 4 * k;
    Sparse item{std::vector<int64_t>(in_i, in_i + k), std::vector<float>(in_v, in_v + k)};
    std::vector<int64_t> ui;
    std::vector<float> uv, mag, part;
    std::vector<uint8_t> wire(nbytes), msg;
    ui.reserve(2 * k), uv.reserve(2 * k), mag.reserve(2 * k), part.reserve(2 * k);
    bool root = true;
    int merges = 0;
    int first_child = -1;  // posted at the start, the next one after each arrival (as tree_reduce)
    for (int r = 0; r < rounds; ++r)
        if (rank % (2 << r) == 0 && rank + (1 << r) < P) {
            first_child = rank + (1 << r);
            break;
        }
    if (first_child >= 0) c.event(POST_RECV, first_child, nbytes);
    for (int r = 0; r < rounds && root; ++r) {
        const int step = 1 << r;
        if (rank % (2 * step) == step) {
            c.event(ROUND, r);
            encode(item, ibytes, true, msg);
            if (!c.send(rank - step, msg.data(), nbytes)) return c.code;
            root = false;
        } else if (rank % (2 * step) == 0 && rank + step < P) {
            c.event(ROUND, r);
            if (!c.recv(rank + step, wire.data(), nbytes)) return c.code;
            for (int q = r + 1; q < rounds; ++q)
                if (rank % (2 << q) == 0 && rank + (1 << q) < P) {
                    c.event(POST_RECV, rank + (1 << q), nbytes);
                    break;
                }
            double t0 = c.now();
            bool ok = merge(item, wire.data(), k, ibytes, ui, uv, mag, part, drop_i ? drop_i + merges * 2 * k : nullptr,
                            drop_v ? drop_v + merges * 2 * k : nullptr, n_drop ? n_drop + merges : nullptr);
            if (!ok) return c.fail(rank + step, -3), c.code;
            ++merges;
            c.event(MERGED);
            stats[MERGE_S] += c.now() - t0;
        }
    }
    // the broadcast of the root's k entries (or indices) along the same tree, reversed
    const int64_t bbytes = k * ibytes + (with_values ? 4 * k : 0);
    if (rank == 0) encode(item, ibytes, with_values, msg);
    const int parent = rank - (rank & -rank);
    if (rank) c.event(POST_RECV, parent, bbytes);
    msg.resize(bbytes);
    for (int r = rounds - 1; r >= 0; --r) {
        const int step = 1 << r;
        if (rank % (2 * step) == 0) {
            if (rank + step < P) {
                c.event(ROUND, r);
                if (!c.send(rank + step, msg.data(), bbytes)) return c.code;
            }
        } else if (rank % (2 * step) == step) {
            c.event(ROUND, r);
            if (!c.recv(parent, msg.data(), bbytes)) return c.code;
        }
    }
    for (int64_t i = 0; i < k; ++i) out_i[i] = index_at(msg.data(), ibytes, i);
    if (with_values) std::memcpy(out_v, msg.data() + k * ibytes, 4 * k);
    stats[N_EVENTS] = static_cast<double>(c.n_events);
    stats[SPAN1] = c.now();
    if ((x->align & AFTER) && !c.barrier()) return c.code;
    return 0;
}

// gTop-k's recursive-doubling all-reduce (collective), as gtopk.reducers.schedules'
// recursive_doubling with the gTop-k merge, bit for bit: rank i >= P2 (the largest power of two
// <= P) sends its k entries to i - P2 and gets the result back (indices and values, or indices
// only where with_values is 0); below P2, the fold, then an exchange with i XOR 2^s for each s,
// each followed by a merge. Arguments as gtopk_tree_allreduce's (drops: one row per merge).
int gtopk_rd_allreduce(const TreeArgs* x) {
    const int rank = static_cast<int>(x->rank), P = static_cast<int>(x->P), ibytes = static_cast<int>(x->ibytes);
    const int64_t k = x->k;
    const bool with_values = x->with_values != 0;
    double* stats = x->stats;
    Ctx c{x->fds, rank, P, k, ibytes, x->timeout_s, x->spin_s, static_cast<int>(x->dilation), x->threads, x->pace,
          stats, x->events, x->max_events};
    std::memset(stats, 0, N_STATS * sizeof(double));
    if ((x->align & BEFORE) && !c.barrier()) return c.code;
    stats[SPAN0] = c.now();
    int P2 = 1, steps = 0;
    while (2 * P2 <= P) P2 *= 2, ++steps;
    const int64_t nbytes = k * ibytes + 4 * k, bbytes = k * ibytes + (with_values ? 4 * k : 0);
    Sparse item{std::vector<int64_t>(x->in_i, x->in_i + k), std::vector<float>(x->in_v, x->in_v + k)};
    std::vector<int64_t> ui;
    std::vector<float> uv, mag, part;
    std::vector<uint8_t> wire(nbytes), msg;
    ui.reserve(2 * k), uv.reserve(2 * k), mag.reserve(2 * k), part.reserve(2 * k);
    int merges = 0;
    auto merged = [&](int peer) {  // item = merge(item, wire), timed, its drops kept
        double t0 = c.now();
        int64_t* di = x->drop_i ? x->drop_i + merges * 2 * k : nullptr;
        float* dv = x->drop_v ? x->drop_v + merges * 2 * k : nullptr;
        if (!merge(item, wire.data(), k, ibytes, ui, uv, mag, part, di, dv, x->n_drop ? x->n_drop + merges : nullptr))
            return c.fail(peer, -3);
        ++merges;
        c.event(MERGED);
        stats[MERGE_S] += c.now() - t0;
        return true;
    };
    if (rank >= P2) {
        c.event(POST_RECV, rank - P2, bbytes);
        c.event(ROUND, 0);
        encode(item, ibytes, true, msg);
        if (!c.send(rank - P2, msg.data(), nbytes)) return c.code;
        c.event(ROUND, steps + 1);
        msg.resize(bbytes);
        if (!c.recv(rank - P2, msg.data(), bbytes)) return c.code;
        for (int64_t i = 0; i < k; ++i) x->out_i[i] = index_at(msg.data(), ibytes, i);
        if (with_values) std::memcpy(x->out_v, msg.data() + k * ibytes, 4 * k);
    } else {
        const bool fold = rank + P2 < P;
        if (fold) c.event(POST_RECV, rank + P2, nbytes);
        for (int s = 0; s < steps; ++s) c.event(POST_RECV, rank ^ (1 << s), nbytes);
        if (fold) {
            c.event(ROUND, 0);
            if (!c.recv(rank + P2, wire.data(), nbytes) || !merged(rank + P2)) return c.code;
        }
        for (int s = 0; s < steps; ++s) {
            const int peer = rank ^ (1 << s);
            c.event(ROUND, 1 + s);
            encode(item, ibytes, true, msg);
            if (!c.exchange(peer, msg.data(), nbytes, wire.data(), nbytes) || !merged(peer)) return c.code;
        }
        if (fold) {
            c.event(ROUND, steps + 1);
            encode(item, ibytes, with_values, msg);
            if (!c.send(rank + P2, msg.data(), bbytes)) return c.code;
        }
        std::copy(item.idx.begin(), item.idx.end(), x->out_i);
        if (with_values) std::copy(item.val.begin(), item.val.end(), x->out_v);
    }
    stats[N_EVENTS] = static_cast<double>(c.n_events);
    stats[SPAN1] = c.now();
    if ((x->align & AFTER) && !c.barrier()) return c.code;
    return 0;
}

// The exact put-back's sum (collective): recursive doubling with folding over the same
// connections, as gtopk.reducers.schedules.recursive_doubling with a + b, bit for bit: rank i >=
// P2 (the largest power of two <= P) sends its k values to i - P2 and gets the sum back; below
// P2, the fold, then an exchange with i XOR 2^s for each s. in_v: this rank's k float32 values;
// out_v: the sums. The rest of TreeArgs as gtopk_tree_allreduce's (align: AFTER only).
int gtopk_rd_sum(const TreeArgs* x) {
    const int rank = static_cast<int>(x->rank), P = static_cast<int>(x->P);
    const int64_t k = x->k, n = 4 * k;
    double* stats = x->stats;
    Ctx c{x->fds, rank, P, k, 4, x->timeout_s, x->spin_s, static_cast<int>(x->dilation), x->threads, x->pace,
          stats, x->events, x->max_events};
    std::memset(stats, 0, N_STATS * sizeof(double));
    stats[SPAN0] = c.now();
    int P2 = 1, steps = 0;
    while (2 * P2 <= P) P2 *= 2, ++steps;
    std::vector<float> item(x->in_v, x->in_v + k), theirs(k);
    auto bytes = [](std::vector<float>& v) { return reinterpret_cast<uint8_t*>(v.data()); };
    auto add = [&]() {
        for (int64_t i = 0; i < k; ++i) item[i] = item[i] + theirs[i];
        c.event(MERGED);
    };
    if (rank >= P2) {
        c.event(POST_RECV, rank - P2, n);
        c.event(ROUND, 0);
        if (!c.send(rank - P2, bytes(item), n)) return c.code;
        c.event(ROUND, steps + 1);
        if (!c.recv(rank - P2, bytes(item), n)) return c.code;
    } else {
        const bool fold = rank + P2 < P;
        if (fold) c.event(POST_RECV, rank + P2, n);
        for (int s = 0; s < steps; ++s) c.event(POST_RECV, rank ^ (1 << s), n);
        if (fold) {
            c.event(ROUND, 0);
            if (!c.recv(rank + P2, bytes(theirs), n)) return c.code;
            add();
        }
        for (int s = 0; s < steps; ++s) {
            c.event(ROUND, 1 + s);
            if (!c.exchange(rank ^ (1 << s), bytes(item), n, bytes(theirs), n)) return c.code;
            add();
        }
        if (fold) {
            c.event(ROUND, steps + 1);
            if (!c.send(rank + P2, bytes(item), n)) return c.code;
        }
    }
    std::memcpy(x->out_v, item.data(), n);
    stats[N_EVENTS] = static_cast<double>(c.n_events);
    stats[SPAN1] = c.now();
    if ((x->align & AFTER) && !c.barrier()) return c.code;
    return 0;
}

// Steps of point-to-point transfers on the rounds' connections (collective in pairs: what
// rank r sends to d in a step, d receives from r in its matching step), for Ok-Topk's rotations:
// step i sends slen[i] bytes (from sbuf, one after another) to dst[i] and receives rlen[i] bytes
// (into rbuf, likewise) from src[i], both at once; a length of 0 moves nothing. Each step's
// start paces the CPU time before it (dilation > 1; the state in `pace`, as in TreeArgs).
struct StepArgs {
    const int* fds;
    int64_t rank, P, n;
    const int64_t *dst, *slen, *src, *rlen;
    const uint8_t* sbuf;
    uint8_t* rbuf;
    double timeout_s, spin_s;
    int64_t dilation;
    double threads;
    double* pace;
    double* stats;
};

int gtopk_steps(const StepArgs* x) {
    Ctx c{x->fds, static_cast<int>(x->rank), static_cast<int>(x->P), 0, 4, x->timeout_s, x->spin_s,
          static_cast<int>(x->dilation), x->threads, x->pace, x->stats, nullptr, 0};
    std::memset(x->stats, 0, N_STATS * sizeof(double));
    const uint8_t* s = x->sbuf;
    uint8_t* r = x->rbuf;
    for (int64_t i = 0; i < x->n; ++i) {
        c.now();
        int dst = static_cast<int>(x->dst[i]), src = static_cast<int>(x->src[i]);
        if (!c.sendrecv(dst, s, x->slen[i], src, r, x->rlen[i])) return c.code;
        s += x->slen[i], r += x->rlen[i];
    }
    c.now();
    return 0;
}

// The dissemination barrier alone (collective; Ctx::barrier). Returns 0 or a failure code.
int gtopk_barrier(const int* fds, int rank, int P, double timeout_s, double spin_s, double* stats) {
    double pace[4] = {-1, 0, 0, 0};
    Ctx c{fds, rank, P, 0, 4, timeout_s, spin_s, 1, 1, pace, stats, nullptr, 0};
    std::memset(stats, 0, N_STATS * sizeof(double));
    return c.barrier() ? 0 : c.code;
}
}
