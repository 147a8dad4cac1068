"""The native fetch path's decoding (flinkish_source.kafka.protocol and its C decoder) against
record batches encoded here by Kafka's format (KIP-98, magic 2): plain and gzip batches, null
keys and values, LogAppendTime, ranges that cut batches, a batch cut off by the fetch size,
control batches and aborted transactions, codecs it leaves to librdkafka, malformed input,
and the Fetch v4 request and response framing."""

from __future__ import annotations

import struct
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from record_batches import BASE_TS, Rec, batch, control, legacy_set, plain

from flinkish_kafka.connection import request_frame
from flinkish_source.kafka import _record_batch  # type: ignore[attr-defined]
from flinkish_source.kafka.protocol import (
    FetchWant,
    PartitionDecoder,
    PartitionFetch,
    RecordChunk,
    UnsupportedBatch,
    decode_fetch,
    encode_fetch,
)


def fetched(records: bytes, aborted: list[tuple[int, int]] | None = None) -> PartitionFetch:
    return PartitionFetch("t", 0, 0, 10**9, 10**9, sorted(aborted or [], key=lambda a: a[1]),
                          memoryview(records))


def read(decoder: PartitionDecoder, *responses: PartitionFetch) -> list[tuple]:
    rows = []
    for response in responses:
        for c in decoder.decode(response):
            rows.extend(zip(c.offsets.to_pylist(), c.keys.to_pylist(), c.values.to_pylist(),
                            c.timestamps.to_pylist(), c.timestamp_types.to_pylist(),
                            strict=True))
    return rows


def offsets(rows: list[tuple]) -> list[int]:
    return [r[0] for r in rows]


def test_plain_batches_decode_to_every_field() -> None:
    decoder = PartitionDecoder(0, 100, 1000)
    rows = read(decoder, fetched(plain(0, 3) + plain(3, 2)))
    assert rows == [(o, b"k%d" % o, b"v%d" % o, BASE_TS + o - b, 0)
                    for b, n in ((0, 3), (3, 2)) for o in range(b, b + n)]
    assert decoder.position == 5 and not decoder.done


def test_null_keys_and_values_and_empty_ones_differ() -> None:
    records = [Rec(0, None, b"v"), Rec(1, b"", None), Rec(2, b"k", b"")]
    [c] = PartitionDecoder(7, 10, 10).decode(fetched(batch(7, records)))
    assert c.keys.to_pylist() == [None, b"", b"k"] and c.keys.null_count == 1
    assert c.values.to_pylist() == [b"v", None, b""] and c.values.null_count == 1
    assert c.offsets.to_pylist() == [7, 8, 9]


def test_log_append_time_is_the_batch_max_timestamp() -> None:
    records = [Rec(0, b"a", b"1", ts_delta=5), Rec(1, b"b", b"2", ts_delta=9)]
    rows = read(PartitionDecoder(0, 2, 10),
                fetched(batch(0, records, log_append=True, max_ts=BASE_TS + 99)))
    assert [(r[3], r[4]) for r in rows] == [(BASE_TS + 99, 1), (BASE_TS + 99, 1)]


def test_the_range_cuts_batches_at_start_and_end() -> None:
    decoder = PartitionDecoder(2, 7, 100)
    rows = read(decoder, fetched(plain(0, 5) + plain(5, 5)))
    assert offsets(rows) == [2, 3, 4, 5, 6]
    assert decoder.done and decoder.position == 7


def test_chunks_end_at_batch_boundaries_after_the_chunk_size() -> None:
    decoder = PartitionDecoder(0, 100, 4)
    chunks = list(decoder.decode(fetched(plain(0, 3) + plain(3, 3) + plain(6, 3))))
    assert [len(c) for c in chunks] == [6, 3]  # stops at the first boundary past 4 records


def test_a_batch_cut_by_the_fetch_size_waits_for_the_next_fetch() -> None:
    whole = plain(0, 3) + plain(3, 3)
    decoder = PartitionDecoder(0, 6, 100)
    assert offsets(read(decoder, fetched(whole[:-5]))) == [0, 1, 2]
    assert decoder.position == 3
    assert offsets(read(decoder, fetched(plain(3, 3)))) == [3, 4, 5]
    assert decoder.done


def test_a_fetch_that_starts_inside_a_batch_skips_what_was_read() -> None:
    decoder = PartitionDecoder(0, 10, 100)
    decoder.position = 4  # the broker returns the whole batch holding offset 4
    assert offsets(read(decoder, fetched(plain(0, 6)))) == [4, 5]


@pytest.mark.parametrize("codec,xerial", [(1, False), (2, False), (2, True), (3, False),
                                          (4, False)],
                         ids=["gzip", "snappy", "snappy-xerial", "lz4", "zstd"])
def test_every_kafka_codec_is_decompressed(codec: int, xerial: bool) -> None:
    records = [Rec(i, b"k%d" % i, b"v" * 50 + b"%d" % i, ts_delta=i) for i in range(200)]
    decoder = PartitionDecoder(3, 150, 1000)
    rows = read(decoder, fetched(plain(0, 2) + batch(2, records, codec=codec, xerial=xerial)))
    assert offsets(rows) == list(range(3, 150))
    assert rows[0][1:3] == (b"k1", b"v" * 50 + b"1") and rows[-1][2] == b"v" * 50 + b"147"
    assert decoder.done


def test_a_codec_kafka_does_not_define_is_left_to_librdkafka_after_what_came_before() -> None:
    decoder = PartitionDecoder(0, 10, 100)
    chunks = decoder.decode(fetched(plain(0, 2) + batch(2, [Rec(0, b"k", b"v")], codec=5)))
    assert offsets(read_chunk(next(chunks))) == [0, 1]
    with pytest.raises(UnsupportedBatch, match="codec 5-compressed record batch at offset 2"):
        next(chunks)
    assert decoder.position == 2  # librdkafka goes on from there


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_a_payload_its_codec_cannot_decompress_is_left_to_librdkafka(codec: int) -> None:
    bad = batch(0, [Rec(0, b"k", b"v")], codec=codec, payload=b"\x01\x02not compressed")
    with pytest.raises(UnsupportedBatch, match="at offset 0 could not be decompressed"):
        list(PartitionDecoder(0, 10, 100).decode(fetched(bad)))


def read_chunk(c: object) -> list[tuple]:
    from flinkish_source.kafka.protocol import Columns

    assert isinstance(c, Columns)
    return list(zip(c.offsets.to_pylist(), c.keys.to_pylist(), strict=True))


def _with_headers() -> list[Rec]:
    return [Rec(0, b"a", b"1", headers=(("trace", b"t1"), ("empty", b""))),
            Rec(1, b"b", b"2"),
            Rec(2, b"c", b"3", headers=(("h\u00e9", b"\x00\xff"),)),
            Rec(3, b"d", b"4", headers=(("nulled", None),))]


@pytest.mark.parametrize("codec", [0, 4])
def test_headers_are_decoded_when_asked_into_the_schemas_column(codec: int) -> None:
    from flinkish_source.schema import arrow_schema

    decoder = PartitionDecoder(1, 4, 100, headers=True)
    [c] = decoder.decode(fetched(batch(0, _with_headers(), codec=codec)))
    assert c.headers is not None
    assert c.headers.type == arrow_schema(True).field("headers").type
    assert c.headers.to_pylist() == [[], [{"key": "h\u00e9", "value": b"\x00\xff"}],
                                     [{"key": "nulled", "value": None}]]
    assert c.offsets.to_pylist() == [1, 2, 3]
    views = list(RecordChunk("t", 0, c))
    assert [v.headers() for v in views] == [None, [("h\u00e9", b"\x00\xff")],
                                            [("nulled", None)]]


def test_headers_are_skipped_unless_asked() -> None:
    [c] = PartitionDecoder(0, 4, 100).decode(fetched(batch(0, _with_headers())))
    assert c.headers is None and c.values.to_pylist() == [b"1", b"2", b"3", b"4"]
    assert [v.headers() for v in RecordChunk("t", 0, c)] == [None] * 4


def test_a_header_key_that_is_not_utf8_is_left_to_librdkafka() -> None:
    bad = [Rec(0, b"a", b"1", headers=(("x", b"1"),))]
    raw = bytearray(batch(0, bad))
    raw[raw.index(b"x")] = 0xFF  # the key's only byte
    with pytest.raises(UnsupportedBatch, match="header key is not UTF-8"):
        list(PartitionDecoder(0, 1, 100, headers=True).decode(fetched(bytes(raw))))


def test_a_header_overrunning_its_record_is_an_error() -> None:
    raw = bytearray(batch(5, [Rec(0, b"a", b"1", headers=(("k", b"v"),))]))
    raw[raw.index(b"k") - 1] = 0x7E  # the header key's length: past the record's end
    with pytest.raises(ValueError, match="base offset 5: a record header overruns"):
        list(PartitionDecoder(0, 10, 100, headers=True).decode(fetched(bytes(raw))))


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", [0, 1, 2])
def test_an_old_message_format_is_left_to_librdkafka(magic: int, codec: int) -> None:
    """Real v0/v1 message sets, whose timestamp (1.7e12 ms: bytes 00 00 01 8b cf e5 68 00)
    and key length fill the bytes of a v2 lastOffsetDelta with a negative number: never
    taken for a batch before the range, never a malformed-batch error."""
    decoder = PartitionDecoder(3, 10, 100)
    with pytest.raises(UnsupportedBatch, match=f"message format v{magic} .magic {magic}. at"):
        list(decoder.decode(fetched(legacy_set(0, magic, 5, codec=codec))))
    assert decoder.position == 3  # librdkafka reads on from the range's start


def test_an_old_message_after_v2_batches_hands_over_from_there() -> None:
    decoder = PartitionDecoder(0, 10, 100)
    rows: list[tuple] = []
    with pytest.raises(UnsupportedBatch, match="message format v0 .magic 0. at offset 4"):
        for c in decoder.decode(fetched(plain(0, 4) + legacy_set(4, 0, 1))):
            rows.extend(c.offsets.to_pylist())
    assert rows == [0, 1, 2, 3] and decoder.position == 4


def test_control_batches_are_skipped_and_count_as_read() -> None:
    decoder = PartitionDecoder(0, 4, 100)
    txn = batch(0, [Rec(0, b"a", b"1"), Rec(1, b"b", b"2")], transactional=True, producer=7)
    rows = read(decoder, fetched(txn + control(2, 7, abort=False) + plain(3, 1)))
    assert offsets(rows) == [0, 1, 3] and decoder.done


def test_a_range_ending_on_a_transaction_marker_is_done() -> None:
    decoder = PartitionDecoder(0, 3, 100)
    txn = batch(0, [Rec(0, b"a", b"1"), Rec(1, b"b", b"2")], transactional=True, producer=7)
    assert offsets(read(decoder, fetched(txn + control(2, 7, abort=False)))) == [0, 1]
    assert decoder.done and decoder.position == 3


def test_aborted_transactions_are_dropped_up_to_their_abort_marker() -> None:
    """Producer 7 aborts offsets 0-1 and commits 5-6 later; producer 8 commits 3 in between;
    producer 9 is not transactional."""
    records = (
        batch(0, [Rec(0, b"a", b"x"), Rec(1, b"b", b"x")], transactional=True, producer=7)
        + control(2, 7, abort=True)
        + batch(3, [Rec(0, b"c", b"x")], transactional=True, producer=8)
        + plain(4, 1)
        + batch(5, [Rec(0, b"d", b"x"), Rec(1, b"e", b"x")], transactional=True, producer=7)
        + control(7, 7, abort=False)
        + control(8, 8, abort=False)
    )
    decoder = PartitionDecoder(0, 9, 100)
    rows = read(decoder, fetched(records, aborted=[(7, 0)]))
    assert offsets(rows) == [3, 4, 5, 6]
    assert decoder.done


def test_an_aborted_transaction_spanning_two_fetches_stays_aborted() -> None:
    first = batch(0, [Rec(0, b"a", b"x")], transactional=True, producer=7)
    second = (batch(1, [Rec(0, b"b", b"x")], transactional=True, producer=7)
              + control(2, 7, abort=True) + plain(3, 1))
    decoder = PartitionDecoder(0, 4, 100)
    rows = read(decoder, fetched(first, aborted=[(7, 0)]), fetched(second, aborted=[(7, 0)]))
    assert offsets(rows) == [3]


def test_a_record_overrunning_its_batch_is_an_error_naming_the_batch() -> None:
    good = plain(40, 2)
    bad = bytearray(good)
    bad[61] = 0x7E  # the first record's length: far past the batch's end
    with pytest.raises(ValueError, match="malformed Kafka record batch at base offset 40"):
        list(PartitionDecoder(0, 100, 100).decode(fetched(bytes(bad))))


def test_the_decoder_rejects_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="mode"):
        _record_batch.decode(b"", 0, 0, 1, 10, 7)


def test_record_views_answer_like_librdkafka_messages() -> None:
    [c] = PartitionDecoder(0, 2, 10).decode(fetched(plain(0, 2)))
    chunk = RecordChunk("t", 3, c)
    assert len(chunk) == 2
    assert chunk[0].offset() == 0 and chunk[-1].offset() == 1
    views = list(chunk)
    assert [(v.topic(), v.partition(), v.offset(), v.key(), v.value(), v.timestamp(),
             v.headers(), v.error()) for v in views] == [
        ("t", 3, o, b"k%d" % o, b"v%d" % o, (1, BASE_TS + o), None, None) for o in (0, 1)]
    assert [v.offset() for v in chunk[1:]] == [1]


def test_fetch_request_and_response_framing() -> None:
    body = encode_fetch([FetchWant("t", 0, 42, 1024), FetchWant("t", 1, 7, 1024),
                         FetchWant("u", 0, 0, 2048)], 100, 1 << 20, True, 7)
    request = request_frame(1, 4, 5, "me", False, body)
    size, api, version, correlation, client = struct.unpack_from(">ihhih", request)
    assert (size, api, version, correlation) == (len(request) - 4, 1, 4, 5)
    assert request[14:14 + client] == b"me"  # client.id
    assert struct.unpack_from(">iiiib", request, 16) == (-1, 100, 7, 1 << 20, 1)
    assert request.count(b"\x00\x01t") == 1 and request.count(b"\x00\x01u") == 1

    records = plain(0, 2)
    body = (struct.pack(">i", 0) + struct.pack(">i", 1) + struct.pack(">h", 1) + b"t"
            + struct.pack(">i", 2)
            + struct.pack(">ihqqi", 0, 0, 10, 8, 1) + struct.pack(">qq", 9, 3)
            + struct.pack(">i", len(records)) + records
            + struct.pack(">ihqqi", 1, 1, -1, -1, -1) + struct.pack(">i", -1))
    first, second = decode_fetch(memoryview(body))
    assert (first.topic, first.partition, first.error, first.high_watermark,
            first.last_stable_offset, first.aborted) == ("t", 0, 0, 10, 8, [(9, 3)])
    assert bytes(first.records) == records
    assert (second.partition, second.error, second.aborted, bytes(second.records)) == (
        1, 1, [], b"")


@pytest.mark.parametrize("codec", [1, 4])
def test_a_batch_decompressing_past_the_limit_is_left_to_librdkafka(codec: int) -> None:
    big = batch(0, [Rec(0, b"k", b"\0" * 50_000)], codec=codec)
    with pytest.raises(UnsupportedBatch, match="decompresses to more than 10000 bytes"):
        list(PartitionDecoder(0, 10, 100, max_batch=10_000).decode(fetched(big)))
    assert len(read(PartitionDecoder(0, 10, 100, max_batch=60_000), fetched(big))) == 1


_VALID = (plain(0, 3) + batch(3, [Rec(0, b"k", None, headers=(("h", b"v"), ("n", None)))])
          + control(4, 7, abort=True) + batch(5, [Rec(i, b"k", b"v") for i in range(4)],
                                              codec=4))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_damaged_batches_fail_cleanly_never_crash(data: st.DataObject) -> None:
    """The C decoder reads bytes from the network: any damage (bytes changed, cut short,
    random) ends in a result or a Python error, never a crash or a read past the buffer."""
    raw = bytearray(_VALID)
    for _ in range(data.draw(st.integers(0, 8))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    raw = raw[:data.draw(st.integers(0, len(raw)))] + data.draw(st.binary(max_size=64))
    headers = data.draw(st.booleans())
    aborted = data.draw(st.sampled_from([[], [(7, 0)]]))
    decoder = PartitionDecoder(0, 20, data.draw(st.integers(1, 10)), headers=headers)
    try:
        for c in decoder.decode(fetched(bytes(raw), aborted)):
            assert len(c.keys) == len(c.offsets) == len(c.timestamps)
            c.keys.validate(full=True)
            c.values.validate(full=True)
            if headers:
                assert c.headers is not None and len(c.headers) == len(c.offsets)
                c.headers.validate(full=True)
    except (ValueError, UnsupportedBatch, struct.error, IndexError):
        pass


@pytest.mark.parametrize("codec", [2, 3, 4], ids=["snappy", "lz4", "zstd"])
def test_without_cramjam_a_batch_of_its_codecs_is_left_to_librdkafka_naming_the_extra(
        codec: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cramjam", None)  # import cramjam: ModuleNotFoundError
    records = batch(2, [Rec(0, b"k", b"v")], codec=codec)
    decoder = PartitionDecoder(0, 10, 100)
    chunks = decoder.decode(fetched(plain(0, 2) + records))
    assert offsets(read_chunk(next(chunks))) == [0, 1]
    with pytest.raises(UnsupportedBatch, match=r"offset 2: .*cramjam, which is not installed "
                                               r"\(pip install 'flinkish\[native\]'\)"):
        next(chunks)
    assert decoder.position == 2
    # gzip needs nothing more
    gzipped = batch(0, [Rec(0, b"k", b"v")], codec=1)
    assert offsets(read(PartitionDecoder(0, 1, 100), fetched(gzipped))) == [0]
