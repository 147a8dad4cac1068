"""The Java Kafka client's security settings, translated into librdkafka's, so that the
``kafka.*`` options a Spark user wrote for ``format("kafka")`` work unchanged here (what maps to
what: docs/secured-clusters.md).

:func:`translate` runs once, at ``load()``. Key stores and the AWS MSK IAM callback are kept
apart, in a :class:`ClientSecurity`: a store's file is read on each machine and a callback is a
Python object, so :func:`client_config` adds them where a client is built. A Java name given
with its librdkafka twin, or one librdkafka has no equivalent for, fails naming the fix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flinkish_core.errors import OptionError
from flinkish_core.jaas import JaasEntry, JaasError, parse_jaas_config
from flinkish_kafka.key_stores import StoreSpec, read_store, store_pem
from flinkish_kafka.msk_iam import MskIam, check_credentials, token_callback

__all__ = ["NO_SECURITY", "ClientSecurity", "MskIam", "StoreSpec", "check_client_security",
           "client_config", "translate"]

#: Databricks shades the Kafka client: its class names start with this.
SHADED_PREFIX = "kafkashaded."

_PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
_OAUTH = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
_KRB5 = "com.sun.security.auth.module.Krb5LoginModule"
_IAM_MODULE = "software.amazon.msk.auth.iam.IAMLoginModule"
_IAM_CLIENT_HANDLER = "software.amazon.msk.auth.iam.IAMClientCallbackHandler"
_IAM_OAUTH_HANDLER = "software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler"
#: Kafka's OIDC client-credentials handler (3.1-3.9 under ``secured``, 4.0 on at the top)
_OIDC_HANDLERS = (
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
    "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler",
)

_SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
_STORE_TYPES = ("JKS", "PKCS12", "PEM")

_REFRESH = "librdkafka refreshes a token at 80% of its lifetime; remove it"
_TLS_VERSION = ("librdkafka negotiates the highest TLS version both sides support (TLS 1.2 or "
                "1.3); remove it")
_TOKEN_ENDPOINT = "librdkafka has no separate timeout for the token endpoint; remove it"
_TOKEN_RETRIES = "librdkafka retries the token endpoint itself; remove it"
_CLAIMS = "librdkafka does not check the token's claims; remove it"
_BROKER_ONLY = "a broker setting; remove it"
_KINIT = "librdkafka renews tickets with sasl.kerberos.kinit.cmd; remove it"
#: Java settings librdkafka has no equivalent for, and what to do instead.
_JAVA_ONLY = {
    "ssl.protocol": _TLS_VERSION,
    "ssl.enabled.protocols": _TLS_VERSION,
    "ssl.provider": "librdkafka uses OpenSSL; remove it",
    "ssl.keymanager.algorithm": "a Java KeyManager setting; remove it",
    "ssl.trustmanager.algorithm": "a Java TrustManager setting; remove it",
    "ssl.secure.random.implementation": "librdkafka uses OpenSSL's random source; remove it",
    "ssl.engine.factory.class": "a Java class cannot run here; give the certificates with "
                                "kafka.ssl.truststore.* / kafka.ssl.keystore.* or librdkafka's "
                                "ssl.ca.location / ssl.certificate.location / ssl.key.location",
    "sasl.login.class": "a Java class cannot run here; remove it",
    "sasl.login.refresh.window.factor": _REFRESH,
    "sasl.login.refresh.window.jitter": _REFRESH,
    "sasl.login.refresh.min.period.seconds": _REFRESH,
    "sasl.login.refresh.buffer.seconds": _REFRESH,
    "sasl.login.connect.timeout.ms": _TOKEN_ENDPOINT,
    "sasl.login.read.timeout.ms": _TOKEN_ENDPOINT,
    "sasl.login.retry.backoff.ms": _TOKEN_RETRIES,
    "sasl.login.retry.backoff.max.ms": _TOKEN_RETRIES,
    "sasl.oauthbearer.scope.claim.name": _CLAIMS,
    "sasl.oauthbearer.sub.claim.name": _CLAIMS,
    "sasl.oauthbearer.expected.audience": _BROKER_ONLY,
    "sasl.oauthbearer.expected.issuer": _BROKER_ONLY,
    "sasl.oauthbearer.jwks.endpoint.url": _BROKER_ONLY,
    "sasl.kerberos.ticket.renew.window.factor": _KINIT,
    "sasl.kerberos.ticket.renew.jitter": _KINIT,
}


@dataclass(frozen=True)
class ClientSecurity:
    """What a client needs beyond its string settings (see :func:`client_config`)."""

    truststore: StoreSpec | None = None
    keystore: StoreSpec | None = None
    msk_iam: MskIam | None = None
    # values the translation took out of the options (a JAAS string) that must stay masked
    hidden: tuple[str, ...] = field(default=(), repr=False)

    @property
    def active(self) -> bool:
        return bool(self.truststore or self.keystore or self.msk_iam)

    def secrets(self) -> list[str]:
        stores = [s for s in (self.truststore, self.keystore) if s is not None]
        return [*self.hidden, *(secret for store in stores for secret in store.secrets())]


NO_SECURITY = ClientSecurity()


def client_config(kafka_config: Mapping[str, Any], security: ClientSecurity
                  ) -> dict[str, Any]:
    """The librdkafka settings of a client: the translated options, plus the key stores as
    in-memory PEM (converted on first use in this process) and the MSK IAM token callback."""
    config: dict[str, Any] = dict(kafka_config)
    if security.truststore is not None:
        config["ssl.ca.pem"] = store_pem(security.truststore).ca
    if security.keystore is not None:
        pem = store_pem(security.keystore)
        config["ssl.certificate.pem"], config["ssl.key.pem"] = pem.certificate, pem.key
    if security.msk_iam is not None:
        config["oauth_cb"] = token_callback(security.msk_iam)
    return config


def check_client_security(security: ClientSecurity) -> None:
    """Read the stores, load the MSK signer and find its AWS credentials now, at ``load()``,
    so that a wrong password, a damaged store, a missing library or missing credentials fail
    there, naming the option."""
    for store in (security.truststore, security.keystore):
        if store is not None:
            read_store(store)
    if security.msk_iam is not None:
        token_callback(security.msk_iam)
        check_credentials(security.msk_iam)


def _class(name: str) -> str:
    return name.strip().removeprefix(SHADED_PREFIX)


def _conflict(kafka: Mapping[str, str], java: str, twins: tuple[str, ...]) -> None:
    given = [t for t in twins if t in kafka]
    if given:
        raise OptionError(
            f"options kafka.{java} and kafka.{given[0]} conflict: both set the same thing "
            f"(the first in the Java client's terms, the second in librdkafka's); keep one")


def _mechanism(kafka: dict[str, str]) -> str | None:
    java, native = kafka.pop("sasl.mechanism", None), kafka.pop("sasl.mechanisms", None)
    if java is not None and native is not None and java.strip().upper() != native.strip(
            ).upper():
        raise OptionError(
            f"options kafka.sasl.mechanism ({java}) and kafka.sasl.mechanisms ({native}) "
            "conflict: they are the same setting (Java's and librdkafka's name); keep one")
    given = java if java is not None else native
    return given.strip().upper() if given is not None else None


def _only(entry: JaasEntry, module: str, allowed: tuple[str, ...],
          extensions: str | None = None) -> None:
    """Fail on login module options that would be dropped (a typo, or one with no
    equivalent), naming them (never their values)."""
    unknown = sorted(k for k in entry.options if k not in allowed
                     and not (extensions and k.startswith(extensions)))
    if unknown:
        raise OptionError(
            f"option kafka.sasl.jaas.config: {module} option "
            + ", ".join(repr(k) for k in unknown) + " is not translated (translated: "
            + ", ".join(allowed) + (f", {extensions}<name>" if extensions else "") + ")")


def _need_mechanism(given: str | None, module: str, accepted: tuple[str, ...]) -> str:
    if given is None and len(accepted) == 1:
        return accepted[0]
    if given not in accepted:
        raise OptionError(
            f"option kafka.sasl.mechanism: {module} needs "
            + " or ".join(accepted) + f" (given: {given or 'none, which means GSSAPI'})")
    assert given is not None
    return given


def _region(servers: str) -> str:
    """The AWS region of an MSK cluster: from its bootstrap host names
    (``b-1.name.abc123.c2.kafka.us-east-1.amazonaws.com``, serverless
    ``boot-x.c1.kafka-serverless.eu-west-1.amazonaws.com``), else ``AWS_REGION`` /
    ``AWS_DEFAULT_REGION``."""
    found = re.search(r"\.kafka(?:-serverless)?\.([a-z]{2}(?:-[a-z]+)+-\d+)\.amazonaws\.com",
                      servers)
    if found:
        return found.group(1)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        return region
    raise OptionError(
        "AWS MSK IAM: the region is not in the bootstrap servers' host names "
        f"({servers!r} is not *.kafka.<region>.amazonaws.com) and neither AWS_REGION nor "
        "AWS_DEFAULT_REGION is set; set AWS_REGION on the driver and the executors")


def _msk_iam(entry: JaasEntry, module: str, servers: str) -> MskIam:
    _only(entry, module, ("awsProfileName", "awsRoleArn", "awsRoleSessionName",
                          "awsDebugCreds"))
    opts = entry.options
    if opts.get("awsProfileName") and opts.get("awsRoleArn"):
        raise OptionError(
            f"option kafka.sasl.jaas.config: {module} takes awsProfileName or awsRoleArn, not "
            "both (the signer assumes the role with the default credentials)")
    return MskIam(region=_region(servers), profile=opts.get("awsProfileName") or None,
                  role_arn=opts.get("awsRoleArn") or None,
                  role_session_name=opts.get("awsRoleSessionName") or None,
                  debug_creds=opts.get("awsDebugCreds", "false").strip().lower() == "true")


def _check_client_handler(module: str, mechanism: str | None, login_handler: str | None,
                          client_handler: str | None) -> None:
    """The SASL client callback handlers AWS documents for MSK IAM, and no other: its own with
    ``AWS_MSK_IAM``, or ``IAMOAuthBearerLoginCallbackHandler`` (also the login handler, when
    given) with OAUTHBEARER."""
    if client_handler is None:
        return
    if client_handler == _IAM_CLIENT_HANDLER and module == _IAM_MODULE:
        if mechanism == "AWS_MSK_IAM":
            return
        raise OptionError(
            f"option kafka.sasl.client.callback.handler.class: {_IAM_CLIENT_HANDLER} serves "
            f"kafka.sasl.mechanism=AWS_MSK_IAM (given: {mechanism or 'none'}); with "
            f"OAUTHBEARER AWS's handler is {_IAM_OAUTH_HANDLER}")
    if client_handler == _IAM_OAUTH_HANDLER and module in (_OAUTH, _IAM_MODULE):
        if login_handler not in (None, _IAM_OAUTH_HANDLER):
            raise OptionError(
                f"options kafka.sasl.login.callback.handler.class ({login_handler}) and "
                f"kafka.sasl.client.callback.handler.class ({client_handler}) conflict: AWS "
                f"MSK IAM sets both to {_IAM_OAUTH_HANDLER}")
        return
    raise OptionError(
        f"option kafka.sasl.client.callback.handler.class: {client_handler} cannot run here "
        f"(a Java class); translated are AWS MSK IAM's {_IAM_CLIENT_HANDLER} (with "
        f"IAMLoginModule and AWS_MSK_IAM) and {_IAM_OAUTH_HANDLER} (with OAUTHBEARER)")


def _sasl(kafka: dict[str, str], out: dict[str, str], jaas: str, mechanism: str | None,
          login_handler: str | None, client_handler: str | None) -> MskIam | None:
    """The login module's settings in librdkafka's terms (into ``out``); the MSK IAM spec when
    the module signs with AWS credentials."""
    try:
        entry = parse_jaas_config(jaas)
    except JaasError as exc:
        raise OptionError(f"option kafka.sasl.jaas.config: {exc}") from None
    module = _class(entry.login_module)
    short = module.rsplit(".", 1)[-1]
    _check_client_handler(module, mechanism, login_handler, client_handler)
    if client_handler == _IAM_OAUTH_HANDLER:
        # the handler that signs MSK's OAUTHBEARER tokens, in the SASL client's place
        login_handler = _IAM_OAUTH_HANDLER
    if login_handler is not None and module != _OAUTH and not (
            module == _IAM_MODULE and login_handler == _IAM_OAUTH_HANDLER):
        raise OptionError(
            f"option kafka.sasl.login.callback.handler.class applies to "
            f"OAuthBearerLoginModule, not {short}")
    if module in (_PLAIN, _SCRAM):
        accepted = ("PLAIN",) if module == _PLAIN else _SCRAM_MECHANISMS
        out["sasl.mechanisms"] = _need_mechanism(mechanism, short, accepted)
        _only(entry, short, ("username", "password"))
        if module == _SCRAM and "tokenauth" in entry.options:
            raise OptionError("option kafka.sasl.jaas.config: delegation tokens (tokenauth) "
                              "are not supported by librdkafka")
        _conflict(kafka, "sasl.jaas.config", ("sasl.username", "sasl.password"))
        missing = [k for k in ("username", "password") if k not in entry.options]
        if missing:
            raise OptionError(f"option kafka.sasl.jaas.config: {short} needs "
                              + " and ".join(missing))
        out["sasl.username"] = entry.options["username"]
        out["sasl.password"] = entry.options["password"]
        return None
    if module == _IAM_MODULE:
        if mechanism != "AWS_MSK_IAM" and not (mechanism == "OAUTHBEARER"
                                               and login_handler == _IAM_OAUTH_HANDLER):
            raise OptionError(
                f"option kafka.sasl.mechanism: IAMLoginModule needs AWS_MSK_IAM, or "
                f"OAUTHBEARER with kafka.sasl.login.callback.handler.class="
                f"{_IAM_OAUTH_HANDLER} (given: {mechanism or 'none'})")
        out["sasl.mechanisms"] = "OAUTHBEARER"
        return _msk_iam(entry, short, kafka.get("bootstrap.servers", ""))
    if module == _OAUTH:
        out["sasl.mechanisms"] = _need_mechanism(mechanism, short, ("OAUTHBEARER",))
        _conflict(kafka, "sasl.jaas.config", (
            "sasl.oauthbearer.method", "sasl.oauthbearer.client.id",
            "sasl.oauthbearer.client.secret", "sasl.oauthbearer.scope",
            "sasl.oauthbearer.extensions", "sasl.oauthbearer.config",
            "enable.sasl.oauthbearer.unsecure.jwt"))
        return _oauth(kafka, out, entry, short, login_handler)
    if module == _KRB5:
        raise OptionError(
            "option kafka.sasl.jaas.config: Krb5LoginModule (GSSAPI) is not translated; give "
            "librdkafka's kafka.sasl.kerberos.principal and kafka.sasl.kerberos.keytab instead "
            "(and kafka.sasl.kerberos.service.name)")
    raise OptionError(
        f"option kafka.sasl.jaas.config: login module {entry.login_module} is not translated "
        "(PlainLoginModule, ScramLoginModule, OAuthBearerLoginModule and the MSK "
        "IAMLoginModule are); give librdkafka's sasl.* settings instead")


def _oauth(kafka: dict[str, str], out: dict[str, str], entry: JaasEntry, short: str,
           handler: str | None) -> MskIam | None:
    opts = entry.options

    def extensions(prefix: str) -> dict[str, str]:
        return {k[len(prefix):]: v for k, v in opts.items() if k.startswith(prefix)}

    if handler is None:
        # Java's default: an unsecured JWT built from the unsecuredLogin* options
        _only(entry, short, ("unsecuredLoginStringClaim_sub", "unsecuredLoginListClaim_scope",
                             "unsecuredLoginLifetimeSeconds"),
              extensions="unsecuredLoginExtension_")
        if "unsecuredLoginStringClaim_sub" not in opts:
            raise OptionError(
                "option kafka.sasl.jaas.config: OAuthBearerLoginModule without "
                "kafka.sasl.login.callback.handler.class makes an unsecured token, which needs "
                "unsecuredLoginStringClaim_sub; for client credentials set "
                f"kafka.sasl.login.callback.handler.class={_OIDC_HANDLERS[0]}")
        parts = [f"principal={opts['unsecuredLoginStringClaim_sub']}"]
        if "unsecuredLoginListClaim_scope" in opts:
            parts.append(f"scope={opts['unsecuredLoginListClaim_scope']}")
        if "unsecuredLoginLifetimeSeconds" in opts:
            parts.append(f"lifeSeconds={opts['unsecuredLoginLifetimeSeconds']}")
        parts += [f"extension_{k}={v}"
                  for k, v in extensions("unsecuredLoginExtension_").items()]
        out["enable.sasl.oauthbearer.unsecure.jwt"] = "true"
        out["sasl.oauthbearer.config"] = " ".join(parts)
        return None
    if handler in _OIDC_HANDLERS:
        _only(entry, short, ("clientId", "clientSecret", "scope"), extensions="extension_")
        missing = [k for k in ("clientId", "clientSecret") if not opts.get(k)]
        if missing:
            raise OptionError("option kafka.sasl.jaas.config: client credentials need "
                              + " and ".join(missing))
        if not kafka.get("sasl.oauthbearer.token.endpoint.url"):
            raise OptionError(
                "option kafka.sasl.oauthbearer.token.endpoint.url is required with "
                "OAuthBearerLoginCallbackHandler (the identity provider's token URL)")
        if kafka["sasl.oauthbearer.token.endpoint.url"].strip().lower().startswith("file:"):
            raise OptionError(
                "option kafka.sasl.oauthbearer.token.endpoint.url: a file:// token is not "
                "supported by librdkafka; give the identity provider's https:// token URL")
        out["sasl.oauthbearer.method"] = "oidc"
        out["sasl.oauthbearer.client.id"] = opts["clientId"]
        out["sasl.oauthbearer.client.secret"] = opts["clientSecret"]
        if opts.get("scope"):
            out["sasl.oauthbearer.scope"] = opts["scope"]
        if extensions("extension_"):
            out["sasl.oauthbearer.extensions"] = ",".join(
                f"{k}={v}" for k, v in extensions("extension_").items())
        return None
    if handler == _IAM_OAUTH_HANDLER:
        return _msk_iam(entry, short, kafka.get("bootstrap.servers", ""))
    raise OptionError(
        f"option kafka.sasl.login.callback.handler.class: {handler} cannot run here (a Java "
        f"class); translated are {_OIDC_HANDLERS[0]} (client credentials, with "
        f"kafka.sasl.oauthbearer.token.endpoint.url) and {_IAM_OAUTH_HANDLER} (AWS MSK IAM)")


def _store_type(kafka: dict[str, str], kind: str) -> str | None:
    raw = kafka.pop(f"ssl.{kind}.type", None)
    if raw is None:
        return None
    value = raw.strip().upper()
    if value not in _STORE_TYPES:
        raise OptionError(f"option kafka.ssl.{kind}.type: {raw!r} is not one of "
                          + ", ".join(_STORE_TYPES) + " (convert other stores with keytool "
                          "-importkeystore -deststoretype PKCS12)")
    return value


def _truststore(kafka: dict[str, str]) -> StoreSpec | None:
    names = ("ssl.truststore.location", "ssl.truststore.password", "ssl.truststore.type",
             "ssl.truststore.certificates")
    if not any(n in kafka for n in names):
        return None
    for n in names:
        if n in kafka:
            _conflict(kafka, n, ("ssl.ca.location", "ssl.ca.pem"))
    location = kafka.pop("ssl.truststore.location", None)
    certificates = kafka.pop("ssl.truststore.certificates", None)
    password = kafka.pop("ssl.truststore.password", None)
    store_type = _store_type(kafka, "truststore")
    if (location is None) == (certificates is None):
        raise OptionError(
            "give the trust store as kafka.ssl.truststore.location (a JKS, PKCS12 or PEM "
            "file) or as kafka.ssl.truststore.certificates (PEM text, with "
            "kafka.ssl.truststore.type=PEM), one of them")
    if certificates is not None and store_type != "PEM":
        raise OptionError("option kafka.ssl.truststore.certificates needs "
                          "kafka.ssl.truststore.type=PEM")
    if store_type == "PEM" and password:
        raise OptionError("option kafka.ssl.truststore.password: a PEM trust store has no "
                          "password (as in the Java client); remove it")
    return StoreSpec("truststore", store_type, location, password or None, certificates)


def _keystore(kafka: dict[str, str]) -> StoreSpec | None:
    java_only = ("ssl.keystore.type", "ssl.keystore.certificate.chain", "ssl.keystore.key")
    if "ssl.keystore.location" not in kafka and not any(n in kafka for n in java_only):
        # librdkafka's own ssl.keystore.password / ssl.key.password stay as they are
        return None
    for n in ("ssl.keystore.location", *java_only):
        if n in kafka:
            _conflict(kafka, n, ("ssl.certificate.location", "ssl.key.location",
                                 "ssl.certificate.pem", "ssl.key.pem"))
    location = kafka.pop("ssl.keystore.location", None)
    chain = kafka.pop("ssl.keystore.certificate.chain", None)
    key = kafka.pop("ssl.keystore.key", None)
    password = kafka.pop("ssl.keystore.password", None)
    key_password = kafka.pop("ssl.key.password", None)
    store_type = _store_type(kafka, "keystore")
    if location is not None and (chain is not None or key is not None):
        raise OptionError(
            "give the key store as kafka.ssl.keystore.location or as "
            "kafka.ssl.keystore.certificate.chain with kafka.ssl.keystore.key, not both")
    if location is None:
        if chain is None or key is None or store_type != "PEM":
            raise OptionError(
                "options kafka.ssl.keystore.certificate.chain and kafka.ssl.keystore.key go "
                "together, with kafka.ssl.keystore.type=PEM")
        if password:
            raise OptionError("option kafka.ssl.keystore.password: an inline PEM key store "
                              "has no password; the key's is kafka.ssl.key.password")
    return StoreSpec("keystore", store_type, location, password or None, chain, key,
                     key_password or None)


def _endpoint_identification(kafka: dict[str, str]) -> None:
    key = "ssl.endpoint.identification.algorithm"
    if key not in kafka:
        return
    value = kafka[key].strip().lower()
    if value not in ("", "none", "https"):
        raise OptionError(f"option kafka.{key}: {kafka[key]!r} is not https or \"\" (off)")
    kafka[key] = value or "none"  # Java's "" turns host name verification off


def translate(kafka: Mapping[str, str]) -> tuple[dict[str, str], ClientSecurity]:
    """The ``kafka.*`` options (prefix removed) in librdkafka's terms, and what clients need
    beyond them. Raises :class:`OptionError` for conflicts and untranslatable settings."""
    out = dict(kafka)
    for key, instead in _JAVA_ONLY.items():
        if key in out:
            raise OptionError(f"option kafka.{key} is a Java client setting librdkafka has "
                              f"no equivalent for: {instead}")
    suites = out.get("ssl.cipher.suites", "")
    if "_WITH_" in suites.upper():
        raise OptionError(
            "option kafka.ssl.cipher.suites: Java cipher suite names (TLS_..._WITH_...) are "
            "not understood; write OpenSSL names (e.g. ECDHE-RSA-AES256-GCM-SHA384) or remove "
            "it")
    _endpoint_identification(out)
    mechanism = _mechanism(out)
    jaas = out.pop("sasl.jaas.config", None)
    login_handler = out.pop("sasl.login.callback.handler.class", None)
    client_handler = out.pop("sasl.client.callback.handler.class", None)
    msk: MskIam | None = None
    translated: dict[str, str] = {}
    if jaas is not None:
        msk = _sasl(out, translated, jaas, mechanism,
                    _class(login_handler) if login_handler else None,
                    _class(client_handler) if client_handler else None)
    elif login_handler is not None or client_handler is not None:
        raise OptionError(
            "options kafka.sasl.*.callback.handler.class need kafka.sasl.jaas.config (the "
            "login module they serve)")
    elif mechanism == "AWS_MSK_IAM":
        raise OptionError(
            "option kafka.sasl.mechanism=AWS_MSK_IAM needs kafka.sasl.jaas.config="
            f"'{_IAM_MODULE} required;'")
    elif mechanism is not None:
        translated["sasl.mechanisms"] = mechanism
    out.update(translated)
    security = ClientSecurity(
        truststore=_truststore(out), keystore=_keystore(out), msk_iam=msk,
        hidden=(jaas,) if jaas else ())
    return out, security
