/*
 * tbevents.h - TensorBoard event files: the run's scalars in the format
 * TensorBoard reads, written without TensorFlow or protobuf libraries.
 *
 * A file is a sequence of TFRecords, each (little-endian)
 *   uint64 length | uint32 masked CRC32C of those 8 bytes |
 *   payload       | uint32 masked CRC32C of the payload
 * where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8. Each payload is
 * an Event protobuf, encoded by hand: the first holds wall_time and
 * file_version "brain.Event:2"; each later one wall_time, step and a
 * Summary of tag/simple_value pairs. Every record is flushed as it is
 * written, so a killed run keeps every record it finished.
 */
#ifndef DT_TBEVENTS_H
#define DT_TBEVENTS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct dt_tb dt_tb_t;

#define DT_TB_MAX_VALUES 32
#define DT_TB_MAX_TAG 64

/* The scalars of one step, gathered before dt_tb_put writes them as one
 * event. Values past DT_TB_MAX_VALUES are dropped. */
struct dt_tb_rec {
    int64_t step;
    int n;
    char tags[DT_TB_MAX_VALUES][DT_TB_MAX_TAG];
    float values[DT_TB_MAX_VALUES];
};

void dt_tb_begin(struct dt_tb_rec *rec, int64_t step);
void dt_tb_add(struct dt_tb_rec *rec, const char *tag, double value);

/* Creates directory dir when missing and a new event file in it,
 * events.out.tfevents.<Unix seconds>.<host>.<pid>, whose name goes to
 * path (may be NULL); writes the file_version event. NULL dir gives a sink
 * that drops records (ranks other than 0, or TensorBoard output off). */
dt_status dt_tb_open(const char *dir, dt_tb_t **out, char *path, size_t len);
void dt_tb_close(dt_tb_t *tb);

/* Writes rec as one event and flushes it. DT_ERR_IO names the file. */
dt_status dt_tb_put(dt_tb_t *tb, const struct dt_tb_rec *rec);

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of n bytes, and
 * the masked form TFRecord stores. */
uint32_t dt_crc32c(const void *p, size_t n);
uint32_t dt_crc32c_masked(const void *p, size_t n);

/* Encodes an Event (wall_time, step, summary of rec's values; or, with rec
 * NULL, wall_time and file_version) into buf; returns its length, or 0
 * when it does not fit in cap bytes. */
size_t dt_tb_encode_event(double wall_time, const struct dt_tb_rec *rec, uint8_t *buf, size_t cap);

#endif
