"""tailflow: RL post-training of LLMs with tail batching, on Prefect and Ray."""
from tailflow.environment import check_torchvision

check_torchvision()
