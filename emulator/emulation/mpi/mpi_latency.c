/*
 * The emulated fabric's message latency for an MPI program's TCP messages (emu mpirun, LD_PRELOAD).
 *
 * There is no netem on the kernels this emulator runs on, so the latency cannot be put on the links. This
 * library puts it where the data is handed to the program instead: bytes that reached the receiving host at
 * time t (the kernel's receive timestamp, SO_TIMESTAMPNS) are handed to the program no earlier than
 * t + hold + byte_seconds * frame, with hold and byte_seconds taken per (receiving address, sending address)
 * from the file named by EF_LATENCY_FILE (lines "RECEIVER_IP SENDER_IP SECONDS BYTE_SECONDS", written by
 * emulator/runs/mpi_plan.py) and frame the bytes of the segment they came in. The emulated links release a
 * frame at the start of its time on the wire, not at its end, so a frame reaches the receiver its
 * serialisation on every link of the path (byte_seconds per byte) earlier than on a real link of that rate:
 * the second term gives it back, as the agents do for a message's last frame. Bytes the kernel dated with one
 * time are taken as one segment, but never as more than one frame (the connection's MSS): the kernel dates
 * frames it handled together with one time (a busy host's receive path merges them; a read that spans several
 * queued segments reports the last one's time), and charging such a batch as one long frame held its bytes
 * the serialisation of the whole batch, tens of milliseconds late.
 *
 * Only TCP sockets with a local or peer port in EF_LATENCY_PORTS ("MIN MAX", Open MPI's TCP BTL ports) are
 * held; everything else passes straight through. read(), readv(), recv() and poll() are interposed: Open
 * MPI's TCP transport reads with readv() and recv() and waits in poll() (its event library's backend here);
 * a program that read a held socket with recvmsg() or waited in epoll would see its bytes without the hold.
 *
 * What keeps it faithful:
 *  - it never sleeps on a non-blocking socket: a read of bytes not yet due fails with EAGAIN, and poll()
 *    does not report the socket readable before they are due (Open MPI's event loop uses poll), so one
 *    thread serving every socket is never stalled by one of them;
 *  - it reads what arrives at once (whenever the program polls or reads), in chunks of CHUNK_BYTES each
 *    dated by its arrival, into a queue of EF_LATENCY_QUEUE_BYTES per socket: the kernel's buffer stays
 *    empty, so it acknowledges and opens its window as the link delivers (bytes left there would hold back
 *    its acknowledgements, and the sender with them). The queue is bounded: when it is full the kernel's
 *    buffer fills and TCP's flow control applies (a queue that took every byte would let a sender run ahead);
 *  - a chunk's timestamp is its last segment's arrival, so the first byte of a chunk is held at most
 *    CHUNK_BYTES at the link's rate too long.
 *
 * Locking: a held socket's queue has its own mutex; sockets that pass through take no lock at all (Open MPI's
 * main thread polls its own sockets in a tight loop beside the progress thread that reads the held ones).
 *
 * What it does not model: the kernel acknowledges bytes when they arrive, not when they are handed over, so
 * TCP's round trip stays the machine's own (a real fabric's latency is in the round trip too).
 *
 * It also makes sched_yield() sleep EF_YIELD_SLEEP_US microseconds when that is set (and above 0). Open MPI's
 * main thread, told to yield while it waits (mpi_yield_when_idle), calls sched_yield() in its progress loop;
 * with every rank on this machine's few cores those loops took the cores from the progress threads and the
 * datapath that had bytes to move, and ranks fell out of step. A short sleep leaves the cores to them; it
 * delays a rank's noticing a finished request by at most the sleep (plus the kernel's timer slack). Without
 * EF_LATENCY_FILE nothing is held and the library does only this (emu mpirun --latency off).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define CHUNK_BYTES 4096
#define MAX_FDS 65536

struct chunk {
    size_t len, off;
    double due; /* CLOCK_REALTIME seconds, the clock of the kernel's receive timestamps */
    char buf[CHUNK_BYTES];
};

struct held {
    int passes;   /* 1: the shared marker of sockets and files that pass through */
    ino_t ino;    /* the socket's: an fd number closed some way this library does not see is classified again */
    double hold_s, byte_s;
    size_t frame_max; /* the most bytes one frame carries on this connection (its MSS) */
    pthread_mutex_t mu; /* guards what follows */
    struct chunk **ring; /* the chunks read from the kernel and not yet handed over, oldest at head */
    size_t slots, head, count;
    int eof, error; /* the kernel said so after the queued chunks */
};

struct pair {
    in_addr_t receiver, sender;
    double seconds, byte_seconds;
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t classify_lock = PTHREAD_MUTEX_INITIALIZER;
/* NULL: not classified yet; &passing; or a held socket's state. A held state is never freed: a thread may
 * still be reading it when another closes its fd (a few kilobytes per closed connection). */
static _Atomic(struct held *) table[MAX_FDS];
static struct held passing = {.passes = 1};
static struct pair *pairs;
static size_t npairs;
static unsigned port_min = 1, port_max = 0;
static size_t queue_slots = 64;

static ssize_t (*real_read)(int, void *, size_t);
static ssize_t (*real_readv)(int, const struct iovec *, int);
static ssize_t (*real_recv)(int, void *, size_t, int);
static int (*real_close)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);
static int (*real_poll)(struct pollfd *, nfds_t, int);
static int (*real_sched_yield)(void);
static long yield_sleep_us; /* 0: sched_yield() yields */

static void load(void) {
    real_read = dlsym(RTLD_NEXT, "read");
    real_readv = dlsym(RTLD_NEXT, "readv");
    real_recv = dlsym(RTLD_NEXT, "recv");
    real_close = dlsym(RTLD_NEXT, "close");
    real_dup2 = dlsym(RTLD_NEXT, "dup2");
    real_dup3 = dlsym(RTLD_NEXT, "dup3");
    real_poll = dlsym(RTLD_NEXT, "poll");
    real_sched_yield = dlsym(RTLD_NEXT, "sched_yield");
    const char *sleep_us = getenv("EF_YIELD_SLEEP_US");
    if (sleep_us == NULL || sscanf(sleep_us, "%ld", &yield_sleep_us) != 1 || yield_sleep_us < 0) yield_sleep_us = 0;
    const char *ports = getenv("EF_LATENCY_PORTS");
    if (ports == NULL || sscanf(ports, "%u %u", &port_min, &port_max) != 2) {
        port_min = 1, port_max = 0; /* no port is ours: everything passes */
    }
    const char *queue = getenv("EF_LATENCY_QUEUE_BYTES");
    unsigned long bytes;
    if (queue != NULL && sscanf(queue, "%lu", &bytes) == 1) queue_slots = bytes / CHUNK_BYTES + 1;
    const char *path = getenv("EF_LATENCY_FILE");
    FILE *fh = path ? fopen(path, "re") : NULL;
    if (fh == NULL) {
        if (path) fprintf(stderr, "ef-mpi-latency: cannot read %s: %s; no latency added\n", path, strerror(errno));
        return;
    }
    char receiver[64], sender[64];
    double seconds, byte_seconds;
    size_t cap = 0;
    while (fscanf(fh, "%63s %63s %lf %lf", receiver, sender, &seconds, &byte_seconds) == 4) {
        if (npairs == cap) {
            cap = cap ? 2 * cap : 256;
            struct pair *grown = realloc(pairs, cap * sizeof *pairs);
            if (grown == NULL) break;
            pairs = grown;
        }
        struct pair p = {inet_addr(receiver), inet_addr(sender), seconds, byte_seconds};
        pairs[npairs++] = p;
    }
    fclose(fh);
}

static void init(void) { pthread_once(&once, load); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static struct timespec span(double seconds) {
    if (seconds < 0) seconds = 0;
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    return ts;
}

static int ours(unsigned port) { return port >= port_min && port <= port_max; }

/* The index in ``pairs`` of this connected TCP socket's hold, or -1 when it passes through; -2 when it is not
 * connected yet (ask again later). */
static long hold_of(int fd) {
    struct sockaddr_in local, peer;
    socklen_t llen = sizeof local, plen = sizeof peer;
    int type = 0;
    socklen_t tlen = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 || type != SOCK_STREAM ||
        getsockname(fd, (struct sockaddr *)&local, &llen) != 0 || local.sin_family != AF_INET)
        return -1;
    if (getpeername(fd, (struct sockaddr *)&peer, &plen) != 0) return -2;
    if (!ours(ntohs(local.sin_port)) && !ours(ntohs(peer.sin_port))) return -1;
    for (size_t i = 0; i < npairs; i++)
        if (pairs[i].receiver == local.sin_addr.s_addr && pairs[i].sender == peer.sin_addr.s_addr)
            return (long)i;
    return -1;
}

static struct held *classify(int fd, const struct stat *sb) {
    pthread_mutex_lock(&classify_lock);
    struct held *st = atomic_load(&table[fd]);
    if (st == NULL) {
        long hold = S_ISSOCK(sb->st_mode) ? hold_of(fd) : -1;
        if (hold == -2) {
            pthread_mutex_unlock(&classify_lock);
            return NULL;
        }
        st = hold < 0 ? NULL : calloc(1, sizeof *st);
        if (st != NULL && (st->ring = calloc(queue_slots, sizeof *st->ring)) == NULL) {
            free(st);
            st = NULL;
        }
        if (st == NULL) {
            st = &passing;
        } else {
            int on = 1;
            setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on);
            st->ino = sb->st_ino, st->slots = queue_slots;
            st->hold_s = pairs[hold].seconds, st->byte_s = pairs[hold].byte_seconds;
            int mss = 0;
            socklen_t mlen = sizeof mss;
            st->frame_max = getsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, &mlen) == 0 && mss > 0 ? (size_t)mss : SIZE_MAX;
            pthread_mutex_init(&st->mu, NULL);
        }
        atomic_store(&table[fd], st);
    }
    pthread_mutex_unlock(&classify_lock);
    return st->passes ? NULL : st;
}

/* The held socket's state, NULL when the fd passes through. With ``verify`` (the read paths) the fd is
 * checked to be what it was classified as; poll() trusts the table. */
static struct held *state_of(int fd, int verify) {
    if (fd < 0 || fd >= MAX_FDS) return NULL;
    struct held *st = atomic_load(&table[fd]);
    if (st != NULL && !verify) return st->passes ? NULL : st;
    struct stat sb;
    if (fstat(fd, &sb) != 0) return NULL;
    if (st != NULL) {
        int same = st->passes ? !S_ISSOCK(sb.st_mode) || hold_of(fd) == -1 : S_ISSOCK(sb.st_mode) && sb.st_ino == st->ino;
        if (same) return st->passes ? NULL : st;
        atomic_compare_exchange_strong(&table[fd], &st, NULL);
    }
    return classify(fd, &sb);
}

static void forget(int fd) {
    if (fd >= 0 && fd < MAX_FDS) atomic_store(&table[fd], NULL);
}

/* Read what the kernel has for ``fd`` into st's queue, chunk by chunk, each dated by its arrival, while there
 * is room; never blocks. Reading at once keeps the kernel's buffer empty, so it acknowledges and advertises
 * its window as the link delivers (bytes left in it would hold back its acknowledgements), and dates each
 * chunk by its own arrival. Consecutive chunks with one timestamp came in one segment: they are all due its
 * serialisation (byte_s per byte of it, at most a frame's) after the hold. Called with st->mu held. */
static void drain(int fd, struct held *st) {
    double frame_stamp = -1;
    size_t frame_bytes = 0, frame_chunks = 0;
    while (!st->eof && !st->error && st->count < st->slots) {
        struct chunk *c = malloc(sizeof *c);
        if (c == NULL) return;
        char control[CMSG_SPACE(sizeof(struct timespec))];
        struct iovec iov = {c->buf, CHUNK_BYTES};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                             .msg_controllen = sizeof control};
        ssize_t n = recvmsg(fd, &msg, MSG_DONTWAIT);
        if (n <= 0) {
            if (n == 0) st->eof = 1;
            else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) st->error = errno;
            free(c);
            return;
        }
        double arrived = 0;
        for (struct cmsghdr *m = CMSG_FIRSTHDR(&msg); m != NULL; m = CMSG_NXTHDR(&msg, m))
            if (m->cmsg_level == SOL_SOCKET && m->cmsg_type == SCM_TIMESTAMPNS) {
                struct timespec ts;
                memcpy(&ts, CMSG_DATA(m), sizeof ts);
                arrived = ts.tv_sec + ts.tv_nsec * 1e-9;
            }
        if (arrived <= 0) arrived = now_s(); /* no stamp: the bytes arrived before the option was on */
        if (arrived != frame_stamp) frame_stamp = arrived, frame_bytes = 0, frame_chunks = 0;
        frame_bytes += (size_t)n, frame_chunks++;
        c->len = (size_t)n, c->off = 0;
        st->ring[(st->head + st->count++) % st->slots] = c;
        size_t frame = frame_bytes < st->frame_max ? frame_bytes : st->frame_max;
        double due = arrived + st->hold_s + st->byte_s * (double)frame;
        for (size_t k = 1; k <= frame_chunks; k++) st->ring[(st->head + st->count - k) % st->slots]->due = due;
    }
}

/* 1 when a read would not wait: the oldest chunk is due, or nothing is queued and the kernel said the stream
 * ended or failed. ``due`` gets the oldest chunk's due time, -1 with none. Called with st->mu held. */
static int answerable(const struct held *st, double now, double *due) {
    *due = st->count ? st->ring[st->head]->due : -1;
    return st->count ? *due <= now : st->eof || st->error;
}

/* Copy n bytes from src into the iovec, starting ``at`` bytes into it. */
static void copy_out(const struct iovec *iov, int iovcnt, size_t at, const char *src, size_t n) {
    for (int i = 0; i < iovcnt && n > 0; i++) {
        if (at >= iov[i].iov_len) {
            at -= iov[i].iov_len;
            continue;
        }
        size_t take = iov[i].iov_len - at < n ? iov[i].iov_len - at : n;
        memcpy((char *)iov[i].iov_base + at, src, take);
        src += take, n -= take, at = 0;
    }
}

/* Hand over up to the iovec's room of due bytes, oldest first (with ``peek``, leave them queued). Nothing
 * due: -1/EAGAIN on a non-blocking read; a blocking one waits, as the kernel would. */
static ssize_t held_readv(int fd, struct held *st, const struct iovec *iov, int iovcnt, int peek, int dontwait) {
    int blocking = !dontwait && !(fcntl(fd, F_GETFL) & O_NONBLOCK);
    pthread_mutex_lock(&st->mu);
    double due;
    for (drain(fd, st); !answerable(st, now_s(), &due); drain(fd, st)) {
        pthread_mutex_unlock(&st->mu);
        if (!blocking) {
            errno = EAGAIN;
            return -1;
        }
        if (due < 0) {
            struct pollfd one = {fd, POLLIN, 0};
            real_poll(&one, 1, -1);
        } else {
            struct timespec ts = span(due - now_s());
            nanosleep(&ts, NULL);
        }
        pthread_mutex_lock(&st->mu);
    }
    size_t given = 0, room = 0;
    for (int i = 0; i < iovcnt; i++) room += iov[i].iov_len;
    double now = now_s();
    for (size_t k = 0; k < st->count && given < room; k++) {
        struct chunk *c = st->ring[(st->head + k) % st->slots];
        if (c->due > now) break;
        size_t take = c->len - c->off < room - given ? c->len - c->off : room - given;
        copy_out(iov, iovcnt, given, c->buf + c->off, take);
        given += take;
        if (!peek) c->off += take;
    }
    while (!peek && st->count && st->ring[st->head]->off == st->ring[st->head]->len) {
        free(st->ring[st->head]);
        st->head = (st->head + 1) % st->slots, st->count--;
    }
    ssize_t out = (ssize_t)given;
    if (given == 0 && st->error) errno = st->error, out = -1; /* eof: 0 */
    pthread_mutex_unlock(&st->mu);
    return out;
}

ssize_t readv(int fd, const struct iovec *iov, int iovcnt) {
    init();
    struct held *st = state_of(fd, 1);
    return st ? held_readv(fd, st, iov, iovcnt, 0, 0) : real_readv(fd, iov, iovcnt);
}

ssize_t read(int fd, void *buf, size_t count) {
    init();
    struct held *st = state_of(fd, 1);
    struct iovec iov = {buf, count};
    return st ? held_readv(fd, st, &iov, 1, 0, 0) : real_read(fd, buf, count);
}

/* recv() on a held socket always reads the queue (the kernel's bytes behind it would come out of order);
 * MSG_WAITALL waits for all ``count`` bytes, other flags are ignored. */
ssize_t recv(int fd, void *buf, size_t count, int flags) {
    init();
    struct held *st = state_of(fd, 1);
    if (st == NULL) return real_recv(fd, buf, count, flags);
    size_t got = 0;
    do {
        struct iovec iov = {(char *)buf + got, count - got};
        ssize_t n = held_readv(fd, st, &iov, 1, flags & MSG_PEEK, flags & MSG_DONTWAIT);
        if (n <= 0) return got ? (ssize_t)got : n;
        got += (size_t)n;
    } while ((flags & MSG_WAITALL) && !(flags & MSG_PEEK) && got < count);
    return (ssize_t)got;
}

int close(int fd) {
    init();
    forget(fd);
    return real_close(fd);
}

int dup2(int old, int target) {
    init();
    forget(target);
    return real_dup2(old, target);
}

int dup3(int old, int target, int flags) {
    init();
    forget(target);
    return real_dup3(old, target, flags);
}

/* Before the kernel is asked: queue what it has for every held socket; take POLLIN out of the request of
 * those whose queue is full (the kernel may have more, but it has to wait), noting it in ``masked``. 1 when
 * some held socket is answerable now; ``next`` gets the earliest due time of the others' oldest chunks. */
static int mask_held(struct pollfd *fds, nfds_t nfds, short *masked, double now, double *next) {
    int due_now = 0;
    for (nfds_t i = 0; i < nfds; i++) {
        masked[i] = 0;
        struct held *st = (fds[i].events & POLLIN) ? state_of(fds[i].fd, 0) : NULL;
        if (st == NULL) continue;
        double due;
        pthread_mutex_lock(&st->mu);
        drain(fds[i].fd, st);
        int now_ready = answerable(st, now, &due), full = st->count == st->slots;
        pthread_mutex_unlock(&st->mu);
        if (now_ready) {
            due_now = 1;
        } else if (due >= 0 && (*next < 0 || due < *next)) {
            *next = due;
        }
        if (full) {
            masked[i] = POLLIN;
            fds[i].events &= ~POLLIN;
        }
    }
    return due_now;
}

/* After the kernel's answer: a held socket is readable when it is answerable (what the kernel has is queued
 * first), not before; the kernel's POLLIN only said bytes arrived. Returns how many entries have events. */
static int answer_held(struct pollfd *fds, nfds_t nfds, const short *masked) {
    int ready = 0;
    for (nfds_t i = 0; i < nfds; i++) {
        fds[i].events |= masked[i];
        struct held *st = (fds[i].events & POLLIN) ? state_of(fds[i].fd, 0) : NULL;
        if (st != NULL) {
            double due;
            pthread_mutex_lock(&st->mu);
            drain(fds[i].fd, st);
            if (answerable(st, now_s(), &due))
                fds[i].revents |= POLLIN;
            else if (st->count)
                fds[i].revents &= ~(POLLIN | POLLHUP | POLLRDHUP | POLLERR); /* said when the bytes before are due */
            else
                fds[i].revents &= ~POLLIN;
            pthread_mutex_unlock(&st->mu);
        }
        if (fds[i].revents) ready++;
    }
    return ready;
}

/* poll() that reports a held socket readable when its chunk is due, and not before. */
int poll(struct pollfd *fds, nfds_t nfds, int timeout_ms) {
    init();
    if (npairs == 0) return real_poll(fds, nfds, timeout_ms);
    double deadline = timeout_ms < 0 ? -1 : now_s() + timeout_ms * 1e-3;
    short masked[nfds ? nfds : 1];
    for (;;) {
        double now = now_s(), next = -1;
        int due_now = mask_held(fds, nfds, masked, now, &next);
        double wait = due_now ? 0 : next >= 0 ? next - now : -1;
        if (deadline >= 0 && (wait < 0 || deadline - now < wait)) wait = deadline - now;
        struct timespec ts = span(wait);
        int rc = ppoll(fds, nfds, wait >= 0 || deadline >= 0 ? &ts : NULL, NULL);
        if (rc < 0) {
            int saved = errno;
            for (nfds_t i = 0; i < nfds; i++) fds[i].events |= masked[i];
            errno = saved;
            return rc;
        }
        int ready = answer_held(fds, nfds, masked);
        if (ready > 0 || (deadline >= 0 && now_s() >= deadline)) return ready;
        if (rc > 0) { /* only a hang-up behind chunks not yet due, which the kernel repeats: do not spin */
            struct timespec ts = span(1e-3);
            nanosleep(&ts, NULL);
        }
    }
}

int sched_yield(void) {
    init();
    if (yield_sleep_us == 0) return real_sched_yield();
    struct timespec pause = {yield_sleep_us / 1000000, (yield_sleep_us % 1000000) * 1000};
    nanosleep(&pause, NULL); /* sched_yield() cannot fail; an interrupted sleep just returns early */
    return 0;
}
