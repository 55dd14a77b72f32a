"""Attaching to a Ray cluster someone else started (`cluster.address`), checked before the run starts.

Ray 2.60's `ray start --head` turns token authentication on by default. A
driver that does not send the token loops for ~20 s on "Authentication token
is missing or incorrect" and then fails with "Failed to connect to Ray
cluster". So, before a run attaches:
- Ray's own rule for `ray start` is applied: if RAY_AUTH_MODE is unset and a
  token is available here (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or
  ~/.ray/auth_token), token mode is turned on for this process (and the
  actors it starts);
- a bare GCS client connects once (about a second): a cluster that refuses
  us is one line naming RAY_AUTH_MODE and RAY_AUTH_TOKEN, an address where no
  cluster answers is one line naming `cluster.address`.
`ray://` addresses (Ray Client) go through the client server and are not
probed here.
"""
from __future__ import annotations

from tailflow.config import ConfigError


class ClusterAttachError(ConfigError):
    """The run cannot attach to `cluster.address` (no retry fixes it)."""


def check_attach(address: str | None) -> None:
    if not address or address.startswith("ray://"):
        return
    import ray
    from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available
    from ray._private.services import canonicalize_bootstrap_address_or_die
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError, RpcError

    if ray.is_initialized():
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    try:
        GcsClient(address=canonicalize_bootstrap_address_or_die(address))
    except AuthenticationError:
        raise ClusterAttachError(
            f"cluster.address {address}: the Ray cluster requires token authentication (on by default for "
            "`ray start` since Ray 2.60) and refused this driver: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN to "
            "the head's token (`ray get-auth-token` on the head; or copy its ~/.ray/auth_token here)") from None
    except (RpcError, ConnectionError) as error:
        raise ClusterAttachError(f"cluster.address {address}: no Ray cluster answers there "
                                 f"({' '.join(str(error).split())[:200]})") from None
