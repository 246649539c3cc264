/*
 * util.h - the core helpers by their old name: it includes the headers
 * they now live in (clock, alloc, files, host, text).
 */
#ifndef DT_UTIL_H
#define DT_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "alloc.h"
#include "clock.h"
#include "files.h"
#include "host.h"
#include "status.h"
#include "text.h"

#endif
