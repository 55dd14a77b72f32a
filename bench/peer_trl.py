"""The TRL half of bench/peer.py: TRL's GRPOTrainer on the prompts, settings and reward peer.py hands it.

    VENV/bin/python bench/peer_trl.py SPEC.json      # run by bench/peer.py, in the venv of scripts/peer_env.sh

SPEC.json (written by peer.py) holds the GRPOConfig keyword arguments, the
warm-start model's path, the training prompts in the order tailflow's
synchronous run draws them, their gold answers, and the options of tailflow's
math reward. The reward is tailflow's own `MathReward` (imported from the
tailflow package, which the venv sees: it is made with
--system-site-packages), so both sides score a response alike.

Writes, into SPEC's `result_path`: every optimizer step's wall time (from the
end of the previous step, or the start of training, to the end of this one:
generation, reward, forward, backward and the optimizer step) and mean reward
(TRL's own logged `reward`, the mean over the step's completions), and the
whole training's wall time; the final model goes to SPEC's `model_dir`
(`save_model`: a Hugging Face directory tailflow's evaluation loads).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer, __version__ as trl_version

    from tailflow.engines.reward.math import MathReward

    reward = MathReward(**spec["reward"])

    def math_reward(prompts, completions, answer, **_):
        return [reward.score(completion, gold).reward for completion, gold in zip(completions, answer)]

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.last = 0.0
            self.seconds: list[float] = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.last = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            self.seconds.append(now - self.last)
            self.last = now

    torch.manual_seed(spec["config"]["seed"])
    clock = StepClock()
    trainer = GRPOTrainer(
        model=spec["model_path"], reward_funcs=math_reward, args=GRPOConfig(**spec["config"]),
        train_dataset=Dataset.from_dict({"prompt": spec["prompts"], "answer": spec["answers"]}),
        processing_class=AutoTokenizer.from_pretrained(spec["model_path"]), callbacks=[clock],
    )
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    trainer.save_model(spec["model_dir"])
    rewards = [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
    result = {"trl_version": trl_version, "torch_threads": torch.get_num_threads(), "wall_s": wall,
              "step_seconds": clock.seconds, "step_rewards": rewards}
    Path(spec["result_path"]).write_text(json.dumps(result))
    print(f"TRL {trl_version}: {len(clock.seconds)} steps in {wall:.0f} s, model saved to {spec['model_dir']}")


if __name__ == "__main__":
    main(sys.argv[1])
