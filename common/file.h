/* common/file.h — whole-file reads, read-only mmaps, and atomic writes.
 *
 * Atomic writes: everything sparq produces is written to "<path>.tmp.<pid>"
 * and renamed over <path> only when complete and fsync'ed, so an interrupted
 * run never leaves a file that looks finished. */
#ifndef SPARQ_COMMON_FILE_H
#define SPARQ_COMMON_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/status.h"

/* Open a file for reading, refusing anything but a regular file (a FIFO, a
 * device, a socket or a directory) without blocking on it: open(2) of a FIFO
 * for reading waits for a writer, forever if none comes. On success *fd is
 * open (O_RDONLY | O_CLOEXEC, blocking mode) and *size (may be NULL) is its
 * length. Errors name the path: "PATH: not a regular file (a FIFO)". Every
 * reader of input files goes through this (the functions below, safetensors,
 * the manifest and bundle checks). */
sparq_status sparq_open_regular(const char *path, int *fd, uint64_t *size);

/* Read a whole file into a NUL-terminated heap buffer (free with sparq_free).
 * max_size guards against reading something absurd (0 = no limit). */
sparq_status sparq_file_read_all(const char *path, size_t max_size, char **out, size_t *out_len);

/* A read-only mapping of a whole file. An empty file maps to data == NULL,
 * size == 0. */
typedef struct sparq_mmap {
    const uint8_t *data;
    size_t size;
} sparq_mmap;

sparq_status sparq_mmap_open(sparq_mmap *m, const char *path);
void sparq_mmap_close(sparq_mmap *m);

/* An output file being written under a temporary name. */
typedef struct sparq_atomic_file {
    FILE *fp;
    char *path;     /* final name */
    char *tmp_path; /* "<path>.tmp.<pid>" */
} sparq_atomic_file;

sparq_status sparq_atomic_open(sparq_atomic_file *f, const char *path);
/* Write n bytes; names the file in the error. */
sparq_status sparq_atomic_write(sparq_atomic_file *f, const void *buf, size_t n);
/* Flush, fsync and rename to the final name. Frees f's resources either way. */
sparq_status sparq_atomic_commit(sparq_atomic_file *f);
/* Remove the temporary file. Safe to call after a failed commit or twice. */
void sparq_atomic_abort(sparq_atomic_file *f);

/* Write a whole buffer to path atomically. */
sparq_status sparq_file_write_atomic(const char *path, const void *buf, size_t n);

/* Does path exist / is it a directory? */
int sparq_path_exists(const char *path);
int sparq_path_is_dir(const char *path);
/* mkdir -p. */
sparq_status sparq_mkdirs(const char *path);
/* Join dir and name into a new heap string (NULL on OOM). */
char *sparq_path_join(const char *dir, const char *name);

#endif
