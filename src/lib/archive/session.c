/* SPDX-License-Identifier: MIT */
/*
 * session.c - the write-back session: files written through a mount (or any
 * caller that wants POSIX file semantics over an archive) are staged, then
 * archived in the background. The FUSE front end maps one operation to one
 * call here; tests drive it directly, without a mount.
 *
 * Objects:
 *  - a node is a staged file (ulp_stage) with its current path, metadata and
 *    archiving state; handles and the archive queue hold it (handles, pins);
 *  - a handle (ulp_sfile) is an open file description: it refers to its node
 *    (or, read-only, to an archived ulp_file), never to a path, so a dup'd
 *    descriptor that writes on after another descriptor's close writes to
 *    the same object (whatever its name is by then);
 *  - a ghost is an archived file unlinked while open (see invariant 6).
 *
 * Invariants:
 *  1. A path has at most one node; while it exists the node (not the
 *     archive) answers stat/read/write for that path.
 *  2. close(2) (ulp_session_flush of the last handle open for writing; read
 *     handles may stay open) of a file written
 *     under a final name records it in staging (ulp_stage_record: no fsync)
 *     and queues it; it returns without coding. A file under an rsync
 *     temporary name (".name.XXXXXX") is recorded and waits for the rename
 *     that gives it its final name; the rename queues it. So after close
 *     returns, a crash of the process (kill -9) recovers the file from
 *     staging at the next mount (ulp_stage_recover); after ulp_session_fsync,
 *     power loss too.
 *  3. One archiver thread takes queued nodes in the order they were queued
 *     (closed or renamed) and archives each with ulp_archive_put, which
 *     verifies and commits atomically: a file is in the archive whole or not
 *     at all, never torn. The archive's pool codes a file's tensors on every
 *     core meanwhile, while the writer goes on with the next file. A node
 *     written again while it is being archived stays dirty and is archived
 *     again at its next close.
 *  4. What staging records for a node names its current path and metadata:
 *     a rename or a chmod, chown or utimens relabels it, an unlink or a
 *     rename over it forgets it before the call returns, so no recovery
 *     brings back a superseded file or its old mode, owner or mtime. A node's record
 *     is written under the node's own rec_mu (taken before mu, never the
 *     other way), reading the path under mu, so the last writer writes the
 *     newest path.
 *  5. mu guards the namespace (nodes, ghosts), the queue and the counters;
 *     it is never held across a copy, an fsync, a put or an index
 *     transaction: those run with the node pinned (pins) and mu released.
 *  6. A file unlinked (or replaced by a rename) while open lives on under a
 *     hidden name (libfuse's ".fuse_hiddenXXXXXXXXXXXXXXXX") until its last
 *     close. Hidden files are never archived and never listed: a staged one
 *     stays a node, an archived one leaves the archive at once and lives on
 *     as a ghost (its stat, in memory; open handles read its blobs).
 *  7. Staged bytes waiting in the queue are bounded: a write waits while
 *     they exceed staging_max (and something is queued), so a fast writer
 *     cannot fill the disk; a full disk still gives NOSPC at write or close.
 *  8. A background archiving that fails leaves the file staged (recorded,
 *     so kept across a crash), marks it failed with the cause, is logged,
 *     and makes the next create or open for writing fail with its code;
 *     ulp_session_sync tries it again and names it if it fails again.
 *  9. Re-basing (recode.c) runs on the archiver thread only, when the queue
 *     is empty after an archiving or a rename queued work in the index and
 *     writing pauses (no file open for writing, none released in the last
 *     QUIET, no barrier waiting: rebase_wait; a file open for writing
 *     holds it back REBASE_MAX at most), and once more at close; a
 *     queued file waits at most one re-basing pass. So a re-basing pass
 *     never runs between the files of a copy or a save, or ahead of a
 *     barrier: it only changes how files are stored, never what they hold.
 * 10. A directory rename and the archiver never work below the same
 *     directory at once: the rename waits until the archiver's current path
 *     (cur_path) is outside both names, and the archiver starts no node below
 *     them until the rename has moved the index and the nodes. Otherwise a
 *     put under the old name could commit after the index moved (the file
 *     would come back under the old directory and be missing from the new
 *     one). One directory rename at a time.
 * 11. Writers come first: while a handle is open for writing, or one was
 *     released less than QUIET (100 ms) ago (the gap between two files of
 *     a copy or a save), the archiver and the pool threads coding for it
 *     run at niceness bg_nice (19), so that on a machine with few cores
 *     close() and write() keep the pace of a plain disk and archiving takes
 *     the CPU time they leave. It is decided at each file's start
 *     (archiving_nice) and each pool run takes it: a writer that opens
 *     sends the archiver back at its next pool run, and a barrier
 *     (ulp_session_sync) with no writer open brings it forward at once, as
 *     does a writer that waits in backpressure (invariant 7: it waits on
 *     archiving, which must not take only the CPU the writers leave).
 *     Only when the process may lower a niceness again (root, or
 *     RLIMIT_NICE), and the archive has ULP_OVERLAP_THREADS threads or more:
 *     then the archiver starts a closed file at once (bg_on, !defer), so
 *     that archiving overlaps a long copy (rsync) instead of following it.
 *     With fewer threads the cores are the writer's: on 2 cores an rsync of
 *     bench section 2's run returned at 0.41-0.61x the plain directory's
 *     speed with archiving beside it at SCHED_IDLE and 0.68-1.04x when
 *     archiving waited for the pause, while the time until archived was
 *     the same (0.53-0.58x against 0.52-0.64x import), so there it waits
 *     for pauses, in the background. Otherwise archiving keeps the default
 *     priority, and the archiver
 *     starts the next file only once writing pauses (no file open for
 *     writing, none closed in the last QUIET) or the file has waited 1 s
 *     (defer_until): a trainer's save returns before its first file's
 *     archiving starts.
 * 12. A file is archived once it is closed for writing, never while a handle
 *     still writes it. FUSE calls flush at every close(2) of a descriptor and
 *     release only at the last, so the close of a dup'd descriptor (shell
 *     redirection, dd) records and queues a file that the other descriptor
 *     goes on writing (so does a fork's copy of a descriptor, closed at
 *     exec). The archiver lets such an entry go without archiving
 *     (still_writing: a handle is open for writing), and the release of the
 *     last handle open for writing queues the file again: one archiving, of
 *     the final bytes. As FUSE sends the release after close(2) returns, an
 *     entry with nothing written since its close first waits up to 1 s for
 *     that release (release_wait), so that a barrier right after a close
 *     still covers the file. So ulp_session_sync covers files closed before
 *     it and never waits for long for one still open for writing: that one
 *     stays staged (durable after ulp_session_fsync, invariant 2) until its
 *     last close queues it.
 * 13. Space comes back by itself: the re-basing pass of invariant 9 is a
 *     tidy pass (tidy), at niceness bg_nice where the archiver can come
 *     back from it (bg_on): the index's re-basing queue, then, when an archived
 *     file was removed since the last pass, the tensors coded against
 *     removed steps (ulp_archive_rebase_orphans), then reclaiming
 *     (ulp_archive_reclaim: packs with nothing live are unlinked, sparse
 *     ones rewritten one at a time). Its rewrites stop as soon as a file is
 *     queued or a barrier waits (stop_tidy), so archiving never waits more
 *     than one pack's rewrite; the rest waits for the next pause. The pass
 *     at close is whole, with the crash leftovers swept too. What a crash
 *     left (queued re-codes, tensors coded against removed steps, dead or
 *     sparse packs, pack files the index does not name: maint.c invariant
 *     8) is looked for when the archiver starts and is the work of its
 *     first idle pass, as if a write had queued it (removed, sweep). A pass that
 *     fails (a full disk) is tried again while idle, 1 s later, then after
 *     twice as long each time up to 30 s (retry_at), not only at the next
 *     write: the work it left stays queued in the index meanwhile.
 * 14. The archiver chooses its order (DESIGN.md 5): the files queued at a
 *     time are the archive's expected files (ulp_archive_expect), and it
 *     takes first the queued file whose series has no queued file ranked
 *     before it in the layout's order (layout.c invariant 5): references
 *     before the steps coded against them, so steps queued together are
 *     coded in their final layout, as an import codes them, and only the
 *     newest step archived before them is re-coded. The expected set is
 *     dropped whenever the queue empties, before any re-basing (a re-basing
 *     plan would take an expected step for an anchor). Files without a
 *     series keep their queue order. Durability and barriers are as before:
 *     a barrier waits for every entry queued before it, whatever the order.
 * 15. Many hosts write (contrib.c): on a contributor the archiving of a node
 *     is its hand-over (ulp_contrib_put: done once the archiver took it and
 *     a generation followed here holds it), so a barrier there waits for the
 *     archiver's publication; archived files are not changed there (unlink,
 *     rename, rmdir, setattr of a file not staged here: OPNOTSUPP). On the
 *     lease holder of a shared archive on a directory, the archiver thread
 *     drains the other hosts' closed files (ulp_contrib_drain) at most once
 *     per drain_ms, idle or not, each becoming a node of this session
 *     (adopt: queued at once, as if closed here) unless a node holds its
 *     path (left for a later pass); a failed archiving of one leaves a note
 *     for its host (ulp_contrib_failed).
 * 16. One note line per archived step (o.note), not per file: the files
 *     archived under a step directory add up (the archiver's order may take
 *     files of several steps in turn: invariant 14), and the lines go out,
 *     in the order the steps began, when the archiver goes idle to tidy
 *     (writing paused) and at close (steps_done); more than STEPS_OPEN
 *     steps at once note the oldest first.
 */
#include "arch_int.h"
#include "archive/writer.h"
#include "store/shared.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

enum { ST_STAGED, ST_ARCHIVED, ST_FAILED };

typedef struct snode {
	char *path;            /* NULL once unlinked (not hidden) */
	ulp_stage *stage;      /* constant for the node's life */
	int handles;           /* open handles */
	int wh;                /* of them, open for writing (invariant 12) */
	uint64_t fwrites;      /* writes at the last flush of a writing handle (invariant 12) */
	int64_t ftime;         /* CLOCK_MONOTONIC ns of that flush (invariant 12) */
	int pins;              /* queue entries and calls working without mu */
	int dirty;             /* differs from the archive */
	int queued;            /* in the queue */
	int state;             /* ST_* of the last archiving */
	int err;               /* ST_FAILED: its ULP_E_* code */
	char *why;             /* ST_FAILED: the message */
	ulp_meta meta;
	int mtime_set;         /* an explicit mtime (utimens) */
	uint64_t writes;       /* bumped by every write/truncate: an archiving knows if it missed one */
	uint64_t attrs;        /* bumped by every setattr, likewise */
	uint64_t qbytes;       /* bytes counted in queued_bytes while queued */
	int64_t qtime;         /* CLOCK_MONOTONIC ns when it was queued (invariant 11) */
	pthread_mutex_t rec_mu; /* orders its staging records (invariant 4) */
	struct snode *qnext, *next;
} snode;

struct ulp_sfile {
	ulp_session *s;
	snode *n;              /* staged: held by handles */
	ulp_file *file;        /* archived, read-only */
	int wr;                /* opened for writing */
};

typedef struct ghost {
	char *path;
	ulp_stat st;
	struct ghost *next;
} ghost;

/* The fields after cv are guarded by mu (invariant 5) unless their comment
 * says otherwise. */
struct ulp_session {
	ulp_archive *a;        /* set at start, read-only after */
	ulp_session_opts o;    /* set at start, read-only after */
	pthread_mutex_t mu;    /* invariant 5 */
	pthread_cond_t cv;     /* the queue or a node's state changed */
	snode *nodes;          /* guarded by mu */
	ghost *ghosts;         /* guarded by mu */
	snode *qhead, *qtail;  /* guarded by mu */
	uint64_t queued_bytes; /* guarded by mu */
	unsigned qlen;         /* guarded by mu */
	int archiving;         /* the archiver works on a node now */
	snode *cur;            /* that node */
	const char *cur_path;  /* the archive path the archiver writes for it (invariant 10) */
	const char *dir_from, *dir_to; /* a directory rename in flight, or NULL (invariant 10) */
	uint64_t enq_seq, done_seq; /* queue entries made, and finished */
	int stop;
	int writers;           /* handles open for writing on staged files */
	int64_t last_write_close; /* CLOCK_MONOTONIC ns of the last such handle's release */
	int urgent;            /* callers waiting for an archiving (invariant 11) */
	int bg_nice;           /* set at start, read-only after: the archiver's niceness
	                          while writers > 0 (invariant 11) */
	int nice;              /* the niceness it takes now: 0 or bg_nice (atomic) */
	int bg_on;             /* the archiver can go back and forth (invariant 11) */
	int defer;             /* set at start, read-only after: wait for pauses even
	                          with bg_on (invariant 11) */
	unsigned delay_ms;     /* set at start, read-only after: ULP_TEST_PUT_DELAY_MS (tests:
	                          each archiving takes this much longer, so that a
	                          barrier has something to show) */
	int hold;              /* set at start, read-only after: ULP_SESSION_HOLD
	                          (measuring only): archive nothing until a sync, the
	                          close or a caller that waits for an archiving (urgent) */
	int syncing;           /* ulp_session_sync callers waiting */
	int pressed;           /* writers waiting in backpressure (invariant 11) */
	int rebase_wanted;     /* the index may have queued re-basing work (recode.c) */
	int64_t rebase_t;      /* CLOCK_MONOTONIC ns when rebase_wanted was set (invariant 9) */
	int removed;           /* an archived file was removed since the last tidy: its
	                          dependents may need re-basing (invariant 13) */
	int sweep;             /* the next tidy also removes the pack files the index does
	                          not name (a crash's leftovers: invariant 13) */
	uint64_t order_seq;    /* enq_seq + done_seq when the queue was last ordered (invariant 14) */
	int64_t retry_at;      /* CLOCK_MONOTONIC ns before which a failed tidy is not tried
	                          again (invariant 13) */
	int64_t retry_ns;      /* the wait after the last failure (doubles, up to RETRY_MAX) */
	int64_t q_oldest;      /* CLOCK_MONOTONIC ns when the oldest queued entry was queued */
	int expecting;         /* the archive holds the queue's files as expected (invariant 14) */
	int err;               /* code of a failed archiving not reported yet (invariant 8) */
	pthread_t thread;      /* set at start, joined at stop (no lock: one thread each) */
	int thread_on;         /* set at start, read at stop */
	/* counters, guarded by mu */
	uint64_t archived, archived_bytes, failed;
	uint64_t tidies, reclaimed_bytes; /* tidy passes, and the bytes they gave back */
	uint64_t busy_ns;      /* time the archiver spent archiving */
	int drain;             /* set at start, read-only after: drains other hosts (invariant 15) */
	int64_t drain_ms;      /* set at start, read-only after: at most one drain per */
	int64_t next_drain;    /* archiver thread only: CLOCK_MONOTONIC ms of the next */
	uint64_t adopted;      /* files taken from other hosts */
	uint64_t errors;       /* atomic: slog lines (errors of background work) */
	int64_t cur_t0;        /* CLOCK_MONOTONIC ns when cur's archiving started */
	struct sstep *steps_open; /* guarded by mu: steps archived since the last note
	                             (invariant 16), in the order they began */
	unsigned n_steps_open; /* guarded by mu */
	uint64_t steps;        /* guarded by mu: notes made */
};

/* A step being archived (invariant 16). */
typedef struct sstep {
	char *key;             /* its directory (RUN/checkpoint-N) */
	uint64_t files, bytes, stored, ns;
	struct sstep *next;
} sstep;

/* ---- helpers --------------------------------------------------------------- */

static void writer_in(ulp_session *s, int d);
static int still_writing(ulp_session *s, snode *n);



static void slog(ulp_session *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void slog(ulp_session *s, const char *fmt, ...)
{
	char msg[4600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	__atomic_add_fetch(&s->errors, 1, __ATOMIC_RELAXED);
	if (s->o.log)
		s->o.log(s->o.log_arg, msg);
}

int ulp_session_hidden_name(const char *path)
{
	const char *b = strrchr(path, '/');
	b = b ? b + 1 : path;
	if (strncmp(b, ".fuse_hidden", 12) != 0 || strlen(b) != 28)
		return 0;
	for (const char *c = b + 12; *c; c++)
		if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f')))
			return 0;
	return 1;
}

int ulp_session_temp_name(const char *path)
{
	const char *b = strrchr(path, '/');
	b = b ? b + 1 : path;
	const char *dot = strrchr(b, '.');
	if (b[0] != '.' || !dot || dot == b || strlen(dot + 1) != 6)
		return 0;
	for (const char *c = dot + 1; *c; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9')))
			return 0;
	return 1;
}

static int final_name(const char *path)
{
	return path && !ulp_session_temp_name(path) && !ulp_session_hidden_name(path);
}

/* mu held */
static snode *find_node(ulp_session *s, const char *p)
{
	for (snode *n = s->nodes; n; n = n->next)
		if (n->path && !strcmp(n->path, p))
			return n;
	return NULL;
}

/* mu held */
static ghost *find_ghost(ulp_session *s, const char *p)
{
	for (ghost *g = s->ghosts; g; g = g->next)
		if (!strcmp(g->path, p))
			return g;
	return NULL;
}

static snode *new_node(ulp_session *s, const char *p, ulp_stage *st, const ulp_meta *m)
{
	snode *n = calloc(1, sizeof(*n));
	if (!n)
		return NULL;
	n->path = strdup(p);
	if (!n->path) {
		free(n);
		return NULL;
	}
	pthread_mutex_init(&n->rec_mu, NULL);
	n->stage = st;
	n->meta = *m;
	n->next = s->nodes;
	s->nodes = n;
	return n;
}

/* mu held: frees a node nobody holds (its staging files go too) */
static void drop_node(ulp_session *s, snode *n)
{
	for (snode **pp = &s->nodes; *pp; pp = &(*pp)->next)
		if (*pp == n) {
			*pp = n->next;
			break;
		}
	if (n->state == ST_ARCHIVED && !n->dirty && n->path)
		ulp_stage_archived(n->stage); /* a shared archive keeps it until published (staging.c) */
	else
		ulp_stage_discard(n->stage);
	pthread_mutex_destroy(&n->rec_mu);
	free(n->path);
	free(n->why);
	free(n);
}

/* mu held: a node nobody holds that has nothing to archive goes */
static void maybe_drop(ulp_session *s, snode *n)
{
	if (n->handles == 0 && n->pins == 0 && (!n->path || !n->dirty || ulp_session_hidden_name(n->path)))
		drop_node(s, n);
}

/* n's metadata as it would be archived now (mu held) */
static ulp_meta node_meta(snode *n)
{
	ulp_meta m = n->meta;
	struct stat sb;
	if (!n->mtime_set && fstat(ulp_stage_fd(n->stage), &sb) == 0)
		m.mtime = ulp_time_make(sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec);
	return m;
}

static uint64_t node_size(snode *n)
{
	struct stat sb;
	return fstat(ulp_stage_fd(n->stage), &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

enum { REC_RECORD, REC_RELABEL, REC_SYNC, REC_FORGET };

/*
 * Writes what staging records for n (invariant 4), mu not held, n pinned:
 * its current path, or, if it has none (unlinked, hidden), forgets it.
 */
static int node_record(ulp_session *s, snode *n, int how)
{
	pthread_mutex_lock(&n->rec_mu);
	pthread_mutex_lock(&s->mu);
	char *p = n->path && !ulp_session_hidden_name(n->path) ? strdup(n->path) : NULL;
	int nomem = n->path && !ulp_session_hidden_name(n->path) && !p;
	ulp_meta m = node_meta(n);
	pthread_mutex_unlock(&s->mu);
	int rc;
	if (nomem)
		rc = -ULP_E_NOMEM;
	else if (!p || how == REC_FORGET)
		rc = ulp_stage_forget(n->stage);
	else if (how == REC_SYNC)
		rc = ulp_stage_sync(n->stage, p, &m);
	else if (how == REC_RECORD)
		rc = ulp_stage_record(n->stage, p, &m);
	else
		rc = ulp_stage_relabel(n->stage, p, &m);
	pthread_mutex_unlock(&n->rec_mu);
	if (rc < 0)
		slog(s, "%s: staging record: %s", p ? p : "(unlinked file)", ulp_archive_errmsg(s->a));
	free(p);
	return rc;
}

#define QUIET 100000000LL /* 100 ms (invariants 9 and 11) */
#define RETRY_MIN 1000000000LL  /* a failed tidy again after 1 s, */
#define RETRY_MAX 30000000000LL /* doubling up to 30 s (invariant 13) */
#define REBASE_MAX 10000000000LL /* 10 s (invariant 9) */

/* The index may have queued re-basing work (mu held; invariant 9). */
static void want_rebase(ulp_session *s)
{
	if (!s->rebase_wanted)
		s->rebase_t = ulp_mono_ns();
	s->rebase_wanted = 1;
}

/*
 * Invariant 11: the niceness archiving takes for its next file (mu held):
 * background while a file is open for writing or one was released less than
 * QUIET ago, unless nobody writes and someone waits for it.
 */
static void archiving_nice(ulp_session *s)
{
	int bg = !s->pressed && (s->writers > 0 || (!s->syncing && !s->urgent && !s->stop &&
	                                            ulp_mono_ns() - s->last_write_close < QUIET));
	__atomic_store_n(&s->nice, bg ? s->bg_nice : 0, __ATOMIC_RELAXED);
}

/* Queues n for the archiver (mu held; invariant 3). */
static void enqueue(ulp_session *s, snode *n)
{
	if (n->queued)
		return; /* the archiver reads it when its turn comes: the newest bytes */
	n->queued = 1;
	n->pins++;
	n->qnext = NULL;
	n->qbytes = node_size(n);
	n->qtime = ulp_mono_ns();
	s->queued_bytes += n->qbytes;
	if (s->qtail)
		s->qtail->qnext = n;
	else
		s->qhead = n;
	s->qtail = n;
	s->qlen++;
	s->enq_seq++;
	pthread_cond_broadcast(&s->cv);
}

static void set_failed(snode *n, int rc, const char *why)
{
	n->state = ST_FAILED;
	n->err = rc;
	free(n->why);
	n->why = strdup(why);
}

/* A contributor's hand-over gives up waiting: the session closes
 * (invariant 15; called without mu). */
static int stopping(void *arg)
{
	ulp_session *s = arg;
	pthread_mutex_lock(&s->mu);
	int stop = s->stop;
	pthread_mutex_unlock(&s->mu);
	return stop;
}

/* The drain's callbacks (invariant 15), without mu. */
static int path_free(void *arg, const char *path)
{
	ulp_session *s = arg;
	if (!final_name(path))
		return 0; /* an rsync temporary waits for its rename on its host */
	pthread_mutex_lock(&s->mu);
	int fr = !find_node(s, path) && !find_ghost(s, path);
	pthread_mutex_unlock(&s->mu);
	return fr;
}

static int adopt(void *arg, ulp_stage *st, const char *path, const ulp_meta *m)
{
	ulp_session *s = arg;
	pthread_mutex_lock(&s->mu);
	snode *n = find_node(s, path) ? NULL : new_node(s, path, st, m);
	if (!n) { /* taken meanwhile here: the claimed file waits for the next writer */
		pthread_mutex_unlock(&s->mu);
		slog(s, "%s: staged by another host, left in staging for the next writer (busy here)", path);
		ulp_stage_close(st);
		return -ULP_E_BUSY;
	}
	n->mtime_set = 1; /* the contributor's mtime, not the claimed file's */
	n->dirty = 1;
	s->adopted++;
	enqueue(s, n);
	pthread_mutex_unlock(&s->mu);
	return 0;
}

/* mu held: drains the other hosts when due (invariant 15) */
static void drain_due(ulp_session *s)
{
	if (!s->drain || s->stop)
		return;
	int64_t now = ulp_mono_ms();
	if (now < s->next_drain)
		return;
	s->next_drain = now + s->drain_ms;
	pthread_mutex_unlock(&s->mu);
	int rc = ulp_contrib_drain(s->a, path_free, adopt, s);
	if (rc < 0 && rc != -ULP_E_FENCED)
		slog(s, "taking other hosts' staged files: %s", ulp_archive_errmsg(s->a));
	pthread_mutex_lock(&s->mu);
}

/*
 * Archives n under its path (mu held on entry and exit, released meanwhile;
 * n pinned by the caller). 0 or the put's error.
 */
static int below(const char *p, const char *dir)
{
	size_t l = strlen(dir);
	return p && dir && !strncmp(p, dir, l) && p[l] == '/';
}

/* Invariant 15: the step directory of path (the directory holding the
 * component the step is parsed from, else the parent), malloc'd. */
static char *step_key_of(const char *path)
{
	const char *end = strrchr(path, '/');
	char *series = NULL;
	if (ulp_parse_step(path, &series) >= 0 && series) {
		/* series is path with the step's digits as "{S}": the same bytes before */
		const char *m = strstr(series, "{S}");
		size_t at = m ? (size_t)(m - series) : 0;
		const char *q = m && at <= strlen(path) ? strchr(path + at, '/') : NULL;
		if (q) /* a step directory; else a step file: its directory */
			end = q;
	}
	free(series);
	return end ? strndup(path, (size_t)(end - path)) : strdup("");
}

enum { STEPS_OPEN = 32 };

/* Invariant 15: the note line of st, unlinked already; with mu. */
static void step_note(ulp_session *s, sstep *st)
{
	if (s->o.note) {
		char msg[1200];
		double mb = (double)st->bytes / 1e6, smb = (double)st->stored / 1e6;
		snprintf(msg, sizeof(msg), "archived %.900s: %llu file%s, %.1f MB -> %.1f MB (%.3f) in %.1f s",
		         st->key[0] ? st->key : "/", (unsigned long long)st->files, st->files == 1 ? "" : "s", mb, smb,
		         st->bytes ? (double)st->stored / (double)st->bytes : 0.0, (double)st->ns / 1e9);
		s->o.note(s->o.log_arg, msg);
	}
	s->steps++;
	free(st->key);
	free(st);
}

/* Invariant 15: every step archived since the last notes; with mu. */
static void steps_done(ulp_session *s)
{
	while (s->steps_open) {
		sstep *st = s->steps_open;
		s->steps_open = st->next;
		s->n_steps_open--;
		step_note(s, st);
	}
}

static void step_add(ulp_session *s, const char *path, uint64_t bytes, uint64_t stored, int64_t ns)
{
	char *k = step_key_of(path);
	if (!k)
		return;
	sstep **pp = &s->steps_open;
	while (*pp && strcmp((*pp)->key, k) != 0)
		pp = &(*pp)->next;
	if (!*pp) {
		if (s->n_steps_open >= STEPS_OPEN) { /* the oldest first */
			sstep *old = s->steps_open;
			s->steps_open = old->next;
			s->n_steps_open--;
			step_note(s, old);
			for (pp = &s->steps_open; *pp;)
				pp = &(*pp)->next;
		}
		sstep *st = calloc(1, sizeof(*st));
		if (!st) {
			free(k);
			return;
		}
		st->key = k;
		*pp = st;
		s->n_steps_open++;
	} else {
		free(k);
	}
	(*pp)->files++;
	(*pp)->bytes += bytes;
	(*pp)->stored += stored;
	(*pp)->ns += (uint64_t)ns;
}

static int archive_node(ulp_session *s, snode *n)
{
	while (s->dir_from && (below(n->path, s->dir_from) || below(n->path, s->dir_to)))
		pthread_cond_wait(&s->cv, &s->mu); /* invariant 10; n may be unlinked meanwhile */
	if (!n->path || !n->dirty || !final_name(n->path))
		return 0;
	char *dst = strdup(n->path);
	if (!dst)
		return -ULP_E_NOMEM;
	ulp_meta m = node_meta(n);
	uint64_t writes = n->writes, attrs = n->attrs;
	archiving_nice(s);
	s->archiving = 1;
	s->cur = n;
	s->cur_path = dst;
	int64_t t0 = ulp_mono_ns();
	s->cur_t0 = t0;
	pthread_mutex_unlock(&s->mu);
	if (s->delay_ms)
		usleep(s->delay_ms * 1000u);
	ulp_put_result pr;
	memset(&pr, 0, sizeof(pr));
	int rc = s->a->contrib ? ulp_contrib_put(s->a, n->stage, dst, &m, stopping, s)
	                       : ulp_archive_put(s->a, dst, ulp_stage_fd(n->stage), &m, &pr);
	char why[1024] = "";
	if (rc < 0)
		snprintf(why, sizeof(why), "%s", ulp_archive_errmsg(s->a));
	if (rc < 0 && ulp_stage_origin(n->stage)[0])
		ulp_contrib_failed(s->a, n->stage, rc, why); /* its host's sync names it (invariant 15) */
	int64_t t1 = ulp_mono_ns();
	pthread_mutex_lock(&s->mu);
	s->busy_ns += (uint64_t)(t1 - t0);
	if (rc < 0) {
		set_failed(n, rc, why);
		s->failed++;
		if (!s->err)
			s->err = rc;
		slog(s, "archiving %s: %s (kept in staging)", dst, why);
		s->cur_path = NULL;
		free(dst);
		s->archiving = 0;
		s->cur = NULL; /* renames and unlinks of n wait until here */
		return rc;
	}
	s->archived++;
	s->archived_bytes += n->qbytes ? n->qbytes : node_size(n);
	step_add(s, dst, pr.raw_bytes, pr.stored_bytes, t1 - t0);
	want_rebase(s); /* the archiver re-bases when idle (invariant 9) */
	/* what happened to the node meanwhile: the archive follows it (not on a
	 * contributor, which changes no archived file: invariant 15) */
	for (; !s->a->contrib;) {
		int gone = !n->path || ulp_session_hidden_name(n->path);
		int moved = !gone && strcmp(n->path, dst) != 0;
		int reattr = !gone && !moved && n->attrs != attrs;
		if (!gone && !moved && !reattr)
			break;
		char *to = moved ? strdup(n->path) : NULL;
		ulp_meta nm = n->meta;
		unsigned which = ULP_SET_MODE | ULP_SET_OWNER | (n->mtime_set ? ULP_SET_MTIME : 0);
		if (reattr)
			attrs = n->attrs;
		pthread_mutex_unlock(&s->mu);
		int r = 0;
		if (gone)
			r = ulp_archive_remove(s->a, dst);
		else if (moved && to)
			r = ulp_archive_rename(s->a, dst, to);
		else if (reattr)
			r = ulp_archive_setattr(s->a, dst, which, &nm);
		if (r < 0 && r != -ULP_E_NOENT)
			slog(s, "after archiving %s: %s", dst, ulp_archive_errmsg(s->a));
		pthread_mutex_lock(&s->mu);
		if (gone && r == 0)
			s->removed = 1; /* (tidied when idle: invariant 13) */
		if (gone || (moved && !to))
			break;
		if (!moved)
			continue; /* attributes again, if they changed once more */
		free(dst);
		dst = to;
		s->cur_path = dst;
	}
	s->cur_path = NULL;
	free(dst);
	if (n->writes == writes) {
		n->dirty = 0;
		n->state = ST_ARCHIVED;
	}
	s->archiving = 0;
	s->cur = NULL; /* renames and unlinks of n wait until the archive follows them */
	return 0;
}

/* Invariant 13: a tidy pass's rewrites end once archiving or a barrier
 * wants the archiver. */
static int stop_tidy(void *arg)
{
	ulp_session *s = arg;
	pthread_mutex_lock(&s->mu);
	int stop = (s->qhead != NULL || s->syncing) && !s->stop;
	pthread_mutex_unlock(&s->mu);
	return stop;
}

/* The queue's files are no longer expected (mu held; invariant 14). */
static void forget_expected(ulp_session *s)
{
	if (s->expecting) {
		ulp_layout_forget_expected(s->a);
		s->expecting = 0;
	}
}

/* Re-bases what the index queued, and what removals left, then reclaims
 * (mu held; released meanwhile): a failure leaves the work queued in the
 * index for the next time (invariants 9, 13). final: the pass at close. */
static void tidy(ulp_session *s, int final)
{
	s->rebase_wanted = 0;
	int removed = s->removed, sweep = s->sweep;
	s->removed = 0;
	s->sweep = 0;
	forget_expected(s);
	if (s->a->contrib)
		return; /* the archiver's work (invariant 15) */
	archiving_nice(s);
	/* background priority, readers and writers first; a barrier brings it
	 * forward (ulp_session_sync), the pass at close is the unmount's */
	if (!final && s->bg_on)
		__atomic_store_n(&s->nice, s->bg_nice, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&s->mu);
	int rc = ulp_archive_rebase_pending(s->a, NULL, NULL, NULL);
	if (rc == 0 && (removed || final))
		rc = ulp_archive_rebase_orphans(s->a, NULL, NULL, NULL);
	if (rc < 0)
		slog(s, "re-basing: %s", ulp_archive_errmsg(s->a));
	ulp_reclaim_opts o = {.full = final || sweep, .stop = final ? NULL : stop_tidy, .stop_arg = s};
	ulp_gc_result g = {0};
	int rc2 = ulp_archive_reclaim(s->a, &o, &g);
	if (rc2 < 0)
		slog(s, "reclaiming space: %s", ulp_archive_errmsg(s->a));
	int stopped = !final && stop_tidy(s); /* (the sweep comes last: skipped then) */
	pthread_mutex_lock(&s->mu);
	if (rc < 0 && removed)
		s->removed = 1; /* the orphans again next time */
	if (sweep && (rc2 < 0 || stopped)) {
		s->sweep = 1;
		want_rebase(s);
	}
	if (rc < 0 || rc2 < 0) { /* (a full disk, say) tried again while idle */
		s->retry_ns = ULP_MIN(s->retry_ns ? s->retry_ns * 2 : RETRY_MIN, RETRY_MAX);
		s->retry_at = ulp_mono_ns() + s->retry_ns;
		want_rebase(s);
	} else {
		s->retry_ns = 0;
		s->retry_at = 0;
	}
	s->tidies++;
	s->reclaimed_bytes += g.bytes_reclaimed;
}

/* order_queue's sort (qsort_r): by series (unranked ones first), then rank */
typedef struct rankv {
	char **series;
	const uint32_t *rank;
} rankv;

static int by_series_rank(const void *x, const void *y, void *arg)
{
	const rankv *v = arg;
	size_t i = *(const size_t *)x, j = *(const size_t *)y;
	const char *a = v->series[i], *b = v->series[j];
	int c = !a || !b ? (a != NULL) - (b != NULL) : strcmp(a, b);
	if (c)
		return c;
	return v->rank[i] < v->rank[j] ? -1 : v->rank[i] > v->rank[j] ? 1 : (i > j) - (i < j);
}

/*
 * Invariant 14: moves to the queue's head the entry to archive next, and
 * notes the oldest entry's time (mu held; released meanwhile). Ranks come
 * from the layout of each series over its archived and queued steps.
 */
static void order_queue(ulp_session *s)
{
	uint64_t seq = s->enq_seq + s->done_seq;
	if (!s->qhead || s->order_seq == seq)
		return;
	s->order_seq = seq;
	size_t n = 0;
	int64_t oldest = INT64_MAX;
	for (snode *q = s->qhead; q; q = q->qnext) {
		n++;
		oldest = ULP_MIN(oldest, q->qtime);
	}
	s->q_oldest = oldest;
	if (n < 2 || s->hold)
		return;
	snode **node = calloc(n, sizeof(*node));
	char **path = calloc(n, sizeof(*path));
	char **series = calloc(n, sizeof(*series));
	uint32_t *rank = calloc(n, sizeof(*rank));
	size_t m = 0;
	if (node && path && series && rank)
		for (snode *q = s->qhead; q; q = q->qnext)
			if (q->path && final_name(q->path) && !still_writing(s, q) && (path[m] = strdup(q->path)))
				node[m++] = q; /* pinned by its queue entry */
	pthread_mutex_unlock(&s->mu);
	int rc = m > 1 ? ulp_archive_expect(s->a, (const char *const *)path, m, rank) : -ULP_E_INVAL;
	for (size_t i = 0; rc == 0 && i < m; i++)
		if (ulp_parse_step(path[i], &series[i]) < 0 || !series[i])
			series[i] = NULL;
	pthread_mutex_lock(&s->mu);
	if (rc == 0) {
		s->expecting = 1;
		/* the first entry, in queue order, that no queued step of its
		 * series precedes in the layout's order: each series' lowest rank
		 * marked after a sort by (series, rank); node[] lists the queue's
		 * entries in its order (the queue only grew meanwhile, at its tail) */
		size_t *ix = malloc((m ? m : 1) * sizeof(*ix));
		uint8_t *first = calloc(m ? m : 1, 1);
		snode *best = NULL;
		if (ix && first) {
			rankv v = {series, rank};
			for (size_t i = 0; i < m; i++)
				ix[i] = i;
			qsort_r(ix, m, sizeof(*ix), by_series_rank, &v);
			for (size_t k = 0; k < m; k++)
				first[ix[k]] = !series[ix[k]] || k == 0 || !series[ix[k - 1]] ||
				               strcmp(series[ix[k - 1]], series[ix[k]]) != 0;
			size_t k = 0;
			for (snode *q = s->qhead; q && !best; q = q->qnext) {
				int known = k < m && node[k] == q;
				if (!known || first[k])
					best = q; /* (an entry not ranked keeps its place) */
				k += known;
			}
		}
		free(ix);
		free(first);
		if (best && best != s->qhead) {
			snode *prev = s->qhead;
			while (prev->qnext != best)
				prev = prev->qnext;
			prev->qnext = best->qnext;
			if (s->qtail == best)
				s->qtail = prev;
			best->qnext = s->qhead;
			s->qhead = best;
		}
	}
	for (size_t i = 0; i < m; i++) {
		free(path[i]);
		free(series[i]);
	}
	free(node);
	free(path);
	free(series);
	free(rank);
}

/*
 * Invariant 11, without a background: the queue's head waits while a file is
 * open for writing, or one was closed less than QUIET ago (a trainer's next file of the
 * same save), for at most DEFER_MAX after it was queued, unless someone waits
 * for it (sync, a reopen, the archive's xattrs), staging is half full, or the
 * session stops. Returns the CLOCK_MONOTONIC ns to wait until, or 0: go.
 */
#define DEFER_MAX 1000000000LL /* 1 s */
#define ULP_OVERLAP_THREADS 4  /* archiving overlaps writing from this many threads on (invariant 11) */
static int64_t defer_until(ulp_session *s)
{
	if (!s->qhead || s->stop || s->syncing || s->urgent || s->queued_bytes > s->o.staging_max / 2 || (s->bg_on && !s->defer))
		return 0;
	int64_t now = ulp_mono_ns(), until = s->q_oldest + DEFER_MAX; /* (order_queue) */
	if (s->writers == 0)
		until = ULP_MIN(until, s->last_write_close + QUIET);
	return until > now ? until : 0;
}

/*
 * Invariant 12: a queued node that a handle still has open for writing (the
 * close of a dup'd descriptor queued it, or a fork's copy of one) is not
 * archived: its entry goes, and the release of its last handle open for
 * writing queues it again. FUSE sends that release after close(2) has
 * returned, so when nothing was written since the close, the archiver first
 * gives the release RELEASE_WAIT to arrive (release_wait).
 */
#define RELEASE_WAIT 1000000000LL /* 1 s */
static int still_writing(ulp_session *s, snode *n)
{
	return n->wh > 0 && !s->stop;
}

/* 0, or the CLOCK_MONOTONIC ns until which the queue's head waits for the
 * release that follows its close (invariant 12) */
static int64_t release_wait(ulp_session *s)
{
	snode *n = s->qhead;
	if (!n || !still_writing(s, n) || n->writes != n->fwrites)
		return 0;
	int64_t until = n->ftime + RELEASE_WAIT;
	return until > ulp_mono_ns() ? until : 0;
}

/* Invariant 9: 0 when a re-basing pass may start now, else -1 (wait for a
 * change: a queued file, a barrier's end) or the CLOCK_MONOTONIC ns to wait
 * until (mu held). A file held open for writing for long (a log) holds it
 * back REBASE_MAX at most. */
static int64_t rebase_wait(ulp_session *s)
{
	if (s->syncing)
		return -1;
	int64_t now = ulp_mono_ns(), until = s->rebase_t + REBASE_MAX;
	if (s->writers == 0)
		until = ULP_MIN(until, s->last_write_close + QUIET);
	until = ULP_MAX(until, s->retry_at); /* after a failure (invariant 13) */
	return until > now ? until : 0;
}

static void *archiver(void *arg)
{
	ulp_session *s = arg;
	/* invariant 11: background only if it can come back to the foreground */
	struct rlimit rl; /* (RLIMIT_NICE 20: down to niceness 0) */
	int may_lower = geteuid() == 0 || (getrlimit(RLIMIT_NICE, &rl) == 0 && rl.rlim_cur >= 20);
	int bg_on = s->bg_nice > 0 && may_lower && ulp_thread_set_nice(0) == 0;
	if (bg_on)
		ulp_thread_follow_nice(&s->nice);
	/* invariant 13: what a crash left (queued re-codes, orphans, dead or
	 * sparse packs, unnamed pack files) is the first idle pass's work, not
	 * the next write's or the close's */
	unsigned due = 0;
	if (!s->a->contrib && ulp_archive_tidy_due(s->a, &due) < 0)
		slog(s, "looking for work left by a crash: %s", ulp_archive_errmsg(s->a));
	pthread_mutex_lock(&s->mu);
	s->bg_on = bg_on;
	if (due) {
		s->removed |= (due & ULP_DUE_RECODE) != 0; /* (the orphans: one query when none) */
		s->sweep = (due & ULP_DUE_SWEEP) != 0;
		want_rebase(s);
	}
	for (;;) {
		drain_due(s);
		while ((!s->qhead && !s->stop && !s->rebase_wanted) || (s->hold && !s->stop && !s->syncing && !s->urgent)) {
			if (!s->drain) {
				pthread_cond_wait(&s->cv, &s->mu);
				continue;
			}
			int64_t until = s->next_drain * 1000000; /* (ms to ns) */
			struct timespec ts = {(time_t)(until / 1000000000), (long)(until % 1000000000)};
			if (pthread_cond_timedwait(&s->cv, &s->mu, &ts) != 0)
				drain_due(s);
		}
		if (!s->qhead && !s->stop) { /* idle, and archivings or renames queued work */
			forget_expected(s);
			int64_t until = rebase_wait(s);
			if (until < 0) {
				pthread_cond_wait(&s->cv, &s->mu);
			} else if (until) {
				struct timespec ts = {(time_t)(until / 1000000000), (long)(until % 1000000000)};
				pthread_cond_timedwait(&s->cv, &s->mu, &ts);
			} else {
				steps_done(s); /* writing paused (invariant 16) */
				tidy(s, 0);
			}
			continue;
		}
		order_queue(s);
		int64_t until = defer_until(s);
		if (!until)
			until = release_wait(s);
		if (until) {
			struct timespec ts = {(time_t)(until / 1000000000), (long)(until % 1000000000)};
			pthread_cond_timedwait(&s->cv, &s->mu, &ts);
			continue;
		}
		snode *n = s->qhead;
		if (!n)
			break; /* stopping, and nothing left */
		s->qhead = n->qnext;
		if (!s->qhead)
			s->qtail = NULL;
		n->queued = 0;
		/* (written to meanwhile: archive_node leaves it dirty, and its
		 * next close queues it again) */
		if (!still_writing(s, n))
			archive_node(s, n);
		s->queued_bytes -= n->qbytes;
		n->qbytes = 0;
		s->qlen--;
		s->done_seq++;
		n->pins--;
		maybe_drop(s, n);
		pthread_cond_broadcast(&s->cv);
	}
	steps_done(s);
	tidy(s, 1); /* at close: the last archivings, renames and removals */
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* ---- session --------------------------------------------------------------- */

int ulp_session_open(ulp_archive *a, const ulp_session_opts *o, ulp_session **out)
{
	if (a->read_only && !a->contrib)
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: archive is open read-only", a->dir);
	ULP_TRY(ulp_lease_ok(a)); /* a shared archive's writer: its renewer starts here (lease.c) */
	ulp_session *s = calloc(1, sizeof(*s));
	if (!s)
		return -ULP_E_NOMEM;
	s->a = a;
	if (o)
		s->o = *o;
	if (!s->o.staging_max) { /* half of the free space, at least 64 MiB */
		struct statvfs v;
		uint64_t freeb = statvfs(a->dir, &v) == 0 ? (uint64_t)v.f_bavail * v.f_frsize : 0;
		s->o.staging_max = ULP_MAX(freeb / 2, (uint64_t)64 << 20);
	}
	s->bg_nice = 19;
	const char *bg = getenv("ULP_SESSION_NICE"); /* (measuring: 0 turns it off) */
	if (bg && bg[0] >= '0' && bg[0] <= '9')
		s->bg_nice = atoi(bg) > 19 ? 19 : atoi(bg);
	/* invariant 11: with fewer than ULP_OVERLAP_THREADS threads the writer
	 * (rsync's two processes and this daemon's requests) keeps the cores
	 * busy, and archiving beside it, even at SCHED_IDLE, takes from it
	 * rather than from idle time: wait for pauses there (ULP_SESSION_DEFER
	 * 0 or 1 overrides, for measuring) */
	const char *defer = getenv("ULP_SESSION_DEFER");
	s->defer = defer && (defer[0] == '0' || defer[0] == '1') ? defer[0] == '1'
	                                                          : ulp_pool_threads(a->pool) < ULP_OVERLAP_THREADS;
	const char *nospc = getenv("ULP_TEST_RECODE_NOSPC"); /* (tests: a full disk at re-basing) */
	if (nospc && nospc[0] >= '1' && nospc[0] <= '9')
		__atomic_store_n(&ulp_recode_fail_nospc, atoi(nospc), __ATOMIC_RELAXED);
	const char *delay = getenv("ULP_TEST_PUT_DELAY_MS");
	if (delay && delay[0] >= '1' && delay[0] <= '9')
		s->delay_ms = (unsigned)atoi(delay) > 10000 ? 10000 : (unsigned)atoi(delay);
	const char *hold = getenv("ULP_SESSION_HOLD");
	s->hold = hold && hold[0] == '1';
	ulp_generation g; /* invariant 15: the writer's pace (a second, at most a quarter lease) */
	ulp_archive_generation(a, &g);
	s->drain = g.shared && g.writer && !a->rm;
	s->drain_ms = g.lease_ms && g.lease_ms < 4000 ? g.lease_ms / 4 : 1000;
	pthread_mutex_init(&s->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* defer_until's clock */
	pthread_cond_init(&s->cv, &ca);
	pthread_condattr_destroy(&ca);
	if (pthread_create(&s->thread, NULL, archiver, s) != 0) {
		pthread_cond_destroy(&s->cv);
		pthread_mutex_destroy(&s->mu);
		free(s);
		return -ULP_E_NOMEM;
	}
	s->thread_on = 1;
	*out = s;
	return 0;
}

unsigned ulp_session_close(ulp_session *s)
{
	unsigned kept = 0;
	if (!s)
		return 0;
	pthread_mutex_lock(&s->mu);
	s->stop = 1; /* the queue drains first, in order */
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (s->thread_on)
		pthread_join(s->thread, NULL);
	pthread_mutex_lock(&s->mu);
	while (s->nodes) {
		snode *n = s->nodes;
		if (n->path && ulp_session_hidden_name(n->path)) {
			free(n->path); /* unlinked: never archived (invariant 6) */
			n->path = NULL;
		}
		/* files waiting for a rename (temporary names) were closed by
		 * someone: archive them under the name they have rather than lose
		 * them; open ones too, as they are now */
		int ok = 0;
		if (n->path && n->dirty) {
			char *p = strdup(n->path);
			ulp_meta m = node_meta(n);
			pthread_mutex_unlock(&s->mu);
			if (s->a->contrib && ulp_stage_taken(n->stage)) {
				ok = 1; /* the archiver has it (invariant 15) */
			} else if (s->a->contrib) {
				ulp_stage_mark_closed(n->stage); /* for the archiver to take */
			} else {
				ok = p && ulp_archive_put(s->a, p, ulp_stage_fd(n->stage), &m, NULL) == 0;
			}
			if (ok && s->a->contrib) {
				ulp_stage_close(n->stage);
				n->stage = NULL;
			} else if (!ok && p && ulp_stage_sync(n->stage, p, &m) == 0) {
				slog(s, "%s: kept in %s/staging, archived at the next mount", p, s->a->dir);
				kept++;
				ulp_stage_close(n->stage); /* leaves its files */
				n->stage = NULL;
			} else if (!ok) {
				slog(s, "%s: could not be kept: %s", p ? p : "?", ulp_archive_errmsg(s->a));
			}
			free(p);
			pthread_mutex_lock(&s->mu);
		}
		drop_node(s, n); /* NULL stage: discard does nothing */
	}
	while (s->ghosts) {
		ghost *g = s->ghosts;
		s->ghosts = g->next;
		free(g->path);
		free(g);
	}
	steps_done(s); /* (none: the archiver noted them) */
	pthread_mutex_unlock(&s->mu);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
	free(s);
	return kept;
}

int ulp_session_sync(ulp_session *s, void (*failed)(void *arg, const char *path, const char *why), void *arg)
{
	pthread_mutex_lock(&s->mu);
	/* failed ones are tried again (the disk may have room now) */
	for (snode *n = s->nodes; n; n = n->next)
		if (n->state == ST_FAILED && n->path && n->dirty && final_name(n->path) && n->wh == 0)
			enqueue(s, n);
	uint64_t target = s->enq_seq;
	s->syncing++;
	if (s->writers == 0) /* someone waits, nobody writes: forward now (invariant 11) */
		__atomic_store_n(&s->nice, 0, __ATOMIC_RELAXED);
	pthread_cond_broadcast(&s->cv);
	while (s->done_seq < target)
		pthread_cond_wait(&s->cv, &s->mu);
	s->syncing--;
	pthread_cond_broadcast(&s->cv); /* re-basing may start (invariant 9) */
	int bad = 0;
	for (snode *n = s->nodes; n; n = n->next)
		if (n->state == ST_FAILED && n->path && n->dirty) {
			bad++;
			if (failed)
				failed(arg, n->path, n->why ? n->why : ulp_strerror(n->err));
		}
	if (bad)
		s->err = 0; /* reported */
	pthread_mutex_unlock(&s->mu);
	/* a shared archive: what is archived is published for the other hosts
	 * before sync returns (gen.c) */
	if (ulp_archive_publish(s->a) < 0 && failed)
		failed(arg, "", ulp_archive_errmsg(s->a));
	return bad;
}

void ulp_session_counters(ulp_session *s, ulp_session_stats *c)
{
	pthread_mutex_lock(&s->mu);
	memset(c, 0, sizeof(*c));
	c->queued = s->qlen;
	c->queued_bytes = s->queued_bytes;
	c->archived = s->archived;
	c->archived_bytes = s->archived_bytes;
	c->failed = s->failed;
	for (snode *n = s->nodes; n; n = n->next)
		if (n->path && n->dirty) {
			c->staged++;
			c->staged_bytes += node_size(n);
		}
	c->bytes_per_s = s->busy_ns ? (uint64_t)((double)s->archived_bytes * 1e9 / (double)s->busy_ns) : 0;
	c->staging_max = s->o.staging_max;
	c->archiving_nice = __atomic_load_n(&s->nice, __ATOMIC_RELAXED);
	c->archiving_overlaps = !s->defer;
	c->steps = s->steps;
	c->errors = __atomic_load_n(&s->errors, __ATOMIC_RELAXED);
	c->tidies = s->tidies;
	c->reclaimed_bytes = s->reclaimed_bytes;
	if (s->archiving && s->cur_path) {
		snprintf(c->current, sizeof(c->current), "%s", s->cur_path);
		c->current_ms = (uint64_t)(ulp_mono_ns() - s->cur_t0) / 1000000;
	}
	pthread_mutex_unlock(&s->mu);
}

int ulp_session_state(ulp_session *s, const char *path, char *dst, size_t dst_cap)
{
	pthread_mutex_lock(&s->mu);
	snode *n = find_node(s, path);
	int rc = 0;
	if (n && n->state == ST_FAILED && n->dirty)
		snprintf(dst, dst_cap, "failed %d %s", ulp_to_errno(n->err), n->why ? n->why : ulp_strerror(n->err));
	else if (n && n->dirty)
		snprintf(dst, dst_cap, "staged%s", n->queued || s->archiving ? " queued" : "");
	else if (n || find_ghost(s, path))
		snprintf(dst, dst_cap, "archived");
	else
		rc = 1;
	pthread_mutex_unlock(&s->mu);
	if (rc == 1) {
		ulp_stat st;
		rc = ulp_archive_stat(s->a, path, &st);
		if (rc == 0)
			snprintf(dst, dst_cap, "%s", st.is_dir || st.is_symlink ? "" : "archived");
	}
	return rc;
}

int ulp_session_stat_archived(ulp_session *s, const char *path, ulp_stat *st)
{
	pthread_mutex_lock(&s->mu);
	snode *n;
	s->urgent++;
	pthread_cond_broadcast(&s->cv);
	while ((n = find_node(s, path)) && n->dirty && n->state != ST_FAILED && (n->queued || s->archiving))
		pthread_cond_wait(&s->cv, &s->mu);
	s->urgent--;
	int staged = n && n->dirty;
	pthread_mutex_unlock(&s->mu);
	int rc = ulp_archive_stat(s->a, path, st);
	return rc < 0 && staged ? 1 : rc;
}

/* ---- the namespace --------------------------------------------------------- */

static void node_to_stat(snode *n, ulp_stat *st)
{
	struct stat sb;
	memset(st, 0, sizeof(*st));
	if (fstat(ulp_stage_fd(n->stage), &sb) == 0) {
		st->size = (uint64_t)sb.st_size;
		st->stored_bytes = (uint64_t)sb.st_blocks * 512;
		st->mtime = ulp_time_make(sb.st_mtim.tv_sec, sb.st_mtim.tv_nsec);
	}
	if (n->mtime_set)
		st->mtime = n->meta.mtime;
	st->mode = S_IFREG | (n->meta.mode & 07777);
	st->uid = n->meta.uid;
	st->gid = n->meta.gid;
	st->step = -1;
}

int ulp_session_stat(ulp_session *s, const char *path, ulp_stat *st)
{
	pthread_mutex_lock(&s->mu);
	snode *n = find_node(s, path);
	ghost *g = n ? NULL : find_ghost(s, path);
	if (n)
		node_to_stat(n, st);
	else if (g)
		*st = g->st;
	pthread_mutex_unlock(&s->mu);
	if (n || g)
		return 0;
	int rc = ulp_archive_stat(s->a, path, st);
	if (rc == -ULP_E_NOENT && s->a->contrib && ulp_contrib_stat_dir(s->a, path, st) == 0)
		return 0; /* made here, not yet published (contrib.c) */
	return rc;
}

int ulp_session_mkdir(ulp_session *s, const char *path, const ulp_meta *m)
{
	return s->a->contrib ? ulp_contrib_mkdir(s->a, path, m) : ulp_archive_mkdir(s->a, path, m);
}

int ulp_session_busy_under(ulp_session *s, const char *path)
{
	size_t pl = strlen(path);
	while (pl && path[pl - 1] == '/')
		pl--;
	int busy = 0;
	pthread_mutex_lock(&s->mu);
	for (snode *n = s->nodes; n && !busy; n = n->next)
		if (n->path && !ulp_session_hidden_name(n->path) && (n->wh > 0 || ulp_session_temp_name(n->path)) &&
		    (!pl || (!strncmp(n->path, path, pl) && (!n->path[pl] || n->path[pl] == '/'))))
			busy = 1;
	pthread_mutex_unlock(&s->mu);
	return busy;
}

typedef struct rd {
	ulp_session *s;
	const char *dir;
	int (*cb)(void *, const char *, const ulp_stat *);
	void *arg;
} rd;

static int readdir_cb(void *arg, const char *name, const ulp_stat *st)
{
	rd *r = arg;
	if (ulp_session_hidden_name(name))
		return 0; /* invariant 6 (an archive from before it) */
	char p[8192];
	snprintf(p, sizeof(p), "%s%s%s", r->dir, r->dir[0] ? "/" : "", name);
	pthread_mutex_lock(&r->s->mu);
	int staged = find_node(r->s, p) != NULL;
	pthread_mutex_unlock(&r->s->mu);
	return staged ? 0 : r->cb(r->arg, name, st); /* staged: listed from the node below */
}

int ulp_session_readdir(ulp_session *s, const char *path, int (*cb)(void *arg, const char *name, const ulp_stat *st),
                        void *arg)
{
	rd r = {s, path, cb, arg};
	ulp_stat dst;
	int rc = ulp_archive_readdir(s->a, path, readdir_cb, &r);
	if (rc == -ULP_E_NOENT && s->a->contrib && ulp_contrib_stat_dir(s->a, path, &dst) == 0)
		rc = 0; /* made here, not yet published: its entries are below */
	if (rc == 0 && s->a->contrib)
		rc = ulp_contrib_list_dirs(s->a, path, cb, arg);
	if (rc != 0)
		return rc;
	size_t pl = strlen(path);
	/* the nodes' names and stats first, then the callback without mu */
	size_t cnt = 0, cap = 0;
	struct ent { char *name; ulp_stat st; } *v = NULL;
	pthread_mutex_lock(&s->mu);
	for (snode *n = s->nodes; n; n = n->next) {
		if (!n->path || ulp_session_hidden_name(n->path))
			continue;
		const char *slash = strrchr(n->path, '/');
		size_t dl = slash ? (size_t)(slash - n->path) : 0;
		if (dl != pl || strncmp(n->path, path, pl) != 0)
			continue;
		if (cnt == cap) {
			cap = cap ? cap * 2 : 16;
			void *nv = realloc(v, cap * sizeof(*v));
			if (!nv) {
				rc = -ULP_E_NOMEM;
				break;
			}
			v = nv;
		}
		v[cnt].name = strdup(slash ? slash + 1 : n->path);
		if (!v[cnt].name) {
			rc = -ULP_E_NOMEM;
			break;
		}
		node_to_stat(n, &v[cnt].st);
		cnt++;
	}
	pthread_mutex_unlock(&s->mu);
	for (size_t i = 0; i < cnt; i++) {
		if (rc == 0)
			rc = cb(arg, v[i].name, &v[i].st);
		free(v[i].name);
	}
	free(v);
	return rc;
}

/* ---- handles --------------------------------------------------------------- */

int ulp_session_open_file(ulp_session *s, const char *path, int flags, const ulp_meta *create, ulp_sfile **out)
{
	int acc = flags & O_ACCMODE, trunc = !!(flags & O_TRUNC);
	int wr = create || acc != O_RDONLY;
	if (create) {
		ULP_TRY(ulp_path_check(path));
		if (ulp_session_hidden_name(path))
			return ulp_arch_err(s->a, -ULP_E_INVAL, "%s: a name reserved for files unlinked while open", path);
	}
	ulp_sfile *h = calloc(1, sizeof(*h));
	if (!h)
		return -ULP_E_NOMEM;
	h->s = s;
	h->wr = wr;
	pthread_mutex_lock(&s->mu);
	if (s->err && wr) { /* invariant 8 */
		int rc = s->err;
		s->err = 0;
		pthread_mutex_unlock(&s->mu);
		free(h);
		return ulp_arch_err(s->a, rc, "an earlier file could not be archived in the background: %s",
		                    ulp_strerror(rc));
	}
	snode *n = find_node(s, path);
	if (n && wr && s->a->contrib && n->wh == 0 && !n->queued && s->cur != n && !n->dirty &&
	    ulp_stage_taken(n->stage)) {
		/* its bytes are the archiver's now (invariant 15): new writes go to
		 * a new node, copied up from the archive */
		free(n->path);
		n->path = NULL;
		maybe_drop(s, n);
		n = NULL;
	}
	if (!n && (wr || trunc)) {
		/* a new node: the copy-up runs without mu (invariant 5) */
		pthread_mutex_unlock(&s->mu);
		ulp_stat st;
		int exists = ulp_archive_stat(s->a, path, &st) == 0;
		int rc = 0;
		if (exists && st.is_dir)
			rc = ulp_arch_err(s->a, -ULP_E_ISDIR, "%s: is a directory", path);
		else if (!exists && !create)
			rc = ulp_arch_err(s->a, -ULP_E_NOENT, "%s: no such file", path);
		ulp_stage *sg = NULL;
		if (rc == 0)
			rc = ulp_stage_new(s->a, exists && !trunc && !create ? path : NULL, &sg);
		if (rc < 0) {
			free(h);
			return rc;
		}
		ulp_meta m = create ? *create : (ulp_meta){0644, 0, 0, {0, 0}};
		m.mode &= 07777;
		m.mtime = ulp_time_now();
		if (exists) {
			m.mode = st.mode & 07777;
			m.uid = st.uid;
			m.gid = st.gid;
		}
		pthread_mutex_lock(&s->mu);
		n = find_node(s, path); /* staged by another caller meanwhile */
		if (n) {
			ulp_stage_discard(sg);
		} else {
			n = new_node(s, path, sg, &m);
			if (!n) {
				pthread_mutex_unlock(&s->mu);
				ulp_stage_discard(sg);
				free(h);
				return -ULP_E_NOMEM;
			}
			n->dirty = create || trunc || !exists;
			trunc = 0;
		}
	}
	if (n && wr && n->wh == 0 && n->dirty && (n->queued || s->cur == n)) {
		/* a closed file reopened for writing before it was archived: its
		 * staging record promises the closed bytes to a recovery, so the
		 * new writes wait for the archive to hold them, and the record
		 * goes (a crash then recovers the archived version, never a mix) */
		n->pins++;
		s->urgent++;
		pthread_cond_broadcast(&s->cv);
		while (n->queued || s->cur == n)
			pthread_cond_wait(&s->cv, &s->mu);
		s->urgent--;
		int clean = !n->dirty && n->wh == 0;
		pthread_mutex_unlock(&s->mu);
		if (clean)
			node_record(s, n, REC_FORGET);
		pthread_mutex_lock(&s->mu);
		n->pins--;
	}
	if (n && trunc) {
		if (ftruncate(ulp_stage_fd(n->stage), 0) < 0) {
			int e = errno;
			pthread_mutex_unlock(&s->mu);
			free(h);
			return ulp_arch_err(s->a, e == ENOSPC ? -ULP_E_NOSPC : -ULP_E_IO, "%s: truncate: %s", path,
			                    strerror(e));
		}
		n->dirty = 1;
		n->writes++;
	}
	if (n) {
		n->handles++;
		h->n = n;
		if (wr) {
			n->wh++;
			writer_in(s, 1);
		}
		pthread_mutex_unlock(&s->mu);
		*out = h;
		return 0;
	}
	pthread_mutex_unlock(&s->mu);
	int rc = ulp_file_open(s->a, path, &h->file);
	if (rc < 0) {
		free(h);
		return rc;
	}
	*out = h;
	return 0;
}

int ulp_session_file_archived(const ulp_sfile *h)
{
	return h->file != NULL;
}

int64_t ulp_session_read(ulp_sfile *h, void *dst, size_t dst_cap, uint64_t off)
{
	if (h->file)
		return ulp_file_pread(h->file, dst, dst_cap, off);
	ssize_t r = pread(ulp_stage_fd(h->n->stage), dst, dst_cap, (off_t)off);
	if (r < 0)
		return ulp_arch_err(h->s->a, -ULP_E_IO, "staged file: read: %s", strerror(errno));
	return r;
}

/* A handle for writing opens (+1) or goes (-1), mu held: the archiver is in
 * the background while any is open (invariant 11). */
static void writer_in(ulp_session *s, int d)
{
	s->writers += d;
	if (s->writers > 0 && !s->pressed) /* (back at once; forward at the next file: archiving_nice) */
		__atomic_store_n(&s->nice, s->bg_nice, __ATOMIC_RELAXED);
	if (d < 0) {
		s->last_write_close = ulp_mono_ns();
		pthread_cond_broadcast(&s->cv); /* the archiver's wait is shorter now */
	}
}

/* Waits while the queue holds more than staging_max bytes (invariant 7). */
static void backpressure(ulp_session *s)
{
	if (!(s->queued_bytes > s->o.staging_max && s->qhead && !s->stop))
		return;
	/* a writer waits for archiving: archiving comes forward, or it would
	 * take only what the writers leave while they wait on it (invariant 11) */
	s->pressed++;
	__atomic_store_n(&s->nice, 0, __ATOMIC_RELAXED);
	pthread_cond_broadcast(&s->cv);
	while (s->queued_bytes > s->o.staging_max && s->qhead && !s->stop)
		pthread_cond_wait(&s->cv, &s->mu);
	s->pressed--;
	archiving_nice(s);
}

int64_t ulp_session_write(ulp_sfile *h, const void *src, size_t len, uint64_t off)
{
	ulp_session *s = h->s;
	if (!h->n)
		return ulp_arch_err(s->a, -ULP_E_INVAL, "%s", "file not open for writing");
	pthread_mutex_lock(&s->mu);
	backpressure(s);
	pthread_mutex_unlock(&s->mu);
	int64_t w = ulp_stage_write(h->n->stage, src, len, off);
	if (w < 0)
		return w;
	pthread_mutex_lock(&s->mu);
	h->n->dirty = 1;
	h->n->writes++;
	pthread_mutex_unlock(&s->mu);
	return w;
}

int ulp_session_kill_suid(ulp_sfile *h)
{
	if (!h->n)
		return 0;
	pthread_mutex_lock(&h->s->mu);
	uint32_t mode = h->n->meta.mode;
	pthread_mutex_unlock(&h->s->mu);
	uint32_t kill = S_ISUID | (mode & S_IXGRP ? S_ISGID : 0);
	if (!(mode & kill))
		return 0;
	ulp_meta m = {.mode = mode & ~kill};
	return ulp_session_setattr(h->s, NULL, h, ULP_SET_MODE, &m);
}

int ulp_session_ftruncate(ulp_sfile *h, uint64_t size)
{
	ulp_session *s = h->s;
	if (!h->n)
		return ulp_arch_err(s->a, -ULP_E_INVAL, "%s", "file not open for writing");
	pthread_mutex_lock(&s->mu);
	int rc = 0;
	if (ftruncate(ulp_stage_fd(h->n->stage), (off_t)size) < 0)
		rc = ulp_arch_err(s->a, errno == ENOSPC ? -ULP_E_NOSPC : errno == EFBIG ? -ULP_E_INVAL : -ULP_E_IO,
		                  "staged file: truncate: %s", strerror(errno));
	h->n->dirty = 1;
	h->n->writes++;
	pthread_mutex_unlock(&s->mu);
	return rc;
}

int ulp_session_truncate(ulp_session *s, const char *path, uint64_t size)
{
	ulp_sfile *h;
	ULP_TRY(ulp_session_open_file(s, path, O_RDWR | (size == 0 ? O_TRUNC : 0), NULL, &h));
	int rc = ulp_session_ftruncate(h, size);
	int r2 = ulp_session_flush(h);
	ulp_session_release(h);
	return rc ? rc : r2;
}

int ulp_session_flush(ulp_sfile *h)
{
	ulp_session *s = h->s;
	snode *n = h->n;
	if (!n || !h->wr)
		return 0;
	pthread_mutex_lock(&s->mu);
	/* the last writing handle (readers may stay open): each close(2) of
	 * one of its descriptors records and queues; a dup'd descriptor may
	 * write on, so the archiver checks again (invariant 12) */
	int go = n->path && n->wh == 1 && n->dirty && !ulp_session_hidden_name(n->path);
	if (go) {
		n->pins++;
		n->fwrites = n->writes;
		n->ftime = ulp_mono_ns();
	}
	pthread_mutex_unlock(&s->mu);
	if (!go)
		return 0;
	/* recorded before close returns: kill -9 safe (invariant 2) */
	int rc = node_record(s, n, REC_RECORD);
	pthread_mutex_lock(&s->mu);
	n->pins--;
	if (rc == 0 && final_name(n->path) && n->dirty)
		enqueue(s, n);
	pthread_mutex_unlock(&s->mu);
	return rc;
}

int ulp_session_fsync(ulp_sfile *h)
{
	ulp_session *s = h->s;
	snode *n = h->n;
	if (!n)
		return 0;
	pthread_mutex_lock(&s->mu);
	n->pins++;
	pthread_mutex_unlock(&s->mu);
	/* an unlinked file is forgotten instead: never to come back (invariant 6) */
	int rc = node_record(s, n, REC_SYNC);
	pthread_mutex_lock(&s->mu);
	n->pins--;
	pthread_mutex_unlock(&s->mu);
	return rc;
}

void ulp_session_release(ulp_sfile *h)
{
	if (!h)
		return;
	ulp_session *s = h->s;
	if (h->file)
		ulp_file_close(h->file);
	snode *n = h->n;
	if (n) {
		pthread_mutex_lock(&s->mu);
		n->handles--;
		if (h->wr) {
			n->wh--;
			writer_in(s, -1);
		}
		if (n->wh == 0 && h->wr && n->dirty && final_name(n->path) && !n->queued) {
			/* its flush failed (or there was none), or the archiver let
			 * its queue entry go while it was open for writing (invariant
			 * 12): queue it now, its bytes are staged (recorded if the
			 * flush got that far) */
			enqueue(s, n);
		}
		maybe_drop(s, n);
		pthread_mutex_unlock(&s->mu);
	}
	free(h);
}

int ulp_session_fstat(ulp_sfile *h, ulp_stat *st)
{
	if (h->file) {
		*st = *ulp_file_get_stat(h->file);
		return 0;
	}
	pthread_mutex_lock(&h->s->mu);
	node_to_stat(h->n, st);
	pthread_mutex_unlock(&h->s->mu);
	return 0;
}

/* ---- names ----------------------------------------------------------------- */

static void wait_archiving(ulp_session *s, snode *n);

/* An archived file left the archive: the next idle pass re-bases what was
 * coded against it and reclaims its blobs (invariant 13). */
static void removed(ulp_session *s)
{
	pthread_mutex_lock(&s->mu);
	s->removed = 1;
	want_rebase(s);
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

/*
 * A file unlinked while open, or replaced by a rename, is hidden under the
 * name t (invariant 6): a staged file stays a node under that name, an
 * archived one leaves the archive now and lives on as a ghost.
 */
static int hide(ulp_session *s, const char *f, const char *t)
{
	ulp_stat st;
	int archived = ulp_archive_stat(s->a, f, &st) == 0;
	char *tp = strdup(t);
	ghost *g = calloc(1, sizeof(*g));
	if (!tp || !g) {
		free(tp);
		free(g);
		return -ULP_E_NOMEM;
	}
	pthread_mutex_lock(&s->mu);
	snode *n = find_node(s, f);
	int rc = 0;
	if (!n && !archived) {
		rc = ulp_arch_err(s->a, -ULP_E_NOENT, "%s: no such file", f);
	} else if (n) {
		wait_archiving(s, n);
		free(n->path);
		n->path = tp;
		tp = NULL;
		n->pins++;
	} else {
		g->path = tp;
		g->st = st;
		g->next = s->ghosts;
		s->ghosts = g;
		tp = NULL;
		g = NULL;
	}
	pthread_mutex_unlock(&s->mu);
	free(tp);
	free(g);
	if (rc < 0)
		return rc;
	if (n) { /* a crash must not bring it back */
		rc = node_record(s, n, REC_RELABEL);
		pthread_mutex_lock(&s->mu);
		n->pins--;
		maybe_drop(s, n);
		pthread_mutex_unlock(&s->mu);
	}
	if (archived || n) { /* (n: archived while we waited, maybe) */
		int r = ulp_archive_remove(s->a, f);
		if (r < 0 && r != -ULP_E_NOENT && rc == 0)
			rc = r;
		if (r == 0)
			removed(s);
	}
	return rc;
}

/* Invariant 15: a contributor changes no archived file. */
static int contrib_refuse(ulp_session *s, const char *path, const char *what)
{
	return ulp_arch_err(s->a, -ULP_E_UNSUPPORTED,
	                    "%s: cannot %s it on this host: it contributes files to an archive another host "
	                    "archives (the lease holder), and only that host changes archived files (ulpackfs(1) "
	                    "MANY HOSTS)", path, what);
}

static int has_child(void *arg, const char *name, const ulp_stat *st)
{
	(void)arg, (void)name, (void)st;
	return 1;
}

/* An archiving of n in flight ends before n's name changes, so that the
 * archive never commits a name the caller was told is gone (mu held). */
static void wait_archiving(ulp_session *s, snode *n)
{
	n->pins++;
	while (s->cur == n)
		pthread_cond_wait(&s->cv, &s->mu);
	n->pins--;
}

/* A node leaves its path (replaced or unlinked): forgets its record, and
 * goes if nobody holds it. mu held on entry and exit. */
static int unname(ulp_session *s, snode *n)
{
	wait_archiving(s, n);
	free(n->path);
	n->path = NULL;
	n->pins++;
	pthread_mutex_unlock(&s->mu);
	int rc = node_record(s, n, REC_RELABEL); /* no path: forgets */
	pthread_mutex_lock(&s->mu);
	n->pins--;
	maybe_drop(s, n);
	return rc;
}

/*
 * Renames directory f to t (mu held on entry, released on return; the
 * caller holds the directory rename slot, invariant 10). t must be empty,
 * counting staged files below it that the index does not hold yet.
 */
static int rename_dir(ulp_session *s, const char *f, const char *t, int t_arch, const ulp_stat *stt)
{
	size_t tl = strlen(t);
	for (snode *x = s->nodes; x; x = x->next)
		if (x->path && !strncmp(x->path, t, tl) && x->path[tl] == '/') {
			pthread_mutex_unlock(&s->mu);
			return ulp_arch_err(s->a, -ULP_E_NOTEMPTY, "%s: directory not empty", t);
		}
	pthread_mutex_unlock(&s->mu);
	if (t_arch && stt->is_dir && ulp_archive_readdir(s->a, t, has_child, NULL) == 1)
		return ulp_arch_err(s->a, -ULP_E_NOTEMPTY, "%s: directory not empty", t);
	ULP_TRY(ulp_archive_rename(s->a, f, t));
	/* staged files and ghosts below it move with it (invariant 4) */
	size_t fl = strlen(f);
	snode **moved = NULL;
	size_t nm = 0;
	pthread_mutex_lock(&s->mu);
	for (snode *x = s->nodes; x; x = x->next)
		if (x->path && !strncmp(x->path, f, fl) && x->path[fl] == '/') {
			char *np = malloc(strlen(t) + strlen(x->path + fl) + 1);
			snode **mv = realloc(moved, (nm + 1) * sizeof(*moved));
			if (mv)
				moved = mv;
			if (!np || !mv) {
				free(np);
				continue;
			}
			sprintf(np, "%s%s", t, x->path + fl);
			free(x->path);
			x->path = np;
			x->pins++;
			moved[nm++] = x;
		}
	for (ghost *g = s->ghosts; g; g = g->next)
		if (!strncmp(g->path, f, fl) && g->path[fl] == '/') {
			char *np = malloc(strlen(t) + strlen(g->path + fl) + 1);
			if (np) {
				sprintf(np, "%s%s", t, g->path + fl);
				free(g->path);
				g->path = np;
			}
		}
	pthread_mutex_unlock(&s->mu);
	for (size_t i = 0; i < nm; i++)
		node_record(s, moved[i], REC_RELABEL);
	pthread_mutex_lock(&s->mu);
	for (size_t i = 0; i < nm; i++) {
		moved[i]->pins--;
		maybe_drop(s, moved[i]);
	}
	pthread_mutex_unlock(&s->mu);
	free(moved);
	return 0;
}

static int rename_impl(ulp_session *s, const char *f, const char *t, unsigned flags)
{
	if (ulp_session_hidden_name(t))
		return hide(s, f, t);
	ULP_TRY(ulp_path_check(t));
	if (!strcmp(f, t))
		return 0;
	ulp_stat sf, stt;
	int f_arch = ulp_archive_stat(s->a, f, &sf) == 0;
	int t_arch = ulp_archive_stat(s->a, t, &stt) == 0;
	pthread_mutex_lock(&s->mu);
	snode *n = find_node(s, f), *old = find_node(s, t);
	if ((flags & ULP_RENAME_NOREPLACE) && (old || t_arch)) {
		pthread_mutex_unlock(&s->mu);
		return ulp_arch_err(s->a, -ULP_E_EXIST, "%s: exists", t);
	}
	if (!n && !f_arch) {
		pthread_mutex_unlock(&s->mu);
		return ulp_arch_err(s->a, -ULP_E_NOENT, "%s: no such file or directory", f);
	}
	if (s->a->contrib && (!n || ulp_stage_taken(n->stage))) {
		pthread_mutex_unlock(&s->mu);
		return contrib_refuse(s, f, "rename");
	}
	if (n && t_arch && stt.is_dir) {
		pthread_mutex_unlock(&s->mu);
		return ulp_arch_err(s->a, -ULP_E_ISDIR, "%s: is a directory", t);
	}
	if (!n && sf.is_dir) {
		while (s->dir_from) /* invariant 10 */
			pthread_cond_wait(&s->cv, &s->mu);
		s->dir_from = f;
		s->dir_to = t;
		while (below(s->cur_path, f) || below(s->cur_path, t))
			pthread_cond_wait(&s->cv, &s->mu);
		int rc = rename_dir(s, f, t, t_arch, &stt); /* returns with mu released */
		pthread_mutex_lock(&s->mu);
		s->dir_from = s->dir_to = NULL;
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mu);
		return rc;
	}
	char *np = strdup(t);
	if (!np) {
		pthread_mutex_unlock(&s->mu);
		return -ULP_E_NOMEM;
	}
	int rc = 0;
	if (n)
		n->pins++; /* held across unname, which releases mu */
	if (old && old != n)
		rc = unname(s, old); /* replaced: forgotten before we return */
	if (n)
		n->pins--;
	if (!n) { /* an archived file, nothing staged */
		free(np);
		pthread_mutex_unlock(&s->mu);
		return rc < 0 ? rc : ulp_archive_rename(s->a, f, t);
	}
	wait_archiving(s, n);
	free(n->path);
	n->path = np;
	n->pins++;
	pthread_mutex_unlock(&s->mu);
	/* its archived version moves too: nothing stays under f, and t has
	 * it until the node is archived over it (stat again: it may have been
	 * archived while we waited) */
	f_arch = ulp_archive_stat(s->a, f, &sf) == 0;
	if (f_arch && !sf.is_dir) {
		int r = ulp_archive_rename(s->a, f, t);
		if (r < 0 && r != -ULP_E_NOENT)
			slog(s, "renaming %s: %s", f, ulp_archive_errmsg(s->a));
	}
	int r = node_record(s, n, REC_RELABEL);
	pthread_mutex_lock(&s->mu);
	n->pins--;
	/* a closed file given its final name is archived (invariant 2) */
	if (r == 0 && n->wh == 0 && n->dirty && final_name(n->path)) {
		backpressure(s);
		enqueue(s, n);
	}
	pthread_mutex_unlock(&s->mu);
	return rc < 0 ? rc : r;
}

int ulp_session_rename(ulp_session *s, const char *f, const char *t, unsigned flags)
{
	int rc = rename_impl(s, f, t, flags);
	if (rc == 0 && !ulp_session_hidden_name(t)) {
		pthread_mutex_lock(&s->mu);
		want_rebase(s); /* the archiver re-bases when idle (invariant 9) */
		s->removed = 1; /* it may have replaced a file (invariant 13) */
		pthread_cond_broadcast(&s->cv);
		pthread_mutex_unlock(&s->mu);
	}
	return rc;
}

int ulp_session_unlink(ulp_session *s, const char *path)
{
	pthread_mutex_lock(&s->mu);
	for (ghost **gp = &s->ghosts; *gp; gp = &(*gp)->next)
		if (!strcmp((*gp)->path, path)) { /* its last close (invariant 6) */
			ghost *g = *gp;
			*gp = g->next;
			free(g->path);
			free(g);
			pthread_mutex_unlock(&s->mu);
			return 0;
		}
	snode *n = find_node(s, path);
	if (s->a->contrib && (!n || ulp_stage_taken(n->stage))) {
		pthread_mutex_unlock(&s->mu);
		return n || !ulp_session_hidden_name(path) ? contrib_refuse(s, path, "remove") : 0;
	}
	int rc = n ? unname(s, n) : 0;
	pthread_mutex_unlock(&s->mu);
	if (rc < 0 || s->a->contrib)
		return rc;
	/* a hidden name lives only while its file is open (invariant 6); its
	 * node goes at the last release unless something else (a queue entry
	 * of the archiver) still pins it: an unlink after that release finds
	 * nothing, whatever the archiver's timing, and that is success */
	if (!n && ulp_session_hidden_name(path))
		return 0;
	rc = ulp_archive_remove(s->a, path);
	if (rc == 0)
		removed(s);
	return rc == -ULP_E_NOENT && n ? 0 : rc;
}

int ulp_session_rmdir(ulp_session *s, const char *path)
{
	if (s->a->contrib)
		return contrib_refuse(s, path, "remove");
	ulp_stat st;
	ULP_TRY(ulp_archive_stat(s->a, path, &st));
	if (!st.is_dir)
		return ulp_arch_err(s->a, -ULP_E_NOTDIR, "%s: not a directory", path);
	size_t pl = strlen(path);
	pthread_mutex_lock(&s->mu);
	for (snode *n = s->nodes; n; n = n->next)
		if (n->path && !strncmp(n->path, path, pl) && n->path[pl] == '/' && !ulp_session_hidden_name(n->path)) {
			pthread_mutex_unlock(&s->mu);
			return ulp_arch_err(s->a, -ULP_E_NOTEMPTY, "%s: directory not empty", path);
		}
	pthread_mutex_unlock(&s->mu);
	return ulp_archive_remove(s->a, path);
}

int ulp_session_setattr(ulp_session *s, const char *path, ulp_sfile *h, unsigned which, const ulp_meta *m)
{
	pthread_mutex_lock(&s->mu);
	snode *n = h && h->n ? h->n : path ? find_node(s, path) : NULL;
	if (s->a->contrib && (!n || !n->dirty || ulp_stage_taken(n->stage))) {
		pthread_mutex_unlock(&s->mu);
		return contrib_refuse(s, path ? path : "(open file)", "change");
	}
	if (n) {
		if (which & ULP_SET_MODE)
			n->meta.mode = m->mode & 07777;
		if (which & ULP_SET_OWNER) {
			if (m->uid != (uint32_t)-1)
				n->meta.uid = m->uid;
			if (m->gid != (uint32_t)-1)
				n->meta.gid = m->gid;
		}
		if (which & ULP_SET_MTIME) {
			n->meta.mtime = m->mtime;
			n->mtime_set = 1;
		}
		n->attrs++;
		/* a node identical to its archived version (opened for writing,
		 * nothing written: touch, futimens, fchmod) is not archived again:
		 * the archive takes the change now */
		char *p = !n->dirty && final_name(n->path) ? strdup(n->path) : NULL;
		int dirty = n->dirty;
		ulp_meta nm = n->meta;
		n->pins++;
		pthread_mutex_unlock(&s->mu);
		int rc = 0;
		if (p) {
			rc = ulp_archive_setattr(s->a, p, which, &nm);
			if (rc == -ULP_E_NOENT)
				rc = 0;
		}
		/* invariant 4: a staged file's record carries its metadata, so a
		 * chmod that returned survives a crash before the archiving (a
		 * record is rewritten only where the close wrote one) */
		if (rc == 0 && dirty)
			rc = node_record(s, n, REC_RELABEL);
		pthread_mutex_lock(&s->mu);
		n->pins--;
		maybe_drop(s, n);
		pthread_mutex_unlock(&s->mu);
		free(p);
		return rc;
	}
	ghost *g = path ? find_ghost(s, path) : NULL;
	if (g) { /* unlinked while open: only its stat changes (invariant 6) */
		if (which & ULP_SET_MODE)
			g->st.mode = (g->st.mode & ~07777u) | (m->mode & 07777);
		if ((which & ULP_SET_OWNER) && m->uid != (uint32_t)-1)
			g->st.uid = m->uid;
		if ((which & ULP_SET_OWNER) && m->gid != (uint32_t)-1)
			g->st.gid = m->gid;
		if (which & ULP_SET_MTIME)
			g->st.mtime = m->mtime;
		pthread_mutex_unlock(&s->mu);
		return 0;
	}
	pthread_mutex_unlock(&s->mu);
	if (!path)
		return ulp_arch_err(s->a, -ULP_E_NOENT, "%s", "no such file");
	ulp_meta mm = *m;
	if (which & ULP_SET_OWNER) {
		ulp_stat st;
		if (ulp_archive_stat(s->a, path, &st) == 0) {
			if (mm.uid == (uint32_t)-1)
				mm.uid = st.uid;
			if (mm.gid == (uint32_t)-1)
				mm.gid = st.gid;
		}
	}
	return ulp_archive_setattr(s->a, path, which, &mm);
}
