/*
 * mpi_info.c - the MPI library's own description of itself, for `dtrain
 * doctor`: MPI_Get_library_version (first line; Open MPI adds a build
 * date and repository on the next ones) and the MPI standard it
 * implements. Both may be called before MPI_Init.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "collectives/comm_impl.h"

void dt_mpi_library_version(char *buf, size_t len)
{
    char text[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int n = 0, major = 0, minor = 0;
    if (MPI_Get_library_version(text, &n) != MPI_SUCCESS)
        snprintf(text, sizeof text, "unknown MPI library");
    text[strcspn(text, "\n,")] = '\0';
    if (MPI_Get_version(&major, &minor) != MPI_SUCCESS)
        major = minor = 0;
    snprintf(buf, len, "%s (MPI %d.%d)", text, major, minor);
}
