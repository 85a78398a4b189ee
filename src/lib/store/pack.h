/* SPDX-License-Identifier: MIT */
/*
 * pack.h - the pack store (pack.c, a->ps, its own lock): the only writer
 * and mapper of pack files, over store/backend.h's table (a directory or a
 * bucket). Users: ingest.c and recode.c (writing packs), read.c (mapping
 * blobs), maint.c (verify, gc, reclaim), archive.c (open, close).
 */
#ifndef ULP_PACK_H
#define ULP_PACK_H

#include "arch_int.h"
#include "store/index.h"
#include "store/ftab.h"
/* ULP_PACK_HEADER, the bytes of a pack's header: store/index.h */
typedef struct ulp_pack_writer ulp_pack_writer;
int ulp_pack_writer_new(ulp_archive *a, ulp_pack_writer **out);
/* Appends a blob; *offset receives its offset in the pack. */
int ulp_pack_append(ulp_pack_writer *w, const void *blob, size_t len, uint64_t *offset);
/* the same, with the blob's digest already taken (by the thread that coded it) */
int ulp_pack_append_digest(ulp_pack_writer *w, const void *blob, size_t len,
                           const uint8_t sha[ULP_SHA256_LEN], uint64_t *offset);
/* A blob written in pieces, by several threads: ulp_pack_reserve takes len
 * bytes at the end (*offset) in the blobs' order, ulp_pack_write_at fills
 * any part of them (from any thread), ulp_pack_reserved_digest then records
 * the blob's digest in the pack's name, in the same order as the appends
 * and reserves around it. */
int ulp_pack_reserve(ulp_pack_writer *w, size_t len, uint64_t *offset);
int ulp_pack_write_at(ulp_pack_writer *w, uint64_t offset, const void *p, size_t len);
void ulp_pack_reserved_digest(ulp_pack_writer *w, size_t len, const uint8_t sha[ULP_SHA256_LEN]);
uint64_t ulp_pack_size(const ulp_pack_writer *w);
/* Makes the pack durable under its content name: write, fsync, rename,
 * fsync of the directory. name receives its file name. */
int ulp_pack_commit(ulp_pack_writer *w, char name[80]);
/* The pack's file name, final once called: no blob may be added after it.
 * The index rows that name it may then be written in a transaction that
 * commits only after ulp_pack_commit returns (a pipelined put, ingest.c). */
void ulp_pack_seal(ulp_pack_writer *w, char name[80]);
/* 1 if the commit's rename replaced a file of the same name (a pack of the
 * same bytes, which the index may name): not this writer's alone to remove. */
int ulp_pack_replaced(const ulp_pack_writer *w);
/* Removes the pack's file (temporary, or final once ulp_pack_commit renamed
 * it, even if the commit then failed) and frees w. */
void ulp_pack_discard(ulp_pack_writer *w);
void ulp_pack_free(ulp_pack_writer *w);
/* Bytes of a blob: pointer into the mapped pack, not pinned: valid until
 * ulp_archive_trim may run (gc's own reads, in a process that does not trim). */
int ulp_pack_blob(ulp_archive *a, int64_t pack, uint64_t offset, uint64_t len, const uint8_t **p);
void ulp_pack_unmap_all(ulp_archive *a);
/* The pack store's handle, a->ps: made at open, unmapped and freed at close. */
int ulp_packstore_open(ulp_archive *a);
void ulp_packstore_close(ulp_archive *a);
/* Pack files by name through the pack store's backend (store/backend.h):
 * removes one (0, or a negative ULP_E_*, no message); calls cb for each
 * whose name starts with prefix, with its size (cb may remove that one). */
int ulp_pack_remove(ulp_archive *a, const char *name);
int ulp_pack_list(ulp_archive *a, const char *prefix, int (*cb)(void *arg, const char *name, uint64_t size),
                  void *arg);
/* Drops this process's hold on the pages of a mapped range it has used
 * (batched: the pages go back once some megabytes are pending). */
void ulp_pack_release(ulp_archive *a, const void *p, size_t len);
void ulp_pack_forget(ulp_archive *a, int64_t pack);
/* Pins pack (mapping it if needed, invariant 2 of pack.c): *slot names its
 * mapping until ulp_pack_unpin. */
int ulp_pack_pin(ulp_archive *a, int64_t pack, size_t *slot);
int ulp_pack_pin_slot(ulp_archive *a, size_t slot); /* one more pin */
/* ulp_pack_pin where the file table knows the pack's name and size: no query. */
int ulp_pack_pin_known(ulp_archive *a, const ulp_packref *pk, size_t *slot);
/* Asks, in the background, for the pages of [off, off + len) of a pinned
 * slot (pack.c invariant 7: a hint, never a wait). */
void ulp_pack_willneed(ulp_archive *a, size_t slot, uint64_t off, uint64_t len);
void ulp_pack_unpin(ulp_archive *a, size_t slot);
/* Bytes of a blob in a pinned slot. */
int ulp_pack_slot_blob(ulp_archive *a, size_t slot, uint64_t offset, uint64_t len, const uint8_t **p);
/* How often a pinned slot's pack was fetched anew (ulp_pack_refetch). */
unsigned ulp_pack_slot_epoch(ulp_archive *a, size_t slot);
/* A pinned slot's pack whose bytes failed a check (what: the failure, for
 * the message), read when the slot's epoch was seen: where the pack has a
 * copy fetched from an object store that was not fetched anew yet, it is
 * dropped and fetched again over the same mapping (backend.h's refetch):
 * 1, read it again. Where it was fetched anew since seen (by another
 * thread): 1 too. Else 0 where the backend fetches nothing (a local
 * directory: the caller's error stands), or, where the fresh copy failed
 * again, that copy dropped and the slot forgotten (the next lookup maps
 * it afresh), -ULP_E_IO with the message naming the pack and the archive;
 * or the fetch's error. */
int ulp_pack_refetch(ulp_archive *a, size_t slot, unsigned seen, const char *what);
/* Whether a slot's pack file was found removed (ulp_pack_mark_gone). */
int ulp_pack_slot_gone(ulp_archive *a, size_t slot);
/* Marks mapped packs whose file is gone; returns how many mapped ones are. */
unsigned ulp_pack_mark_gone(ulp_archive *a);
/* Unmaps marked packs nobody pins; returns how many. */
unsigned ulp_pack_unmap_gone(ulp_archive *a);
size_t ulp_pack_mapped(ulp_archive *a); /* packs mapped now */

#endif
