"""What the driver process does around the flows: resolving the model and data, starting and restarting the Ray
actors, the run's lease, logs, live progress, Prefect artifacts and links, cancel handling, retry policy,
preflight checks. The flows in tailflow/flows/ call it, so they read as the steps they run; it never defines a
flow or a task, and never imports tailflow.flows."""
