/*
 * outfile.h - internal to io/: the one way dtrain writes a file it keeps
 * (checkpoints, model.h5, imported datasets).
 *
 * A file is written under a temporary name in its final directory. Right
 * after the temporary file is created, the space its contents will need is
 * reserved (an upper estimate), so a full disk, a quota or a file-size
 * limit fails there, before any data is written, instead of half way
 * through a write inside HDF5. When complete it is synced, renamed into
 * place and the directory synced, so a crash or a failure at any moment
 * leaves either the new file complete or the old one untouched. Every
 * failure names the file and carries the system's reason and the free
 * space: "<what> <path>: cannot ...: <OS reason>; <N> free on its file
 * system".
 * Not a public header: nothing outside io/ includes it, except launch/'s
 * commands for dt_outfile_remove_pending.
 */
#ifndef DT_IO_OUTFILE_H
#define DT_IO_OUTFILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

/* An upper estimate of the size of an HDF5 file holding data_bytes of raw
 * data in `objects` groups, datasets and chunks, plus attr_bytes of
 * attribute values (measured: about 4 KiB plus 0.4 KiB per object). */
uint64_t dt_outfile_hdf5_estimate(uint64_t data_bytes, uint64_t objects, uint64_t attr_bytes);

/* "<strerror(err)>[ (the file-size limit, ulimit -f, is N)]; <N> free on
 * its file system" for a failure writing path (the free space part when
 * the file system holding path's directory can be asked). */
void dt_outfile_reason(int err, const char *path, char *buf, size_t len);

/* "; <N> free on its file system", or "" when unknown. */
void dt_outfile_free_text(const char *path, char *buf, size_t len);

/* A file-size limit (ulimit -f) below `bytes` for path is DT_ERR_IO:
 * "<what> <path>: needs about <size>: File too large (the file-size
 * limit, ulimit -f, is <N>); <N> free on its file system". */
dt_status dt_outfile_check_limit(const char *what, const char *path, uint64_t bytes);

/* Reserves `bytes` for the file at path (already created) without changing
 * its size, so the writer sees the file it expects: the file-size limit is
 * checked, then blocks are allocated past the end of the file
 * (fallocate KEEP_SIZE), or, where the file system cannot, its free space
 * is compared. DT_ERR_IO: "<what> <path>: cannot reserve <size> for it:
 * <OS reason>; <N> free on its file system". */
dt_status dt_outfile_reserve(const char *what, const char *path, uint64_t bytes);

/* Gives back the reserved blocks past the end of the finished file. */
void dt_outfile_release(const char *path, uint64_t bytes);

/* fsync of the file at path, and of the directory that holds path.
 * DT_ERR_IO: "<what> <path>: cannot sync[ its directory D]: <reason>". */
dt_status dt_outfile_sync(const char *what, const char *path);
dt_status dt_outfile_sync_dir(const char *what, const char *path);

/* The commit of a finished temporary file: sync tmp, rename it to final,
 * sync final's directory. On failure tmp is left for the caller to
 * remove. */
dt_status dt_outfile_commit(const char *what, const char *tmp, const char *final);

/* rename(from, to) that never replaces to (a file, or an empty directory
 * of that name): 0, or -1 with errno, EEXIST when to is taken. Where the
 * file system cannot rename that way, a hard link and the removal of from
 * (a file), or a check and a rename (a directory). */
int dt_outfile_rename_new(const char *from, const char *to);

/* The same, for a file that must not replace anything: when final exists
 * (or appears meanwhile) nothing is renamed, DT_ERR_IO says so, and tmp is
 * left for the caller to remove. */
dt_status dt_outfile_commit_new(const char *what, const char *tmp, const char *final);

/* Replaces path with len bytes of data the same way, through tmp (for
 * small files such as a checkpoint directory's `latest`). */
dt_status dt_outfile_write_small(const char *what, const char *tmp, const char *path,
                                 const void *data, size_t len);

/* ---- temporaries of imports and model files -------------------------------
 * An import writes its output `final` as "<final>.tmp.<host>.<pid>", as a
 * run writes its model.h5 (the host as gethostname() says, characters
 * other than letters, digits, '.', '-' and '_' as '_'), so that a temporary left by a process that
 * died (SIGKILL, a crash, a power cut) can be told from one still being written: on the same host,
 * a pid that is not running. */

/* Room for any temporary name of a final path of up to 4000 bytes. */
#define DT_OUTFILE_TMP_LEN (4096 + 320)

/* Looks at the temporaries of final in its directory, before an import
 * reads its inputs and again right before it creates its own:
 * - one of a process on this host that is not running, and that no one
 *   holds locked (HDF5 locks the file it writes), is removed, and said on
 *   progress (when not NULL) with its size;
 * - one of a running process on this host is DT_ERR_BUSY: "<what> <final>
 *   is being written by another import (pid P on this host, into T); wait
 *   for it to end or stop it, or choose another output path" (a second
 *   import of the same output is refused, not run beside the first);
 * - one of another host, or named "<final>.tmp.<pid>" by an older dtrain,
 *   is left as it is (whether its writer still runs cannot be told from
 *   here), with a note on progress saying so.
 * A directory that cannot be listed is no error here (creating the file
 * will say why). */
dt_status dt_outfile_clear_stale(const char *what, const char *final, FILE *progress);

/* The temporary of final for this process, checked first as above (its
 * notes not repeated), and registered as the pending temporary, which
 * dt_outfile_remove_pending() removes. The caller creates it next. */
dt_status dt_outfile_tmp_begin(const char *what, const char *final, char *tmp, size_t len);

/* After a commit (committed = 1) or a failure: a failure's temporary is
 * removed; either way nothing is pending any more. */
void dt_outfile_tmp_end(const char *tmp, int committed);

/* Removes the pending temporary, if any. Async-signal-safe: for the
 * signal handlers of launch/ (the only caller outside io/), which then
 * let the signal end the process. */
void dt_outfile_remove_pending(void);

#endif
