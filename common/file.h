/* common/file.h — whole-file reads, read-only mmaps, atomic writes, and the
 * few system calls on files that everything else uses.
 *
 * Atomic writes: everything sparq produces is written to "<path>.tmp.<pid>"
 * and renamed over <path> only when complete and fsync'ed, so an interrupted
 * run never leaves a file that looks finished.
 *
 * Every open, read, pread, write, fsync, rename, mkdir and mmap of a file
 * that sparq reads or writes goes through this module, each one a point where
 * common/fault.h can make it fail (tests/faults/ sweeps them all). */
#ifndef SPARQ_COMMON_FILE_H
#define SPARQ_COMMON_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "common/status.h"

/* The system calls, with their results and errno, except that an armed fault
 * (common/fault.h) fails one: EIO for open for reading, read, pread and mmap,
 * ENOSPC for open for writing and rename (the atomic writer's fopen, write,
 * flush + fsync and sparq_mkdirs' mkdir are counted inside file.c). sparq_io_mmap maps [0, n) of fd
 * read-only with `flags` (MAP_PRIVATE / MAP_SHARED); MAP_FAILED on failure. */
int sparq_io_open(const char *path, int flags, mode_t mode);
ssize_t sparq_io_read(int fd, void *buf, size_t n);
ssize_t sparq_io_pread(int fd, void *buf, size_t n, uint64_t off);
int sparq_io_rename(const char *from, const char *to);
void *sparq_io_mmap(int fd, size_t n, int flags);

/* Read exactly [off, off + n) of fd into buf (EINTR retried); a short read is
 * an error too ("PATH: read of N bytes at OFF failed: unexpected end of file
 * (file shrank?)"). */
sparq_status sparq_pread_full(int fd, void *buf, uint64_t n, uint64_t off, const char *path);

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
/* Advance the file by n bytes without writing them: they read as zeros and,
 * on file systems with sparse files, take no disk (a hole). */
sparq_status sparq_atomic_skip(sparq_atomic_file *f, uint64_t n);
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
