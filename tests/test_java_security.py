"""The Java client's security options translated into librdkafka's (flinkish_source.
java_security): each login module, each store type (made at test time: ``cryptography`` for
certificates and PKCS12, ``keytool`` for JKS), conflicts and untranslatable settings, masking,
the MSK IAM token callback against the signer library, and Event Hubs' connection string."""

from __future__ import annotations

import base64
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from pki import KEY_PW, KEYTOOL, STORE_PW, Pki

from flinkish_core.errors import OptionError, WorkerEnvironmentError
from flinkish_core.secrets import MASK, scrub
from flinkish_kafka import msk_iam
from flinkish_kafka.java_security import MskIam, translate
from flinkish_source.options import CLIENT_DEFAULTS, SourceOptions, parse_options

SECRET = "Sup3r-s3cret-passw0rd"
PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
OAUTH = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
OIDC_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
IAM_MODULE = "software.amazon.msk.auth.iam.IAMLoginModule"
MSK_SERVERS = ("b-1.demo.abc123.c2.kafka.eu-west-1.amazonaws.com:9098,"
               "b-2.demo.abc123.c2.kafka.eu-west-1.amazonaws.com:9098")
needs_keytool = pytest.mark.skipif(KEYTOOL is None, reason="needs keytool (a JDK)")


def parse(**kafka: str) -> SourceOptions:
    raw = {"kafka.bootstrap.servers": kafka.pop("bootstrap.servers", "b:9092"),
           "subscribe": "t", "includeMarkers": "false"}
    raw.update({f"kafka.{k}": v for k, v in kafka.items()})
    return parse_options(raw)


def jaas(module: str, **options: str) -> str:
    return f"{module} required " + " ".join(f'{k}="{v}"' for k, v in options.items()) + ";"


# --- login modules --------------------------------------------------------------------------

@pytest.mark.parametrize("shaded", ["", "kafkashaded."])
def test_plain(shaded: str) -> None:
    config, security = translate({
        "bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.jaas.config": jaas(shaded + PLAIN, username="alice", password=SECRET)})
    assert config == {"bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL",
                      "sasl.mechanisms": "PLAIN", "sasl.username": "alice",
                      "sasl.password": SECRET}
    assert not security.active and security.hidden


def test_plain_without_a_mechanism_means_plain() -> None:
    config, _ = translate({"sasl.jaas.config": jaas(PLAIN, username="u", password="p")})
    assert config["sasl.mechanisms"] == "PLAIN"


def test_event_hubs_connection_string_survives_whole() -> None:
    connection = ("Endpoint=sb://my-ns.servicebus.windows.net/;SharedAccessKeyName="
                  "RootManageSharedAccessKey;SharedAccessKey=AbC+dEf/GhI=")
    text = ("kafkashaded.org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="$ConnectionString" password="{connection}";')
    o = parse(**{"bootstrap.servers": "my-ns.servicebus.windows.net:9093",
                 "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                 "sasl.jaas.config": text})
    assert o.kafka_config["sasl.username"] == "$ConnectionString"
    assert o.kafka_config["sasl.password"] == connection
    assert connection not in repr(o) and connection not in str(o.safe_kafka_config)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "scram-sha-512"])
def test_scram(mechanism: str) -> None:
    config, _ = translate({"sasl.mechanism": mechanism,
                           "sasl.jaas.config": jaas(SCRAM, username="bob", password=SECRET)})
    assert (config["sasl.mechanisms"], config["sasl.username"], config["sasl.password"]) == (
        mechanism.upper(), "bob", SECRET)


def test_scram_needs_its_mechanism() -> None:
    with pytest.raises(OptionError, match="ScramLoginModule needs SCRAM-SHA-256 or "
                                          "SCRAM-SHA-512 .given: none, which means GSSAPI"):
        translate({"sasl.jaas.config": jaas(SCRAM, username="u", password="p")})
    with pytest.raises(OptionError, match="PlainLoginModule needs PLAIN .given: SCRAM-SHA-256"):
        translate({"sasl.mechanism": "SCRAM-SHA-256",
                   "sasl.jaas.config": jaas(PLAIN, username="u", password="p")})


def test_oauth_client_credentials() -> None:
    config, _ = translate({
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.login.callback.handler.class": "kafkashaded." + OIDC_HANDLER,
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example.com/oauth2/token",
        "sasl.jaas.config": jaas(OAUTH, clientId="app", clientSecret=SECRET,
                                 scope="kafka.read", extension_logicalCluster="lkc-1",
                                 extension_identityPoolId="pool-2")})
    assert config == {
        "sasl.mechanisms": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example.com/oauth2/token",
        "sasl.oauthbearer.client.id": "app", "sasl.oauthbearer.client.secret": SECRET,
        "sasl.oauthbearer.scope": "kafka.read",
        "sasl.oauthbearer.extensions": "logicalCluster=lkc-1,identityPoolId=pool-2"}


def test_oauth_with_the_older_secured_handler_and_no_scope() -> None:
    handler = "org.apache.kafka.common.security.oauthbearer.secured." \
              "OAuthBearerLoginCallbackHandler"
    config, _ = translate({
        "sasl.mechanism": "OAUTHBEARER", "sasl.login.callback.handler.class": handler,
        "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
        "sasl.jaas.config": jaas(OAUTH, clientId="app", clientSecret=SECRET)})
    assert "sasl.oauthbearer.scope" not in config
    assert config["sasl.oauthbearer.method"] == "oidc"


def test_oauth_client_credentials_need_the_token_endpoint() -> None:
    with pytest.raises(OptionError, match="token.endpoint.url is required"):
        translate({"sasl.mechanism": "OAUTHBEARER",
                   "sasl.login.callback.handler.class": OIDC_HANDLER,
                   "sasl.jaas.config": jaas(OAUTH, clientId="a", clientSecret="b")})


def test_oauth_unsecured_token() -> None:
    config, _ = translate({
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.jaas.config": jaas(OAUTH, unsecuredLoginStringClaim_sub="admin",
                                 unsecuredLoginLifetimeSeconds="600",
                                 unsecuredLoginExtension_traceId="t1")})
    assert config["enable.sasl.oauthbearer.unsecure.jwt"] == "true"
    assert config["sasl.oauthbearer.config"] == (
        "principal=admin lifeSeconds=600 extension_traceId=t1")


def test_an_unknown_callback_handler_names_the_ones_translated() -> None:
    with pytest.raises(OptionError, match="com.acme.MyHandler cannot run here.*"
                                          "OAuthBearerLoginCallbackHandler"):
        translate({"sasl.mechanism": "OAUTHBEARER",
                   "sasl.login.callback.handler.class": "com.acme.MyHandler",
                   "sasl.jaas.config": jaas(OAUTH, clientId="a", clientSecret="b")})


@pytest.mark.parametrize(("options", "says"), [
    ({"sasl.jaas.config": jaas(PLAIN, username="u", password="p"), "sasl.username": "v"},
     "kafka.sasl.jaas.config and kafka.sasl.username conflict"),
    ({"sasl.mechanism": "PLAIN", "sasl.mechanisms": "SCRAM-SHA-256"},
     "kafka.sasl.mechanism .PLAIN. and kafka.sasl.mechanisms .SCRAM-SHA-256. conflict"),
    ({"ssl.truststore.location": "/x.jks", "ssl.ca.location": "/ca.pem"},
     "kafka.ssl.truststore.location and kafka.ssl.ca.location conflict"),
    ({"ssl.keystore.type": "PEM", "ssl.certificate.pem": "x"},
     "kafka.ssl.keystore.type and kafka.ssl.certificate.pem conflict"),
    ({"ssl.protocol": "TLSv1.2"}, "kafka.ssl.protocol is a Java client setting.*remove it"),
    ({"ssl.enabled.protocols": "TLSv1.2,TLSv1.3"}, "kafka.ssl.enabled.protocols"),
    ({"sasl.login.refresh.window.factor": "0.8"}, "80% of its lifetime"),
    ({"ssl.cipher.suites": "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"}, "OpenSSL names"),
    ({"ssl.endpoint.identification.algorithm": "ldap"}, "is not https or"),
    ({"sasl.jaas.config": jaas(PLAIN, user="u", password="p")},
     "PlainLoginModule option 'user' is not translated .translated: username, password"),
    ({"sasl.jaas.config": jaas(PLAIN, username="u", password="p", extension_a="b")},
     "option 'extension_a' is not translated"),
    ({"sasl.mechanism": "AWS_MSK_IAM",
      "sasl.jaas.config": jaas(IAM_MODULE, awsStsRegion="eu-west-1")},
     "IAMLoginModule option 'awsStsRegion' is not translated"),
    ({"sasl.jaas.config": jaas("com.sun.security.auth.module.Krb5LoginModule",
                               useKeyTab="true")}, "sasl.kerberos.principal"),
    ({"sasl.jaas.config": jaas("com.acme.Login")}, "com.acme.Login is not translated"),
    ({"sasl.mechanism": "AWS_MSK_IAM"}, "needs kafka.sasl.jaas.config"),
    ({"sasl.login.callback.handler.class": OIDC_HANDLER}, "need kafka.sasl.jaas.config"),
    ({"ssl.truststore.type": "BKS", "ssl.truststore.location": "/x"}, "'BKS' is not one of"),
    ({"ssl.truststore.type": "PEM", "ssl.truststore.location": "/x",
      "ssl.truststore.password": "p"}, "a PEM trust store has no password"),
    ({"ssl.keystore.key": "k", "ssl.keystore.type": "PEM"}, "go together"),
])
def test_conflicts_and_untranslatable_settings_fail_at_load(options: dict[str, str],
                                                            says: str) -> None:
    with pytest.raises(OptionError, match=says):
        parse(**options)


def test_a_malformed_jaas_string_says_where_and_hides_the_secret() -> None:
    with pytest.raises(OptionError) as failure:
        parse(**{"sasl.jaas.config": f"{PLAIN} required username=u password='{SECRET}'"})
    assert "kafka.sasl.jaas.config" in str(failure.value)
    assert "not terminated by ';'" in str(failure.value)
    assert SECRET not in str(failure.value)


def test_librdkafka_names_keep_working() -> None:
    given = {"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
             "sasl.username": "u", "sasl.password": SECRET, "ssl.ca.location": "/etc/ca.pem",
             "ssl.endpoint.identification.algorithm": "none"}
    o = parse(**given)
    assert o.kafka_config == {"bootstrap.servers": "b:9092", **given}
    assert o.client_config() == {**CLIENT_DEFAULTS, **o.kafka_config}


@pytest.mark.parametrize(("java", "librdkafka"), [("", "none"), ("HTTPS", "https"),
                                                  ("none", "none")])
def test_endpoint_identification(java: str, librdkafka: str) -> None:
    config, _ = translate({"ssl.endpoint.identification.algorithm": java})
    assert config["ssl.endpoint.identification.algorithm"] == librdkafka


# --- masking --------------------------------------------------------------------------------

def test_secrets_are_masked_as_wholes_everywhere() -> None:
    text = jaas(PLAIN, username="alice", password=SECRET)
    o = parse(**{"sasl.jaas.config": text, "security.protocol": "SASL_SSL",
                 "sasl.mechanism": "PLAIN"})
    for shown in (repr(o), str(o.safe_kafka_config), repr(o.client_security)):
        assert SECRET not in shown and text not in shown
    assert o.safe_kafka_config["sasl.password"] == MASK
    assert o.safe_kafka_config["sasl.mechanisms"] == "PLAIN"  # a method, not a secret
    assert scrub(f"refused {text} and {SECRET}", o.kafka_secrets) == f"refused {MASK} and {MASK}"


# --- key stores -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


STORE_KINDS = ["PEM", "PEM-inline", "PKCS12",
               pytest.param("JKS", marks=needs_keytool)]


def _certs(path: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(Path(path).read_bytes())


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_truststores_become_a_ca_file(pki: Pki, kind: str) -> None:
    o = parse(**{"security.protocol": "SSL", **pki.truststore(kind)})
    config = o.client_config()
    assert _certs(config["ssl.ca.location"]) == [pki.ca]
    assert not any(k.startswith("ssl.truststore") for k in config)


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_keystores_become_certificate_and_key_files(pki: Pki, kind: str) -> None:
    o = parse(**{"security.protocol": "SSL", **pki.keystore(kind)})
    config = o.client_config()
    assert _certs(config["ssl.certificate.location"])[0] == pki.client
    key = serialization.load_pem_private_key(Path(config["ssl.key.location"]).read_bytes(),
                                             None)
    assert key.public_key() == pki.client_key.public_key()
    assert not any(k.startswith(("ssl.keystore", "ssl.key.password")) for k in config)
    for path in (config["ssl.certificate.location"], config["ssl.key.location"]):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700


@pytest.mark.parametrize("kind", ["PEM", "PKCS12", pytest.param("JKS", marks=needs_keytool)])
def test_a_store_type_not_given_is_told_from_the_content(pki: Pki, tmp_path: Path,
                                                          kind: str) -> None:
    given = pki.truststore(kind)
    del given["ssl.truststore.type"]
    if kind == "PEM":  # as `openssl pkcs12 -nokeys` writes it: attributes before the block
        path = tmp_path / "ca-with-attributes.pem"
        path.write_text("Bag Attributes\n    friendlyName: ca\n"
                        + Path(given["ssl.truststore.location"]).read_text())
        given["ssl.truststore.location"] = str(path)
    assert _certs(parse(**given).client_config()["ssl.ca.location"]) == [pki.ca]


def test_a_librdkafka_style_pkcs12_keystore_is_converted_too(pki: Pki) -> None:
    given = pki.keystore("PKCS12")
    given.pop("ssl.keystore.type")
    config = parse(**given).client_config()
    assert _certs(config["ssl.certificate.location"])[0] == pki.client


@needs_keytool
def test_a_pkcs12_file_given_as_jks_is_read_as_java_does(pki: Pki) -> None:
    given = pki.keystore("PKCS12")
    given["ssl.keystore.type"] = "JKS"
    assert _certs(parse(**given).client_config()["ssl.certificate.location"])[0] == pki.client


@pytest.mark.parametrize(("kind", "option"), [
    ("PKCS12", "ssl.truststore.password"),
    pytest.param("JKS", "ssl.truststore.password", marks=needs_keytool),
])
def test_a_wrong_store_password_fails_at_load_naming_the_option(pki: Pki, kind: str,
                                                                option: str) -> None:
    given = {**pki.truststore(kind), option: SECRET}
    with pytest.raises(OptionError, match=f"kafka.{option}") as failure:
        parse(**given)
    assert SECRET not in str(failure.value)


@pytest.mark.parametrize("kind", ["PEM", pytest.param("JKS", marks=needs_keytool)])
def test_a_wrong_key_password_fails_at_load(pki: Pki, kind: str) -> None:
    given = {**pki.keystore(kind), "ssl.key.password": SECRET}
    with pytest.raises(OptionError, match="kafka.ssl.key.password") as failure:
        parse(**given)
    assert SECRET not in str(failure.value)


def test_a_missing_store_file_fails_at_load() -> None:
    with pytest.raises(OptionError, match=r"kafka.ssl.truststore.location \(/nowhere.jks\): "
                                          "cannot be read"):
        parse(**{"ssl.truststore.location": "/nowhere.jks"})


def test_store_passwords_and_keys_are_masked(pki: Pki) -> None:
    o = parse(**{**pki.keystore("PEM-inline"), **pki.truststore("PKCS12")})
    key_text = o.client_security.keystore.key  # type: ignore[union-attr]
    assert key_text and key_text in o.kafka_secrets and KEY_PW in o.kafka_secrets
    assert STORE_PW in o.kafka_secrets
    for shown in (repr(o), repr(o.client_security), str(o.safe_kafka_config)):
        assert KEY_PW not in shown and STORE_PW not in shown and "PRIVATE KEY" not in shown


def test_files_are_written_for_clients_once_per_process_and_removed_at_exit(pki: Pki) -> None:
    given = pki.truststore("PEM")
    first = parse(**given).client_config()["ssl.ca.location"]
    assert parse(**given).client_config()["ssl.ca.location"] == first
    script = (
        "import glob, os, tempfile\n"
        "from flinkish_source.options import parse_options\n"
        f"o = parse_options({{'kafka.bootstrap.servers': 'b:1', 'subscribe': 't', "
        f"'includeMarkers': 'false', 'kafka.ssl.truststore.type': 'PEM', "
        f"'kafka.ssl.truststore.location': {given['ssl.truststore.location']!r}}})\n"
        "mine = os.path.join(tempfile.gettempdir(), f'flinkish-tls-{os.getpid()}-*')\n"
        "print(len(glob.glob(mine)))\n"  # load() reads the store, writes nothing
        "print(o.client_config()['ssl.ca.location'])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, timeout=60)
    written_at_load, path = done.stdout.split()
    assert written_at_load == "0"
    assert path and not os.path.exists(path) and not os.path.exists(os.path.dirname(path))


def test_a_store_renewed_in_place_is_converted_again(pki: Pki, tmp_path: Path) -> None:
    path = tmp_path / "rotating-ca.pem"
    path.write_bytes(Path(pki.ca_pem).read_bytes())
    given = {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(path)}
    before = parse(**given).client_config()["ssl.ca.location"]
    (tmp_path / "renewed").mkdir()
    renewed = Pki(tmp_path / "renewed")
    path.write_bytes(Path(renewed.ca_pem).read_bytes())
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000_000))
    after = parse(**given).client_config()["ssl.ca.location"]
    assert after != before and _certs(after) == [renewed.ca] and _certs(before) == [pki.ca]


@needs_keytool
def test_a_jks_truststore_without_a_password_is_read_as_java_reads_it(pki: Pki) -> None:
    given = pki.truststore("JKS")
    del given["ssl.truststore.password"]  # Java then skips the integrity check
    assert _certs(parse(**given).client_config()["ssl.ca.location"]) == [pki.ca]


# --- AWS MSK IAM ----------------------------------------------------------------------------

@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Static credentials from the environment: the signer reads them without any call."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFLINKISHTEST0001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "flinkish/test/secret/key/0000000000000000")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_aws_msk_iam_mechanism_becomes_oauthbearer_with_the_region_of_the_host() -> None:
    config, security = translate({
        "bootstrap.servers": MSK_SERVERS, "security.protocol": "SASL_SSL",
        "sasl.mechanism": "AWS_MSK_IAM",
        "sasl.jaas.config": f'{IAM_MODULE} required awsProfileName="analytics";',
        "sasl.client.callback.handler.class":
            "software.amazon.msk.auth.iam.IAMClientCallbackHandler"})
    assert config["sasl.mechanisms"] == "OAUTHBEARER"
    assert "sasl.jaas.config" not in config and "sasl.mechanism" not in config
    assert security.msk_iam == MskIam(region="eu-west-1", profile="analytics")


def test_msk_iam_oauthbearer_handler_serverless_host_and_role() -> None:
    _, security = translate({
        "bootstrap.servers": "boot-abc.c3.kafka-serverless.us-east-2.amazonaws.com:9098",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.login.callback.handler.class":
            "kafkashaded.software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler",
        "sasl.jaas.config": f'{OAUTH} required awsRoleArn="arn:aws:iam::1:role/r" '
                            'awsRoleSessionName="s";'})
    assert security.msk_iam == MskIam(region="us-east-2", role_arn="arn:aws:iam::1:role/r",
                                      role_session_name="s")


def test_msk_iam_region_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    given = {"bootstrap.servers": "kafka.internal:9098", "sasl.mechanism": "AWS_MSK_IAM",
             "sasl.jaas.config": f"{IAM_MODULE} required;"}
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    with pytest.raises(OptionError, match="set AWS_REGION"):
        translate(given)
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    assert translate(given)[1].msk_iam == MskIam(region="ap-south-1")


def test_msk_iam_token_callback_signs_locally(aws_env: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    o = parse(**{"bootstrap.servers": MSK_SERVERS, "security.protocol": "SASL_SSL",
                 "sasl.mechanism": "AWS_MSK_IAM", "sasl.jaas.config": f"{IAM_MODULE} required;"})
    callback = o.client_config()["oauth_cb"]
    assert o.client_config()["oauth_cb"] is callback  # one per process: pooled clients match

    def no_network(*args: object) -> None:
        raise AssertionError(f"the signer made a connection: {args}")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    before = time.time()
    token, expiry = callback("")
    url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    query = parse_qs(urlparse(url).query)
    assert urlparse(url).hostname == "kafka.eu-west-1.amazonaws.com"
    assert query["Action"] == ["kafka-cluster:Connect"]
    assert query["X-Amz-Credential"][0].startswith("AKIAFLINKISHTEST0001/")
    assert "/eu-west-1/kafka-cluster/aws4_request" in query["X-Amz-Credential"][0]
    # seconds, as confluent-kafka wants (the signer gives milliseconds): 15 minutes ahead
    assert before + 800 < expiry < time.time() + 1000


def test_msk_iam_without_the_extra_says_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aws_msk_iam_sasl_signer", None)
    msk_iam.token_callback.cache_clear()
    try:
        with pytest.raises(WorkerEnvironmentError, match=r"pip install 'flinkish\[msk\]'"):
            parse(**{"bootstrap.servers": MSK_SERVERS, "sasl.mechanism": "AWS_MSK_IAM",
                     "sasl.jaas.config": f"{IAM_MODULE} required;"})
    finally:
        msk_iam.token_callback.cache_clear()
