"""The Prefect tasks the flows call: one per step of an iteration (take the round, score it, train, pause and
resume the rollout, sync the weights, evaluate, commit), plus the planner's search. Each is a thin step over a
`RunContext` that calls into tailflow/engines/ and returns a typed record. Kept apart from engines/ so that
Prefect (and the cancel handling of `cancellable.run_task`) stays out of the work, and from flows/ so that a
task never imports a flow (tests/test_import_rules.py)."""
