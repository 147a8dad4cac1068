"""``sasl.jaas.config`` read as Kafka's ``JaasConfig`` reads it: the cases of Kafka's
``JaasContextTest``, the tokenizer's corners, errors that never quote a value, and the tokens
compared with the JDK's own ``StreamTokenizer`` where ``java`` is on the machine."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flinkish_core.jaas import (
    JaasError,
    _Tokenizer,
    parse_jaas_config,
    parse_jaas_entries,
)

SECRET = "s3cr3t-Value-n0t-shown"


@pytest.mark.parametrize("flag", ["required", "REQUISITE", "Sufficient", "optional"])
def test_control_flags_in_any_case(flag: str) -> None:
    entry = parse_jaas_config(f"test.Module {flag} propName=propValue;")
    assert (entry.login_module, entry.control_flag) == ("test.Module", flag.lower())
    assert entry.options == {"propName": "propValue"}


def test_no_options_and_many_options() -> None:
    assert parse_jaas_config("test.Module required;").options == {}
    many = " ".join(f"propName{i}=propValue{i}" for i in range(10))
    assert parse_jaas_config(f"test.Module sufficient {many};").options == {
        f"propName{i}": f"propValue{i}" for i in range(10)}


def test_quoted_values_and_names() -> None:
    entry = parse_jaas_config(
        'm required propName="prop value" propName2="value1 = 1, value2 = 2" '
        "\"prop name\"=propValue single='a;b=c' option1=\"3\";")
    assert entry.options == {"propName": "prop value", "propName2": "value1 = 1, value2 = 2",
                             "prop name": "propValue", "single": "a;b=c", "option1": "3"}


def test_escapes_inside_quotes_as_streamtokenizer_reads_them() -> None:
    entry = parse_jaas_config(
        r'm required a="q\"uote" b="back\\slash" c="\t\n" d="\101\0618" e=' + r"'it\'s' "
        r'f="\q";')
    assert entry.options == {"a": 'q"uote', "b": "back\\slash", "c": "\t\n", "d": "A18",
                             "e": "it's", "f": "q"}


def test_comments_and_line_breaks() -> None:
    text = ("// a comment line\n"
            "m /* flag next */ required\n"
            "  user=alice // the user\n"
            "  password='p/w' /* quoted slashes stay */ ;\n")
    assert parse_jaas_config(text).options == {"user": "alice", "password": "p/w"}


def test_an_unquoted_slash_starts_a_comment_as_in_java() -> None:
    # tokenEndpoint=https://x: the value is "https:" and the rest of the line is a comment
    with pytest.raises(JaasError, match="not terminated by ';'"):
        parse_jaas_config("m required url=https://idp.example.com/token;")
    entry = parse_jaas_config("m required url=https://idp\n;")
    assert entry.options == {"url": "https:"}


def test_a_quote_left_open_ends_at_the_line_end() -> None:
    entry = parse_jaas_config("m required a='open\n b=c;")
    assert entry.options == {"a": "open", "b": "c"}


def test_dollar_and_non_ascii_survive() -> None:
    entry = parse_jaas_config('m required username="$ConnectionString" pw=Grüße€;')
    assert entry.options == {"username": "$ConnectionString", "pw": "Grüße€"}


def test_several_entries() -> None:
    text = " ".join(f"test.Module{i} required index=Index{i} module=Module{i};"
                    for i in range(3))
    entries = parse_jaas_entries(text)
    assert [e.login_module for e in entries] == [f"test.Module{i}" for i in range(3)]
    assert entries[2].options == {"index": "Index2", "module": "Module2"}
    with pytest.raises(JaasError, match="3 login modules are given.*exactly one"):
        parse_jaas_config(text)


@pytest.mark.parametrize(("text", "says"), [
    ("  required option1=value1;", "control flag .* is not one of"),
    ("test.loginModule option1=value1;", "control flag at character 18 is not one of"),
    ("loginModule required option1;", "option 'option1' at character 22 needs a value"),
    ("test.testMissingSemicolon required option1=value1", "not terminated by ';'"),
    ("test.testInvalidControlFlag { option1=3;", "control flag at character 29"),
    ("m required =x;", "an option name at character 12 needs a value"),
    ("m", "control flag is missing"),
    ("", "no login module"),
    ("/* only a comment */", "no login module"),
    ("; m required;", "login module class name is expected at character 1"),
])
def test_malformed_configs_say_where(text: str, says: str) -> None:
    with pytest.raises(JaasError, match=says):
        parse_jaas_entries(text)


@pytest.mark.parametrize("text", [
    f"m required password='{SECRET}'",  # no ';'
    f"m required password {SECRET};",  # no '='
    f"m {SECRET} password=x;",  # the secret where the flag goes
    f"m required password='{SECRET}'; other required;",
    f"m required password={SECRET} user;",
])
def test_errors_never_quote_a_value(text: str) -> None:
    with pytest.raises(JaasError) as failure:
        parse_jaas_config(text)
    assert SECRET not in str(failure.value)
    assert "s3cr3t" not in repr(failure.value)


def test_an_entry_repr_holds_no_option_value() -> None:
    assert SECRET not in repr(parse_jaas_config(f"m required password='{SECRET}';"))


# --- the JDK's StreamTokenizer as the reference -------------------------------------------

_JAVA = shutil.which("java")
_HARNESS = Path(__file__).parent / "java" / "JaasTokens.java"

CORPUS = [
    "a required option1=3;",
    "x.y required a=\"b\\\"c\" d='e f';",
    "m required a='\\101\\0618\\477\\8' b=\"\\a\\b\\f\\v\\r\";",
    "m required a=b//c\nd=e;",
    "m required a=b/c\nd=e;",
    "m required a=b/*c\nd*/=e;",
    "m required a='x\ny';",
    "m required a=\"x\\",
    "m\trequired\r\na=\x01b;",
    "m required a=\x80\x81\x9f\xa0\xff\u0100\u20ac;",
    "/* open comment",
    "m required a==b;;",
    "m required 'a b'='c d' \"e\"=f;",
    "kafkashaded.org.apache.kafka.common.security.plain.PlainLoginModule required "
    "username=\"$ConnectionString\" password=\"Endpoint=sb://ns.servicebus.windows.net/;"
    "SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=abc+/=\";",
]


def _ours(text: str) -> list[tuple[str, str]]:
    tokens, out = _Tokenizer(text), []
    while (token := tokens.next()).kind != "eof":
        out.append((token.kind, token.text or ""))
    return out


def _javas(texts: list[str]) -> list[list[tuple[str, str]]]:
    assert _JAVA is not None
    lines = "".join("".join(f"{ord(c):04x}" for c in t) + "\n" for t in texts)
    done = subprocess.run([_JAVA, str(_HARNESS)], input=lines, capture_output=True, text=True,
                          timeout=120, check=True)
    out = []
    for line in done.stdout.splitlines():
        tokens = []
        for item in filter(None, line.split("\x02")):
            kind, hexed = item.split("\x01")
            tokens.append((kind, "".join(chr(int(hexed[i:i + 4], 16))
                                         for i in range(0, len(hexed), 4))))
        out.append(tokens)
    return out


_TRICKY = st.text(alphabet=st.sampled_from(list("ab=;'\"\\/*\n\r\t 7$\x00\x85\xa0é€")),
                  max_size=40)


@pytest.mark.skipif(_JAVA is None, reason="needs java (the JDK's StreamTokenizer)")
def test_tokens_equal_the_jdks() -> None:
    generated: list[str] = []

    @settings(max_examples=300, database=None)
    @given(_TRICKY)
    def collect(text: str) -> None:
        generated.append(text)

    collect()
    texts = CORPUS + generated
    expected = _javas(texts)
    assert len(expected) == len(texts)
    for text, java in zip(texts, expected, strict=True):
        assert _ours(text) == java, repr(text)
