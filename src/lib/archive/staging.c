/* SPDX-License-Identifier: MIT */
/*
 * staging.c - files being written through a mount live in ARCHIVE/staging
 * until they are archived: <tag>-<n>.data holds the bytes, <tag>-<n>.meta
 * (once the file was fsynced, or closed under a name that waits for a rename)
 * its archive path and metadata.
 *
 * A .meta file is "ULPM3 <mode octal> <uid> <gid> <mtime seconds> <mtime
 * nanoseconds> <path bytes>\n" followed by exactly that many bytes of path
 * (any byte but NUL, newlines included). Meta files of older versions are
 * still read: "ULPM2 <mode> <uid> <gid> <mtime_ns> <path bytes>\n" and the
 * path, and "<mode> <uid> <gid> <mtime_ns>\n" followed by the path (the rest
 * of the file). <tag> is ulp_proc_tag's "<pid>-<host>" (older versions:
 * the pid alone).
 *
 * Invariants:
 *  1. A staged file is archived with ulp_archive_put(), which verifies and
 *     commits atomically; only then are its staging files removed.
 *  2. After ulp_stage_sync() returns, the data and the sidecar are durable:
 *     a crash before the commit leaves a file ulp_stage_recover() archives
 *     at the next mount. After ulp_stage_record() returns, the same holds
 *     for a crash of the process (kill -9), not for power loss. Staged files
 *     without a sidecar were never promised to anyone and are removed at
 *     recovery.
 *  3. A sidecar is written to <meta>.tmp and renamed over <meta>, so it is
 *     whole or absent; recovery removes the .tmp files of dead processes.
 *  4. A sidecar names the path its caller last gave it (ulp_stage_relabel
 *     follows renames); ulp_stage_forget removes it, durably, before a
 *     superseded or unlinked file could be brought back by a recovery.
 *  5. On a shared archive on a directory (store/shared.h), a writer that
 *     takes the lease first claims every staged file it did not make:
 *     renames it to c<epoch>-<seq>.{meta,data}, seq in the order the files
 *     were staged (claimed ones before, then by the data's mtime), before it
 *     reads which generation is the newest (gen.c invariant 7). A fenced
 *     writer removes its files by name, so none of its late removals lands
 *     on a file the new writer counts on; recovery archives claimed files
 *     in seq order, so a later version of a path wins.
 *  6. There, a staged file archived stays until a publication holds it (gen.c
 *     invariant 8: ulp_stage_archived, and recovery): a writer killed or
 *     partitioned before it published loses nothing that its successor,
 *     which starts from the newest generation, does not find in staging/.
 *  7. A record of what the sidecar already holds, as durable as asked, is
 *     not written again (the close after an fsync: DCP's sync_files, a
 *     trainer's save; two fsyncs saved a file): rec_path and rec_meta are
 *     the sidecar's content whenever meta_state is not META_NONE.
 *  8. Many hosts write (archive/contrib.c): a contributor (a host whose
 *     lease another holds) stages in staging/h-<host>/, same names and
 *     sidecars, its data file made 0600 and turned 0640 when closed
 *     (ulp_stage_record): the archiver takes (ulp_stage_take) only files
 *     that are 0640 with a whole sidecar naming a final path, by renaming
 *     the sidecar, then the data, into its own staging/ as a claimed file
 *     (c<epoch>-<seq>, seq from 1000000000 up, after the open's claims), so
 *     from then on invariants 5-6 hold for it: a killed archiver's
 *     successor claims and archives it.
 */
#include "arch_int.h"
#include "store/shared.h"
#include "archive/writer.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct ulp_stage {
	ulp_archive *a;
	int fd;
	char data[4200];
	char meta[4200];
	int meta_state; /* 0 no sidecar, 1 recorded (kill -9 safe), 2 durable (fsynced) */
	char *rec_path; /* what the sidecar on disk holds (invariant 7), or NULL */
	ulp_meta rec_meta;
	char origin[4200]; /* taken from a contributor (invariant 8): its dir/base, else "" */
};

enum { META_NONE, META_RECORDED, META_DURABLE };

/* The directory a's own staged files live in (invariant 8). */
static void stage_dir(const ulp_archive *a, char *dir, size_t cap)
{
	if (a->contrib_dir)
		snprintf(dir, cap, "%s", a->contrib_dir);
	else
		snprintf(dir, cap, "%s/staging", a->dir);
}

int ulp_stage_new(ulp_archive *a, const char *copy_from, ulp_stage **out)
{
	static unsigned counter;
	if (a->read_only && !a->contrib)
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: archive is mounted read-only", a->dir);
	ULP_TRY(ulp_lease_ok(a)); /* a writer that lost a shared archive's lease takes no more files */
	ulp_stage *s = calloc(1, sizeof(*s));
	if (!s)
		return -ULP_E_NOMEM;
	s->a = a;
	char me[ULP_PROC_TAG_MAX], dir[4200];
	ulp_proc_tag(me, sizeof(me));
	stage_dir(a, dir, sizeof(dir));
	for (int tries = 0;; tries++) {
		unsigned n = __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
		snprintf(s->data, sizeof(s->data), "%.4000s/%s-%u.data", dir, me, n);
		snprintf(s->meta, sizeof(s->meta), "%.4000s/%s-%u.meta", dir, me, n);
		s->fd = open(s->data, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (s->fd >= 0 || errno != EEXIST || tries > 1000)
			break;
	}
	if (s->fd < 0) {
		int rc = ulp_arch_io_err(a, s->data, "create");
		free(s);
		return rc;
	}
	if (copy_from) { /* copy-up of an archived file being modified */
		ulp_file *f = NULL;
		int rc = ulp_file_open(a, copy_from, &f);
		uint8_t *buf = rc == 0 ? malloc((size_t)8 << 20) : NULL;
		if (rc == 0 && !buf)
			rc = -ULP_E_NOMEM;
		for (uint64_t off = 0; rc == 0 && off < ulp_file_get_stat(f)->size;) {
			int64_t n = ulp_file_pread(f, buf, (size_t)8 << 20, off);
			if (n <= 0) {
				rc = n < 0 ? (int)n : -ULP_E_IO;
				break;
			}
			if (pwrite(s->fd, buf, (size_t)n, (off_t)off) != n)
				rc = ulp_arch_io_err(a, s->data, "write");
			off += (uint64_t)n;
		}
		free(buf);
		if (f)
			ulp_file_close(f);
		if (rc < 0) {
			ulp_stage_discard(s);
			return rc;
		}
	}
	*out = s;
	return 0;
}

int ulp_stage_fd(const ulp_stage *s)
{
	return s->fd;
}

int64_t ulp_stage_write(ulp_stage *s, const void *buf, size_t len, uint64_t off)
{
	/* (starting writeback early with sync_file_range was measured: it made
	 * rsync into the mount about 10 % slower, so the fsync of
	 * ulp_stage_sync does all of it) */
	ssize_t w = pwrite(s->fd, buf, len, (off_t)off);
	return w < 0 ? ulp_arch_io_err(s->a, s->data, "write") : w;
}

static int fsync_staging(ulp_archive *a)
{
	char dir[4300];
	stage_dir(a, dir, sizeof(dir));
	return (errno = ulp_fsync_dir(dir)) != 0 ? ulp_arch_io_err(a, dir, "fsync") : 0;
}

/* Writes the sidecar (invariant 3); durable: fsynced, with its directory. */
static int write_meta(ulp_stage *s, const char *path, const ulp_meta *m, int durable)
{
	ulp_archive *a = s->a;
	char tmp[4300];
	snprintf(tmp, sizeof(tmp), "%s.tmp", s->meta);
	int mfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600); /* private: archive.c */
	FILE *f = mfd >= 0 ? fdopen(mfd, "w") : NULL;
	if (!f) {
		if (mfd >= 0)
			close(mfd);
		return ulp_arch_io_err(a, tmp, "create");
	}
	size_t pl = strlen(path);
	fprintf(f, "ULPM3 %o %u %u %lld %u %zu\n", m->mode & 07777, m->uid, m->gid, (long long)m->mtime.sec,
	        (unsigned)m->mtime.nsec, pl);
	fwrite(path, 1, pl, f);
	int bad = fflush(f) != 0 || ferror(f) || (durable && fsync(fileno(f)) != 0);
	if (fclose(f) != 0 || bad) {
		int rc = ulp_arch_io_err(a, tmp, "write");
		unlink(tmp);
		return rc;
	}
	if (rename(tmp, s->meta) < 0) {
		int rc = ulp_arch_io_err(a, s->meta, "rename");
		unlink(tmp);
		return rc;
	}
	if (durable)
		ULP_TRY(fsync_staging(a));
	s->meta_state = durable ? META_DURABLE : s->meta_state > META_RECORDED ? s->meta_state : META_RECORDED;
	char *keep = strdup(path);
	free(s->rec_path);
	s->rec_path = keep; /* NULL (no memory): the next record writes again */
	s->rec_meta = *m;
	return 0;
}

/* Invariant 7: the sidecar already holds path and m. */
static int recorded(const ulp_stage *s, const char *path, const ulp_meta *m)
{
	const ulp_meta *r = &s->rec_meta;
	return s->meta_state != META_NONE && s->rec_path && strcmp(s->rec_path, path) == 0 &&
	       (r->mode & 07777) == (m->mode & 07777) && r->uid == m->uid && r->gid == m->gid &&
	       r->mtime.sec == m->mtime.sec && r->mtime.nsec == m->mtime.nsec;
}

int ulp_stage_sync(ulp_stage *s, const char *path, const ulp_meta *m)
{
	if (fsync(s->fd) < 0)
		return ulp_arch_io_err(s->a, s->data, "fsync");
	return write_meta(s, path, m, 1);
}

int ulp_stage_record(ulp_stage *s, const char *path, const ulp_meta *m)
{
	ulp_stage_mark_closed(s); /* (a contributor's: invariant 8) */
	if (recorded(s, path, m)) /* as durable as before: meta_state stays */
		return 0;
	return write_meta(s, path, m, s->meta_state == META_DURABLE);
}

void ulp_stage_mark_closed(ulp_stage *s)
{
	if (s->a->contrib)
		fchmod(s->fd, 0640);
}

const char *ulp_stage_origin(const ulp_stage *s)
{
	return s->origin;
}

const char *ulp_stage_data_name(const ulp_stage *s)
{
	return s->data;
}

int ulp_stage_taken(const ulp_stage *s)
{
	return access(s->data, F_OK) != 0 && errno == ENOENT;
}

int ulp_stage_take(ulp_archive *a, const char *dir, const char *base, ulp_stage **out)
{
	static uint64_t counter;
	*out = NULL;
	if (!a->sh || !a->sh->writer)
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: only the lease holder takes other hosts' files", a->dir);
	ulp_stage *s = calloc(1, sizeof(*s));
	if (!s)
		return -ULP_E_NOMEM;
	s->a = a;
	s->fd = -1;
	/* after the claims of the open (seq below nc), in the order taken */
	uint64_t seq = 1000000000ULL + __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED);
	char from[4600];
	snprintf(s->origin, sizeof(s->origin), "%.4000s/%.180s", dir, base);
	snprintf(s->data, sizeof(s->data), "%s/staging/c%020llu-%010llu.data", a->dir, (unsigned long long)a->sh->epoch,
	         (unsigned long long)seq);
	snprintf(s->meta, sizeof(s->meta), "%s/staging/c%020llu-%010llu.meta", a->dir, (unsigned long long)a->sh->epoch,
	         (unsigned long long)seq);
	int rc = 0;
	snprintf(from, sizeof(from), "%s.meta", s->origin);
	if (rename(from, s->meta) < 0) { /* the sidecar first: a contributor's forget wins or loses whole */
		rc = errno == ENOENT ? -ULP_E_NOENT : ulp_arch_io_err(a, from, "rename");
		free(s);
		return rc;
	}
	snprintf(from, sizeof(from), "%s.data", s->origin);
	if (rename(from, s->data) < 0) {
		rc = errno == ENOENT ? -ULP_E_NOENT : ulp_arch_io_err(a, from, "rename");
		unlink(s->meta);
		free(s);
		return rc;
	}
	s->fd = open(s->data, O_RDWR | O_CLOEXEC);
	if (s->fd < 0) {
		rc = ulp_arch_io_err(a, s->data, "open");
		free(s); /* its files stay claimed: the next writer's recovery archives them */
		return rc;
	}
	s->meta_state = META_RECORDED;
	if ((rc = fsync_staging(a)) < 0) {
		ulp_stage_close(s);
		return rc;
	}
	*out = s;
	return 0;
}

int ulp_stage_relabel(ulp_stage *s, const char *path, const ulp_meta *m)
{
	if (s->meta_state == META_NONE)
		return 0; /* nothing on disk names it */
	return write_meta(s, path, m, s->meta_state == META_DURABLE);
}

int ulp_stage_forget(ulp_stage *s)
{
	if (s->meta_state == META_NONE)
		return 0;
	if (unlink(s->meta) < 0 && errno != ENOENT)
		return ulp_arch_io_err(s->a, s->meta, "unlink");
	int durable = s->meta_state == META_DURABLE;
	s->meta_state = META_NONE;
	free(s->rec_path);
	s->rec_path = NULL;
	return durable ? fsync_staging(s->a) : 0;
}

int ulp_stage_commit(ulp_stage *s, const char *path, const ulp_meta *m, ulp_put_result *res)
{
	int rc = ulp_archive_put(s->a, path, s->fd, m, res);
	if (rc == 0)
		ulp_stage_archived(s);
	return rc;
}

/* Whether archived staged files wait for a publication (invariant 6). */
static int keeps_archived(const ulp_archive *a)
{
	return a->sh && a->sh->writer && !a->rm;
}

/* A staged file's two files after it was archived: kept until a publication
 * holds it (invariant 6), else removed. */
static void archived_files(ulp_archive *a, const char *data, const char *meta)
{
	if (keeps_archived(a) && access(meta, F_OK) == 0 && ulp_shared_retain(a, data, meta) == 0)
		return;
	unlink(data);
	unlink(meta);
}

void ulp_stage_archived(ulp_stage *s)
{
	if (!s)
		return;
	if (s->fd >= 0)
		close(s->fd);
	archived_files(s->a, s->data, s->meta);
	free(s->rec_path);
	free(s);
}

void ulp_stage_discard(ulp_stage *s)
{
	if (!s)
		return;
	if (s->fd >= 0)
		close(s->fd);
	unlink(s->data);
	unlink(s->meta);
	free(s->rec_path);
	free(s);
}

void ulp_stage_close(ulp_stage *s)
{
	if (!s)
		return;
	if (s->fd >= 0)
		close(s->fd);
	free(s->rec_path);
	free(s);
}

/* Parses a sidecar (either format, see the file's header) into path and m;
 * 0 if it is whole and names a path. */
int ulp_stage_read_meta(const char *file, char *path, size_t cap, ulp_meta *m)
{
	char buf[4400];
	FILE *f = fopen(file, "r");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	int more = fgetc(f) != EOF;
	fclose(f);
	if (more)
		return -1;
	buf[n] = 0;
	unsigned mode;
	long long mt, ns = 0;
	size_t pl;
	int at = -1, v3 = !strncmp(buf, "ULPM3 ", 6);
	const char *p;
	if (v3) {
		if (sscanf(buf + 6, "%o %u %u %lld %lld %zu%n", &mode, &m->uid, &m->gid, &mt, &ns, &pl, &at) != 6 ||
		    at < 0 || buf[6 + at] != '\n' || ns < 0 || ns > 999999999)
			return -1;
		p = buf + 6 + at + 1;
		if ((size_t)(buf + n - p) != pl)
			return -1; /* a length that does not match: not ours */
	} else if (!strncmp(buf, "ULPM2 ", 6)) {
		if (sscanf(buf + 6, "%o %u %u %lld %zu%n", &mode, &m->uid, &m->gid, &mt, &pl, &at) != 5 || at < 0 ||
		    buf[6 + at] != '\n')
			return -1;
		p = buf + 6 + at + 1;
		if ((size_t)(buf + n - p) != pl)
			return -1; /* a length that does not match: not ours */
	} else { /* the first format: the path is the rest of the file */
		if (sscanf(buf, "%o %u %u %lld%n", &mode, &m->uid, &m->gid, &mt, &at) != 4 || at < 0 ||
		    buf[at] != '\n')
			return -1;
		p = buf + at + 1;
		pl = (size_t)(buf + n - p);
	}
	if (pl == 0 || pl >= cap || memchr(p, 0, pl))
		return -1;
	memcpy(path, p, pl);
	path[pl] = 0;
	m->mode = mode;
	m->mtime = v3 ? ulp_time_make(mt, ns) : ulp_time_from_ns(mt);
	return 0;
}

/* Whether a name in staging/ is this process's: "<tag>-..." */
static int mine(const char *name)
{
	char me[ULP_PROC_TAG_MAX];
	ulp_proc_tag(me, sizeof(me));
	size_t l = strlen(me);
	return !strncmp(name, me, l) && name[l] == '-';
}

/* A claimed file's name (invariant 5): "c", 20 digits of epoch, "-". */
static int is_claimed(const char *name)
{
	return name[0] == 'c' && strlen(name) > 22 && name[21] == '-' && strspn(name + 1, "0123456789") == 20;
}

static int name_cmp(const void *x, const void *y)
{
	const char *const *p = x, *const *q = y;
	int cp = is_claimed(*p), cq = is_claimed(*q);
	if (cp != cq)
		return cq - cp; /* claimed ones (staged earlier) first */
	return strcmp(*p, *q);
}

/* The names in staging/, sorted by name_cmp: 0, or NOENT (no staging/). */
static int staging_names(ulp_archive *a, const char *dir, char ***out, size_t *n)
{
	*out = NULL;
	*n = 0;
	DIR *d = opendir(dir);
	if (!d)
		return errno == ENOENT ? -ULP_E_NOENT : ulp_arch_io_err(a, dir, "opendir");
	size_t cap = 0;
	int rc = 0;
	for (struct dirent *de; rc == 0 && (de = readdir(d));) {
		if (de->d_name[0] == '.')
			continue;
		if ((rc = ulp_grow(out, &cap, *n, sizeof(**out))) == 0 && !((*out)[*n] = strdup(de->d_name)))
			rc = -ULP_E_NOMEM;
		if (rc == 0)
			(*n)++;
	}
	closedir(d);
	if (rc == 0 && *n > 1)
		qsort(*out, *n, sizeof(**out), name_cmp);
	return rc;
}

static void free_names(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i]);
	free(v);
}

typedef struct claim {
	char *base;        /* name without .data */
	int claimed;       /* claimed before (c<epoch>-...) */
	int64_t mtime_ns;  /* of its data */
} claim;

static int claim_cmp(const void *x, const void *y)
{
	const claim *p = x, *q = y;
	if (p->claimed != q->claimed)
		return q->claimed - p->claimed;
	if (p->claimed)
		return strcmp(p->base, q->base);
	if (p->mtime_ns != q->mtime_ns)
		return p->mtime_ns < q->mtime_ns ? -1 : 1;
	return strcmp(p->base, q->base);
}

int ulp_stage_claim(ulp_archive *a)
{
	if (!keeps_archived(a))
		return 0;
	char dir[4300];
	snprintf(dir, sizeof(dir), "%s/staging", a->dir);
	char **names;
	size_t n;
	int rc = staging_names(a, dir, &names, &n);
	if (rc == -ULP_E_NOENT)
		return 0;
	ULP_TRY(rc);
	claim *c = calloc(n ? n : 1, sizeof(*c));
	size_t nc = 0;
	if (!c)
		rc = -ULP_E_NOMEM;
	for (size_t i = 0; rc == 0 && i < n; i++) {
		size_t l = strlen(names[i]);
		if (l < 6 || strcmp(names[i] + l - 5, ".data") || mine(names[i]))
			continue;
		char data[4600], meta[4600];
		struct stat sb;
		snprintf(data, sizeof(data), "%s/%s", dir, names[i]);
		snprintf(meta, sizeof(meta), "%s/%.*s.meta", dir, (int)(l - 5), names[i]);
		if (stat(meta, &sb) < 0 || stat(data, &sb) < 0)
			continue; /* never recorded: recovery removes it */
		c[nc].base = names[i];
		c[nc].base[l - 5] = 0;
		c[nc].claimed = is_claimed(names[i]);
		c[nc].mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
		nc++;
	}
	if (nc > 1)
		qsort(c, nc, sizeof(*c), claim_cmp);
	unsigned moved = 0;
	for (size_t i = 0; rc == 0 && i < nc; i++) {
		char from[4600], to[4600];
		char nb[64];
		snprintf(nb, sizeof(nb), "c%020llu-%010zu", (unsigned long long)a->sh->epoch, i);
		snprintf(from, sizeof(from), "%s/%s.meta", dir, c[i].base);
		snprintf(to, sizeof(to), "%s/%s.meta", dir, nb);
		if (rename(from, to) < 0) {
			if (errno != ENOENT)
				rc = ulp_arch_io_err(a, from, "rename");
			continue; /* gone meanwhile: not ours to archive */
		}
		snprintf(from, sizeof(from), "%s/%s.data", dir, c[i].base);
		snprintf(to, sizeof(to), "%s/%s.data", dir, nb);
		if (rename(from, to) < 0) {
			int e = errno;
			snprintf(from, sizeof(from), "%s/%s.meta", dir, nb);
			unlink(from);
			if (e != ENOENT) {
				errno = e;
				rc = ulp_arch_io_err(a, to, "rename");
			}
			continue;
		}
		moved++;
	}
	if (rc == 0 && moved)
		rc = fsync_staging(a);
	free(c);
	free_names(names, n);
	return rc;
}

int ulp_stage_recover(ulp_archive *a, unsigned *recovered, unsigned *removed)
{
	char dir[4300];
	snprintf(dir, sizeof(dir), "%s/staging", a->dir);
	*recovered = *removed = 0;
	char **names;
	size_t nn;
	int rc = staging_names(a, dir, &names, &nn);
	if (rc < 0)
		return rc == -ULP_E_NOENT ? 0 : rc;
	for (size_t i = 0; i < nn; i++) {
		const char *name = names[i];
		size_t l = strlen(name);
		char data[4600], meta[4600], path[4096];
		if (mine(name))
			continue;
		if ((l > 4 && !strcmp(name + l - 4, ".tmp")) || (l > 5 && !strcmp(name + l - 5, ".meta"))) {
			/* a sidecar being written when its process died (invariant 3),
			 * or one whose data file is gone: nothing to recover */
			snprintf(meta, sizeof(meta), "%s/%s", dir, name);
			snprintf(data, sizeof(data), "%s/%.*s.data", dir, (int)(l - 5), name);
			if (name[l - 1] == 'p' || access(data, F_OK) != 0)
				unlink(meta);
			continue;
		}
		if (l < 6 || strcmp(name + l - 5, ".data") != 0)
			continue;
		snprintf(data, sizeof(data), "%s/%s", dir, name);
		snprintf(meta, sizeof(meta), "%s/%.*s.meta", dir, (int)(l - 5), name);
		ulp_meta m = {0};
		if (ulp_stage_read_meta(meta, path, sizeof(path), &m) == 0) {
			int fd = open(data, O_RDONLY | O_CLOEXEC);
			int r = fd >= 0 ? ulp_archive_put(a, path, fd, &m, NULL) : ulp_arch_io_err(a, data, "open");
			if (fd >= 0)
				close(fd);
			if (r < 0) {
				rc = r; /* keep the staged file: it may be archived later */
				continue;
			}
			(*recovered)++;
			archived_files(a, data, meta);
			continue;
		}
		(*removed)++;
		unlink(data);
		unlink(meta);
	}
	free_names(names, nn);
	return rc;
}

/* 1 if process pid has ended (gone, or a zombie not reaped yet) */
static int process_gone(long pid)
{
	if (kill((pid_t)pid, 0) < 0)
		return errno == ESRCH;
	char p[64], st[256];
	snprintf(p, sizeof(p), "/proc/%ld/stat", pid);
	FILE *f = fopen(p, "r");
	if (!f)
		return 0;
	size_t n = fread(st, 1, sizeof(st) - 1, f);
	fclose(f);
	st[n] = 0;
	const char *c = strrchr(st, ')'); /* "pid (comm) S ..." */
	return c && c[1] == ' ' && c[2] == 'Z';
}

int ulp_stage_orphans(ulp_archive *a, unsigned *n)
{
	char dir[4300], meta[4600];
	snprintf(dir, sizeof(dir), "%s/staging", a->dir);
	*n = 0;
	DIR *d = opendir(dir);
	if (!d)
		return errno == ENOENT ? 0 : ulp_arch_io_err(a, dir, "opendir");
	struct dirent *de;
	while ((de = readdir(d))) {
		size_t l = strlen(de->d_name);
		long pid = strtol(de->d_name, NULL, 10);
		if (l < 6 || strcmp(de->d_name + l - 5, ".data") != 0 || pid <= 0)
			continue;
		if (pid == (long)getpid() || !process_gone(pid))
			continue; /* a live process's (a mount's) */
		snprintf(meta, sizeof(meta), "%s/%.*s.meta", dir, (int)(l - 5), de->d_name);
		*n += access(meta, F_OK) == 0; /* only recorded ones come back */
	}
	closedir(d);
	return 0;
}

int ulp_stage_recover_unmounted(ulp_archive *a, unsigned *recovered)
{
	int fd;
	char err[512];
	*recovered = 0;
	if (a->read_only)
		return ulp_arch_err(a, -ULP_E_INVAL, "%s: archive is open read-only", a->dir);
	int rc = ulp_mount_lock(a->dir, &fd, NULL, err, sizeof(err));
	if (rc < 0)
		return ulp_arch_err(a, rc, "%s", err);
	unsigned removed;
	rc = ulp_stage_recover(a, recovered, &removed);
	close(fd);
	return rc;
}

int ulp_stage_sweep_own(ulp_archive *a)
{
	const char *dir = a->contrib_dir;
	if (!dir)
		return 0;
	char me[ULP_PROC_TAG_MAX];
	ulp_proc_tag(me, sizeof(me));
	const char *host = strchr(me, '-'); /* "<pid>-<host>" */
	DIR *d = opendir(dir);
	if (!d || !host)
		return d ? (closedir(d), 0) : ulp_arch_io_err(a, dir, "opendir");
	size_t hl = strlen(host);
	for (struct dirent *de; (de = readdir(d));) {
		char *end;
		long pid = strtol(de->d_name, &end, 10);
		if (pid <= 0 || strncmp(end, host, hl) != 0 || end[hl] != '-' || !process_gone(pid))
			continue; /* another host's name, or a live process's */
		char p[4600], data[4600];
		struct stat sb;
		size_t l = strlen(de->d_name);
		snprintf(p, sizeof(p), "%.4300s/%.255s", dir, de->d_name);
		if (l > 4 && !strcmp(de->d_name + l - 4, ".tmp")) {
			unlink(p); /* a sidecar being written when it died */
		} else if (l > 5 && !strcmp(de->d_name + l - 5, ".data")) {
			if (stat(p, &sb) == 0 && (sb.st_mode & 0777) != 0640) { /* never closed: never promised */
				snprintf(data, sizeof(data), "%.4300s/%.*s.meta", dir, (int)(l - 5 > 250 ? 250 : l - 5), de->d_name);
				unlink(data);
				unlink(p);
			}
		} else if (l > 5 && !strcmp(de->d_name + l - 5, ".meta")) {
			snprintf(data, sizeof(data), "%.4300s/%.*s.data", dir, (int)(l - 5 > 250 ? 250 : l - 5), de->d_name);
			if (access(data, F_OK) != 0 && errno == ENOENT)
				unlink(p); /* its data taken or removed */
		}
	}
	closedir(d);
	return 0;
}
