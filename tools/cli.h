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
int cmd_import(int argc, char **argv);
int cmd_ls(int argc, char **argv);
int cmd_cat(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_stat(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_gc(int argc, char **argv);

/* Prints "ulpack: <msg>\n" to stderr; returns 1 (the failure exit status). */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Reads a whole file into a malloc'd buffer; on failure prints why (naming the
 * file) and returns -1. */
int cli_read_file(const char *path, uint8_t **buf, size_t *len);

/* Monotonic seconds. */
double cli_now(void);

/* 1 if argv[i] is --help or -h. */
int cli_is_help(const char *arg);

#endif
