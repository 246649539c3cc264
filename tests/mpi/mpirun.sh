#!/usr/bin/env bash
# Runs a command under real mpirun with N ranks on this machine:
#   mpirun.sh N command [args...]
# Adds --oversubscribe (more ranks than cores is fine for tests) and, when
# running as root (CI containers), --allow-run-as-root. Ranks are not
# bound to cores unless DTRAIN_MPI_BIND says how (e.g. core, for
# benchmarks). A rank that hangs is ended by ctest's timeout.
set -euo pipefail
np=$1
shift
extra=(--oversubscribe --bind-to "${DTRAIN_MPI_BIND:-none}")
[ "$(id -u)" = 0 ] && extra+=(--allow-run-as-root)
# One node: shared memory only, without probing network interfaces.
export OMPI_MCA_btl=self,vader
exec mpirun "${extra[@]}" -np "$np" "$@"
