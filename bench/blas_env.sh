# Sourced by the scripts that run PyTorch beside dtrain on the CPU, after
# BUILD is set. Where OpenBLAS did not know this CPU and chose old kernels,
# dtrain runs it with OPENBLAS_CORETYPE set to the kernels the CPU calls for
# (`dtrain version`'s "blas:" line says so); PyTorch's matrix products go
# through the same OpenBLAS, so both get that setting here: the comparison
# is of the two programs, not of two choices of kernels. A value set
# before the script runs is kept, for both.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  blas_core=$("$BUILD"/dtrain version | sed -n 's/.*OPENBLAS_CORETYPE=\([A-Za-z0-9_]*\) set by dtrain.*/\1/p')
  if [ -n "$blas_core" ]; then
    export OPENBLAS_CORETYPE=$blas_core
    echo "OPENBLAS_CORETYPE=$blas_core for dtrain and PyTorch (OpenBLAS chose older kernels for this CPU)" >&2
  fi
fi
