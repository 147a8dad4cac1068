"""AWS MSK IAM authentication for librdkafka: OAUTHBEARER with a token the AWS signer library
(``aws-msk-iam-sasl-signer-python``, the ``flinkish[msk]`` extra) makes from the process's AWS
credentials. The Java client's ``AWS_MSK_IAM`` mechanism and its OAUTHBEARER callback handler
both become this (MSK's IAM listeners take either).

The token is a SigV4-presigned ``kafka-cluster:Connect`` request, signed locally: no AWS call
is made unless credentials must first be fetched (an assumed role, a profile's SSO, instance
metadata). The signer reports the expiry in milliseconds; confluent-kafka's ``oauth_cb`` wants
seconds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from flinkish_core.errors import WorkerEnvironmentError
from flinkish_kafka.java_security import MskIam

__all__ = ["token_callback"]

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
