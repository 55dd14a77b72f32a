"""The Prefect flows: a training run and the change of its rollout workers (`training.py`), one iteration
(`iteration.py`), evaluation of a model, the supervised warm start and tail-batching planning. Each reads as the
steps it runs; the wiring around them is in tailflow/driver/, the steps are the tasks in tailflow/tasks/, the
work is in tailflow/engines/. Kept apart so that a flow module is imported only by its own package and by the
command line that starts it (tests/test_import_rules.py)."""
