#!/usr/bin/env bash
# Runs a command under real mpirun with N ranks on this machine:
#   mpirun.sh N command [args...]
# Adds --oversubscribe (more ranks than cores is fine for tests) and, when
# running as root (CI containers), --allow-run-as-root. A rank that hangs
# is ended by ctest's timeout.
set -euo pipefail
np=$1
shift
extra=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && extra+=(--allow-run-as-root)
# Shared-memory transport without the network probing that a container
# may not allow.
export OMPI_MCA_btl=self,vader
export OMPI_MCA_btl_vader_single_copy_mechanism=none
exec mpirun "${extra[@]}" -np "$np" "$@"
