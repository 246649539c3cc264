# dtrain in a container image: CUDA 13 with cuDNN and NCCL (from the
# nvidia/cuda base images), Open MPI, parallel HDF5 and the Fashion-MNIST
# dataset, on Ubuntu 24.04.
#
# Two stages. "build" runs README's own set-up (launch/setup.sh: the
# distribution packages, the CMake build, the Fashion-MNIST import) on the
# CUDA development image and installs into /opt/dtrain with `cmake
# --install`. The final stage starts from the much smaller CUDA runtime image
# and installs only the packages that own the libraries the installed binary
# loads, as the build stage found them (ldd + dpkg -S), so the list is right
# on Ubuntu and Debian alike (their library package names differ, e.g.
# Ubuntu 24.04's libopenmpi3t64 against Debian 12's libopenmpi3).
#
#   docker build -t dtrain .
#   docker run --rm --gpus all -v "$PWD/runs:/work/runs" dtrain     # the quick-start job
#   docker run --rm --gpus all dtrain doctor                        # the GPU, libraries and live checks
# CPU only, on Debian (what tests/container/debootstrap_test.sh runs):
#   docker build --build-arg DTRAIN_CUDA=OFF --build-arg BUILD_IMAGE=debian:bookworm \
#     --build-arg RUNTIME_IMAGE=debian:bookworm -t dtrain:cpu .
ARG BUILD_IMAGE=nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04
ARG RUNTIME_IMAGE=nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04

FROM ${BUILD_IMAGE} AS build
# ON: the CUDA backend and NCCL are required (the build fails without nvcc);
# OFF: CPU only; AUTO: whatever the base image has.
ARG DTRAIN_CUDA=ON
# More CMake options, e.g. -DCMAKE_CUDA_ARCHITECTURES=90-real
ARG DTRAIN_CMAKE_ARGS=""
ARG DEBIAN_FRONTEND=noninteractive
COPY . /src
WORKDIR /src
RUN BUILD_DIR=build \
    CMAKE_ARGS="-DDTRAIN_CUDA=${DTRAIN_CUDA} -DDTRAIN_BUILD_TESTS=OFF ${DTRAIN_CMAKE_ARGS}" \
    bash launch/setup.sh \
 && cmake --install build --prefix /opt/dtrain \
 && install -D -m 0644 data/fashion-mnist.h5 /opt/dtrain/share/dtrain/data/fashion-mnist.h5 \
 && /opt/dtrain/bin/dtrain version
# The packages that own every library the binary loads (the GPU driver's
# libcuda comes from the host at run time and is left out).
RUN set -e; \
    for lib in $(ldd /opt/dtrain/bin/dtrain | awk '$3 ~ "^/" { print $3 }'); do \
      real=$(readlink -f "$lib"); \
      dpkg -S "$real" 2>/dev/null || dpkg -S "${real#/usr}"; \
    done > /tmp/owners; \
    cut -d: -f1 /tmp/owners | sort -u > /opt/dtrain/share/dtrain/runtime-packages; \
    cat /opt/dtrain/share/dtrain/runtime-packages

FROM ${RUNTIME_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
COPY --from=build /opt/dtrain /opt/dtrain
ENV PATH=/opt/dtrain/bin:${PATH}
# Packages already in the base image (CUDA, cuBLAS, NCCL, the C library)
# are left as they are: the CUDA images hold some of them at fixed versions.
RUN set -e; \
    missing=""; \
    for p in openmpi-bin $(cat /opt/dtrain/share/dtrain/runtime-packages); do \
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
        || missing="$missing $p"; \
    done; \
    echo "installing:$missing"; \
    apt-get update -q; \
    apt-get install -y -q --no-install-recommends $missing; \
    rm -rf /var/lib/apt/lists/*; \
    dtrain version
# mpirun inside the container runs as root there (docker's default user).
ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORKDIR /work
ENTRYPOINT ["dtrain"]
CMD ["train", "/opt/dtrain/share/dtrain/configs/fashion-mnist-mlp.yaml", "--set", "data.path=/opt/dtrain/share/dtrain/data/fashion-mnist.h5"]
