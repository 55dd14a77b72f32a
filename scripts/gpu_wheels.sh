#!/usr/bin/env bash
# Download, here, the wheels the GPU evidence kit needs on the lent GPU machine and that its image lacks:
# pydantic for the tail-batching state and the config, megatron-core 0.16.1 (the pin of the `megatron` extra;
# it needs only torch, numpy and packaging, which transformers needs too) for the trainer stage; all else it uses,
# torch, transformers, pytest, is there. They go to .whl/ (git-ignored), which a device call carries
# (`carry: [".whl"]`): ~5.3 MB, far under 64 MiB.
# The lent machine runs Python 3.12 on x86-64 with no network (docs/gpu.md).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl \
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 typing-extensions==4.15.0 \
  megatron-core==0.16.1
ls -l .whl
