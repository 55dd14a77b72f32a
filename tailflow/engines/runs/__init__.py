"""A run's durable layout in the artifact store: checkpoints, committed states, the `latest` pointer."""
