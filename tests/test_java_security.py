"""The Java client's security options translated into librdkafka's (flinkish_kafka.
java_security): each login module, each store type (made at test time: ``cryptography`` for
certificates and PKCS12, ``keytool`` for JKS) as librdkafka's in-memory PEM, no file left by a
process that cannot clean up, damaged stores, conflicts and untranslatable settings, masking,
AWS's MSK IAM option sets verbatim, their credentials looked up at load and the token callback
against the signer library, and Event Hubs' connection string."""

from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from confluent_kafka import Consumer
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
    assert o.kafka.config["sasl.username"] == "$ConnectionString"
    assert o.kafka.config["sasl.password"] == connection
    assert connection not in repr(o) and connection not in str(o.kafka.safe_config)


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
    assert o.kafka.config == {"bootstrap.servers": "b:9092", **given}
    assert o.kafka.client_config() == {**CLIENT_DEFAULTS, **o.kafka.config}


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
    for shown in (repr(o), str(o.kafka.safe_config), repr(o.kafka.security)):
        assert SECRET not in shown and text not in shown
    assert o.kafka.safe_config["sasl.password"] == MASK
    assert o.kafka.safe_config["sasl.mechanisms"] == "PLAIN"  # a method, not a secret
    assert scrub(f"refused {text} and {SECRET}", o.kafka.secrets) == f"refused {MASK} and {MASK}"


# --- key stores -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


STORE_KINDS = ["PEM", "PEM-inline", "PKCS12",
               pytest.param("JKS", marks=needs_keytool)]


def _certs(pem: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem.encode())


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_truststores_become_librdkafkas_in_memory_ca(pki: Pki, kind: str) -> None:
    o = parse(**{"security.protocol": "SSL", **pki.truststore(kind)})
    config = o.kafka.client_config()
    assert _certs(config["ssl.ca.pem"]) == [pki.ca]
    assert not any(k.startswith("ssl.truststore") or k.endswith(".location") for k in config)


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_keystores_become_librdkafkas_in_memory_certificate_and_key(pki: Pki,
                                                                    kind: str) -> None:
    o = parse(**{"security.protocol": "SSL", **pki.keystore(kind)})
    config = o.kafka.client_config()
    assert _certs(config["ssl.certificate.pem"]) == [pki.client, pki.ca]  # the whole chain
    key = serialization.load_pem_private_key(config["ssl.key.pem"].encode(), None)
    assert key.public_key() == pki.client_key.public_key()
    assert not any(k.startswith(("ssl.keystore", "ssl.key.password")) or k.endswith(
        ".location") for k in config)
    # librdkafka takes them: a client is built on them
    Consumer({**config, "group.id": "g", "bootstrap.servers": "127.0.0.1:1"}).close()


def test_a_trust_store_of_several_certificates_is_taken_whole(pki: Pki, tmp_path: Path
                                                              ) -> None:
    """librdkafka reads every certificate of ``ssl.ca.pem`` (since 2.0), as a trust store of
    a rotating CA (old and new) needs."""
    (tmp_path / "other").mkdir()
    other = Pki(tmp_path / "other", ca_name="flinkish other CA")
    path = tmp_path / "two-cas.pem"
    path.write_bytes(Path(other.ca_pem).read_bytes() + Path(pki.ca_pem).read_bytes())
    config = parse(**{"ssl.truststore.type": "PEM",
                      "ssl.truststore.location": str(path)}).kafka.client_config()
    assert _certs(config["ssl.ca.pem"]) == [other.ca, pki.ca]


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
    assert _certs(parse(**given).kafka.client_config()["ssl.ca.pem"]) == [pki.ca]


def test_a_librdkafka_style_pkcs12_keystore_is_converted_too(pki: Pki) -> None:
    given = pki.keystore("PKCS12")
    given.pop("ssl.keystore.type")
    config = parse(**given).kafka.client_config()
    assert _certs(config["ssl.certificate.pem"])[0] == pki.client


@needs_keytool
def test_a_pkcs12_file_given_as_jks_is_read_as_java_does(pki: Pki) -> None:
    given = pki.keystore("PKCS12")
    given["ssl.keystore.type"] = "JKS"
    assert _certs(parse(**given).kafka.client_config()["ssl.certificate.pem"])[0] == pki.client


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
    key_text = o.kafka.security.keystore.key  # type: ignore[union-attr]
    assert key_text and key_text in o.kafka.secrets and KEY_PW in o.kafka.secrets
    assert STORE_PW in o.kafka.secrets
    for shown in (repr(o), repr(o.kafka.security), str(o.kafka.safe_config)):
        assert KEY_PW not in shown and STORE_PW not in shown and "PRIVATE KEY" not in shown


#: a process that converts every kind of store and builds a librdkafka client on them, then
#: leaves as PySpark's daemon-forked workers do (os._exit: no atexit hook runs) or is killed
_CLIENT_PROCESS = """
import os, signal, sys
from confluent_kafka import Consumer
from flinkish_source.options import parse_options
options = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "includeMarkers": "false"}
options.update({"kafka." + k: v for k, v in %r.items()})
config = parse_options(options).kafka.client_config()
Consumer({**config, "group.id": "g", "security.protocol": "SSL"}).close()
Consumer({**config, "group.id": "g", "security.protocol": "SSL"})
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
pid = os.fork()  # a daemon-forked worker
if pid == 0:
    Consumer({**config, "group.id": "g2", "security.protocol": "SSL"})
    os._exit(0)
os.waitpid(pid, 0)
os._exit(0)
"""


@pytest.mark.parametrize("leaving", ["os._exit", "kill"])
@pytest.mark.parametrize("kind", ["PKCS12", pytest.param("JKS", marks=needs_keytool)])
def test_no_key_material_is_written_by_a_process_that_cannot_clean_up(
        pki: Pki, tmp_path: Path, kind: str, leaving: str) -> None:
    """Converted stores stay in the process's memory: a client process that leaves without
    cleaning up leaves no file behind, in its temp directory or its working directory."""
    given = {**pki.truststore(kind), **pki.keystore(kind)}
    temp, cwd = tmp_path / "temp", tmp_path / "cwd"
    temp.mkdir()
    cwd.mkdir()
    done = subprocess.run([sys.executable, "-c", _CLIENT_PROCESS % given, leaving],
                          capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, "TMPDIR": str(temp)})
    assert done.returncode == (-9 if leaving == "kill" else 0), done.stderr
    assert [*temp.rglob("*"), *cwd.rglob("*")] == []


def test_a_store_is_converted_once_per_process(pki: Pki) -> None:
    given = pki.keystore("PKCS12")
    first = parse(**given).kafka.client_config()
    again = parse(**given).kafka.client_config()
    assert again["ssl.key.pem"] is first["ssl.key.pem"]


def test_a_store_renewed_in_place_is_converted_again(pki: Pki, tmp_path: Path) -> None:
    path = tmp_path / "rotating-ca.pem"
    path.write_bytes(Path(pki.ca_pem).read_bytes())
    given = {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(path)}
    before = parse(**given).kafka.client_config()["ssl.ca.pem"]
    (tmp_path / "renewed").mkdir()
    renewed = Pki(tmp_path / "renewed")
    path.write_bytes(Path(renewed.ca_pem).read_bytes())
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000_000))
    after = parse(**given).kafka.client_config()["ssl.ca.pem"]
    assert _certs(after) == [renewed.ca] and _certs(before) == [pki.ca]


DAMAGED = [
    pytest.param("truststore", "JKS", False, marks=needs_keytool, id="jks-trust-no-password"),
    pytest.param("truststore", "JKS", True, marks=needs_keytool, id="jks-trust"),
    pytest.param("keystore", "JKS", False, marks=needs_keytool, id="jks-keys-no-store-password"),
    pytest.param("truststore", "PKCS12", True, id="pkcs12-trust"),
    pytest.param("keystore", "PKCS12", True, id="pkcs12-keys"),
]


@pytest.mark.parametrize(("kind", "store_type", "password"), DAMAGED)
@pytest.mark.parametrize("kept", [1 / 3, 1 / 2, 2 / 3])
def test_a_damaged_store_fails_at_load_naming_the_option(
        pki: Pki, tmp_path: Path, kind: str, store_type: str, password: bool,
        kept: float) -> None:
    """A store cut short (a partial copy): an OptionError naming the option and the way out,
    whatever part of the file is missing, never a parser's bare error."""
    given = pki.truststore(store_type) if kind == "truststore" else pki.keystore(store_type)
    if not password:
        del given[f"ssl.{kind}.password"]
    data = Path(given[f"ssl.{kind}.location"]).read_bytes()
    damaged = tmp_path / f"damaged.{store_type.lower()}"
    damaged.write_bytes(data[:int(len(data) * kept)])
    given[f"ssl.{kind}.location"] = str(damaged)
    with pytest.raises(OptionError, match=f"option kafka.ssl.{kind}.location .{damaged}.: "
                                          ) as failure:
        parse(**given)
    message = str(failure.value)
    assert STORE_PW not in message and KEY_PW not in message
    if store_type == "JKS" and not password:
        assert "damaged" in message and f"give kafka.ssl.{kind}.password" in message


def test_an_unreadable_store_fails_at_load(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"kafka.ssl.keystore.location .*: cannot be read "
                                          r"\(Is a directory\); the file must exist"):
        parse(**{"ssl.keystore.location": str(tmp_path), "ssl.keystore.password": "p"})


def test_a_key_store_whose_key_is_not_its_certificates_fails_at_load(pki: Pki) -> None:
    given = pki.keystore("PEM-inline")
    first, second = x509.load_pem_x509_certificates(
        given["ssl.keystore.certificate.chain"].encode())
    given["ssl.keystore.certificate.chain"] = "".join(
        c.public_bytes(serialization.Encoding.PEM).decode() for c in (second, first))
    with pytest.raises(OptionError, match="the inline PEM keystore: the private key is not "
                                          "the one of the first certificate"):
        parse(**given)


@needs_keytool
def test_a_jks_truststore_without_a_password_is_read_as_java_reads_it(pki: Pki) -> None:
    given = pki.truststore("JKS")
    del given["ssl.truststore.password"]  # Java then skips the integrity check
    assert _certs(parse(**given).kafka.client_config()["ssl.ca.pem"]) == [pki.ca]


# --- AWS MSK IAM ----------------------------------------------------------------------------

def no_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """No AWS setting, file or instance metadata where botocore looks."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Static credentials from the environment: the signer reads them without any call."""
    no_aws_credentials(monkeypatch)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFLINKISHTEST0001")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "flinkish/test/secret/key/0000000000000000")


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


#: AWS's option set for OAUTHBEARER, verbatim (aws-msk-iam-auth's README, "client.properties
#: for OAUTHBEARER"); kafkashaded.: the same on Databricks
def aws_oauthbearer(shaded: str, module: str = OAUTH) -> dict[str, str]:
    handler = f"{shaded}software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler"
    return {"bootstrap.servers": MSK_SERVERS,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.jaas.config": f"{shaded}{module} required;",
            "sasl.login.callback.handler.class": handler,
            "sasl.client.callback.handler.class": handler}


@pytest.mark.parametrize("module", [OAUTH, IAM_MODULE], ids=["OAuthBearerLoginModule",
                                                              "IAMLoginModule"])
@pytest.mark.parametrize("shaded", ["", "kafkashaded."])
def test_awss_documented_oauthbearer_option_set_is_taken_verbatim(
        aws_env: None, shaded: str, module: str) -> None:
    o = parse(**aws_oauthbearer(shaded, module))
    assert o.kafka.config["sasl.mechanisms"] == "OAUTHBEARER"
    assert not any("callback" in k or "jaas" in k for k in o.kafka.config)
    assert o.kafka.security.msk_iam == MskIam(region="eu-west-1")
    assert callable(o.kafka.client_config()["oauth_cb"])


@pytest.mark.parametrize(("change", "says"), [
    ({"sasl.client.callback.handler.class": "com.acme.Handler"},
     "com.acme.Handler cannot run here .*IAMOAuthBearerLoginCallbackHandler .with "
     "OAUTHBEARER"),
    ({"sasl.login.callback.handler.class": OIDC_HANDLER},
     "kafka.sasl.login.callback.handler.class .* and kafka.sasl.client.callback.handler.class "
     ".* conflict"),
    ({"sasl.client.callback.handler.class":
      "software.amazon.msk.auth.iam.IAMClientCallbackHandler"},
     "IAMClientCallbackHandler serves kafka.sasl.mechanism=AWS_MSK_IAM .given: OAUTHBEARER"),
])
def test_msk_iam_handlers_that_do_not_go_together_fail_at_load(
        aws_env: None, change: dict[str, str], says: str) -> None:
    given = {**aws_oauthbearer(""), **change}
    if "IAMClientCallbackHandler" in str(change):
        given["sasl.jaas.config"] = f"{IAM_MODULE} required;"
    with pytest.raises(OptionError, match=says):
        parse(**given)


@pytest.mark.parametrize(("jaas_options", "env", "says"), [
    ("", {}, "no AWS credentials found on the driver for the default chain; botocore's chain "
             "looks in AWS_ACCESS_KEY_ID"),
    ('awsRoleArn="arn:aws:iam::1:role/r"', {},
     "for the default chain, which assumes arn:aws:iam::1:role/r"),
    ('awsProfileName="analytics"', {}, "awsProfileName 'analytics' is not a profile"),
    ("", {"AWS_ACCESS_KEY_ID": "AKIAFLINKISHTEST0002"},
     "missing: AWS_SECRET_ACCESS_KEY; give both"),
])
def test_missing_aws_credentials_fail_at_load(monkeypatch: pytest.MonkeyPatch,
                                              jaas_options: str, env: dict[str, str],
                                              says: str) -> None:
    no_aws_credentials(monkeypatch)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(OptionError, match=f"option kafka.sasl.jaas.config .AWS MSK IAM.: "
                                          f".*{says}") as failure:
        parse(**{"bootstrap.servers": MSK_SERVERS, "sasl.mechanism": "AWS_MSK_IAM",
                 "sasl.jaas.config": f"{IAM_MODULE} required {jaas_options};"})
    assert "AKIAFLINKISHTEST0002" not in str(failure.value)


def test_a_profiles_credentials_are_found_without_showing_them(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    no_aws_credentials(monkeypatch)
    credentials = tmp_path / "credentials"
    credentials.write_text("[analytics]\naws_access_key_id = AKIAFLINKISHTEST0003\n"
                           "aws_secret_access_key = flinkish/profile/secret/0000000000\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    o = parse(**{"bootstrap.servers": MSK_SERVERS, "sasl.mechanism": "AWS_MSK_IAM",
                 "sasl.jaas.config": f'{IAM_MODULE} required awsProfileName="analytics";'})
    assert o.kafka.security.msk_iam == MskIam(region="eu-west-1", profile="analytics")
    shown = capsys.readouterr()
    assert "AKIAFLINKISHTEST0003" not in shown.out + shown.err


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
    callback = o.kafka.client_config()["oauth_cb"]
    assert o.kafka.client_config()["oauth_cb"] is callback  # one per process: pooled clients match

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
