/* SPDX-License-Identifier: MIT */
/* cli.h - helpers shared by the ulpack subcommands (tools/cmd_*.c). */
#ifndef ULP_CLI_H
#define ULP_CLI_H

#include "ulpack.h"
#include <stdio.h>

/* Each subcommand: argc/argv start at the subcommand name; returns the exit status. */
int cmd_bench(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_init(int argc, char **argv);
int cmd_share(int argc, char **argv);
int cmd_import(int argc, char **argv);
int cmd_ls(int argc, char **argv);
int cmd_cat(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_stat(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_gc(int argc, char **argv);
int cmd_sync(int argc, char **argv);
int cmd_status(int argc, char **argv);
/* The status of the daemon mounted at mnt (its root's user.ulpack.status):
 * 0, or -1 with errno (ENODATA, ENOTSUP: not a ulpackfs mount root). */
int cli_mount_status(const char *mnt, ulp_status *st);
int cmd_forget(int argc, char **argv);
int cmd_steps(int argc, char **argv);
int cmd_dynamics(int argc, char **argv);
int cmd_diff(int argc, char **argv);

/* The subcommand running ("cat"), set by main before dispatch; NULL before. */
extern const char *cli_cmd;

/* Prints "ulpack CMD: <msg>\n" to stderr (the message names the file and the
 * cause: "ulpack cat: run/x: no such file in archive a"); returns 1 (the
 * failure exit status). */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Strict parsers of option values shared by every subcommand: the whole
 * value must parse, with no trailing characters, within [min, max]. On a bad
 * value they print "ulpack CMD: OPT 'VAL': why" and return 2 (the usage
 * error exit status); on success 0. */
int cli_opt_int(const char *opt, const char *val, int64_t min, int64_t max, int64_t *out);
int cli_opt_double(const char *opt, const char *val, double min, double max, double *out);
int cli_opt_size(const char *opt, const char *val, uint64_t *out);
/* An option given last, without its value: prints why; returns 2. */
int cli_opt_missing(const char *opt);

/* Reads a whole file into a malloc'd buffer; on failure prints why (naming the
 * file) and returns -1. */
int cli_read_file(const char *path, uint8_t **buf, size_t *len);

/* A progress line on stderr, redrawn in place ("gc [####    ]  42.0% of
 * 310.5 MB"), ended by a newline once done reaches total; what names the
 * work. Draws nothing unless stderr is a terminal. A ulp_progress_fn with
 * what as its argument: cli_progress_fn. */
void cli_progress(const char *what, uint64_t done, uint64_t total);
void cli_progress_fn(void *what, uint64_t done, uint64_t total);
/* Clears a progress line left unfinished (work that stopped early). */
void cli_progress_end(void);
/* Prints an archive's disk use (ulp_archive_space) as one line, or 0 if it
 * could not be measured (then prints nothing). */
int cli_print_space(ulp_archive *a, FILE *f);
/* A shared archive's generation line (ulp_archive_generation); 0: not shared. */
int cli_print_generation(ulp_archive *a, FILE *f);

/* Files an interrupted mount left staged (ulp_stage_orphans): a command
 * that writes (read_only 0) archives them first, where no mount holds the
 * archive, so that what it writes comes after them; one that reads says on
 * stderr that they exist and are not shown. Prints what it did. */
void cli_staged(ulp_archive *a, int read_only);

/* Monotonic seconds. */
double cli_now(void);

/* 1 if argv[i] is --help or -h. */
int cli_is_help(const char *arg);

#endif
