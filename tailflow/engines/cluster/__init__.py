"""Ray worker groups and placement: the only package (besides the actor wrappers) that imports Ray.

Groups hand back plain data. `ACTOR_FAILURES` are the exceptions a call into
a group raises when one of its actors died (process killed, node lost, out of
memory): the flow catches them to replace the actors and rerun the iteration.
"""
import ray.exceptions

ACTOR_FAILURES = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)

__all__ = ["ACTOR_FAILURES"]
