"""AWS MSK IAM authentication for librdkafka: OAUTHBEARER with a token the AWS signer library
(the ``flinkish[msk]`` extra) signs locally from the process's AWS credentials. The Java
client's ``AWS_MSK_IAM`` mechanism and its OAUTHBEARER callback handler both become this.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from flinkish_core.errors import OptionError, WorkerEnvironmentError

__all__ = ["MskIam", "check_credentials", "token_callback"]


@dataclass(frozen=True)
class MskIam:
    """AWS MSK IAM through OAUTHBEARER: how the signer finds credentials, and the region."""

    region: str
    profile: str | None = None
    role_arn: str | None = None
    role_session_name: str | None = None
    debug_creds: bool = False


_EXTRA = "pip install 'flinkish[msk]'"


@functools.cache
def token_callback(spec: MskIam) -> Callable[[str], tuple[str, float]]:
    """confluent-kafka's ``oauth_cb`` for ``spec``: one object per spec and process, so clients
    of the same settings stay interchangeable in the consumer pool."""
    try:
        from aws_msk_iam_sasl_signer import MSKAuthTokenProvider as signer
    except ImportError as exc:
        raise WorkerEnvironmentError(
            f"AWS MSK IAM authentication needs the signer library on the driver and every "
            f"executor: {_EXTRA} (aws-msk-iam-sasl-signer-python); {exc}") from None

    def oauth_cb(_config: str) -> tuple[str, float]:
        if spec.role_arn is not None:
            token, expiry_ms = signer.generate_auth_token_from_role_arn(
                spec.region, spec.role_arn,
                *((spec.role_session_name,) if spec.role_session_name else ()))
        elif spec.profile is not None:
            token, expiry_ms = signer.generate_auth_token_from_profile(spec.region, spec.profile)
        else:
            token, expiry_ms = signer.generate_auth_token(
                spec.region, aws_debug_creds=spec.debug_creds)
        return token, expiry_ms / 1000

    return oauth_cb


#: where botocore's default chain looks, and what to give
_CHAIN = ("botocore's chain looks in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, the "
          "shared credentials and config files, SSO, and the container's or the instance's "
          "role; give the driver and every executor one of them")


def check_credentials(spec: MskIam) -> None:
    """Fail with an :class:`OptionError` unless the credentials the signer starts from are
    found here: the profile's (``awsProfileName``), else the default chain's (with
    ``awsRoleArn`` they assume the role). Only whether they exist is looked at; an assumed role
    or a profile's SSO login is not fetched."""
    import botocore.session
    from botocore.exceptions import BotoCoreError, PartialCredentialsError, ProfileNotFound

    option = "option kafka.sasl.jaas.config (AWS MSK IAM)"
    try:
        credentials = botocore.session.Session(profile=spec.profile).get_credentials()
    except ProfileNotFound:
        raise OptionError(
            f"{option}: awsProfileName {spec.profile!r} is not a profile of the AWS config "
            "files on the driver; create it there and on every executor (aws configure "
            f"--profile {spec.profile}), or name an existing one") from None
    except PartialCredentialsError as exc:
        raise OptionError(f"{option}: {exc}; give both the key id and the secret key, or "
                          "neither") from None
    except BotoCoreError as exc:
        raise OptionError(f"{option}: the AWS credentials cannot be loaded on the driver "
                          f"({type(exc).__name__}); {_CHAIN}") from None
    if credentials is None:
        whose = (f"the profile {spec.profile!r}" if spec.profile
                 else "the default chain" + (f", which assumes {spec.role_arn}"
                                             if spec.role_arn else ""))
        raise OptionError(f"{option}: no AWS credentials found on the driver for {whose}; "
                          + _CHAIN)
