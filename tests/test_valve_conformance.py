"""Flink's own ``StatusWatermarkValveTest``, replayed against :mod:`flinkish_core.valve`.

Source: apache/flink, ``flink-runtime/src/test/java/org/apache/flink/streaming/runtime/
watermarkstatus/StatusWatermarkValveTest.java`` (Flink 2.x, as of commit
160caf705bc449bf8bb5ff6c8c87b0eecf9c758c, which includes the tests for FLINK-40475's behaviour;
earlier versions, from Flink 1.14 on, keep the class under ``flink-streaming-java/src/test/java/
org/apache/flink/streaming/runtime/watermarkstatus/``). Every ``@Test`` method of that class is
one entry of :data:`CASES`, with the method's exact name as the pytest id, so
``pytest -k testNoOutputWhenAllActiveChannelsAreUnaligned`` runs the replay of that method.

Translation: ``new Watermark(t)`` is the int ``t``; Flink's ``WatermarkStatus.ACTIVE``/``IDLE``
are our enum's; ``valve.inputWatermark(wm, i, output)`` is ``input_watermark(t, i)``,
``valve.inputWatermarkStatus(s, i, output)`` is ``input_watermark_status(s, i)``;
``getSubpartitionStatus(i).watermark`` / ``.isWatermarkAligned`` (``getInputChannelStatus`` in
earlier versions) are ``channel(i).watermark`` / ``.aligned``.

Flink's tests pop the valve's output queue after a group of inputs and end with "nothing more".
Here the outputs are pinned after *every* input, which is at least as strict: an input after
which Flink pops nothing emits nothing, and what Flink pops after a group is attributed to the
input that produces it.

Three methods (marked FLINK-40475 below) pin behaviour that Flink 1.x's valve did not have and
that our valve implements on purpose (see the two corrections in :mod:`flinkish_core.valve`):
FLINK-40475 (apache/flink PR #29024) re-derives the aligned minimum when a channel turns active
again and flushes the maximum unconditionally when the last channel goes idle, as
``CombinedWatermarkStatus`` does since FLINK-38454. Their comments say what Flink 1.x emitted
instead. The expectations are Flink's current ones, unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from flinkish_core.valve import StatusWatermarkValve, WatermarkStatus

ACTIVE = WatermarkStatus.ACTIVE
IDLE = WatermarkStatus.IDLE

Output = int | WatermarkStatus
"""One thing the valve emits: a watermark (an int) or a valve status."""


@dataclass(frozen=True)
class Step:
    """One input to the valve and exactly what must follow it.

    ``watermark`` / ``aligned``, when given, are the state Flink's test asserts afterwards for
    the channel that received the input.
    """

    channel: int
    value: int | WatermarkStatus
    emits: tuple[Output, ...]
    watermark: int | None = None
    aligned: bool | None = None


def wm(
    channel: int, watermark: int, *emits: Output,
    now: int | None = None, aligned: bool | None = None,
) -> Step:
    """``inputWatermark(new Watermark(watermark), channel)``, then exactly ``emits``.

    ``now`` is the channel's watermark Flink's test asserts afterwards.
    """
    return Step(channel, watermark, emits, now, aligned)


def st(channel: int, status: WatermarkStatus, *emits: Output, aligned: bool | None = None) -> Step:
    """``inputWatermarkStatus(status, channel)``, then exactly ``emits``."""
    return Step(channel, status, emits, None, aligned)


CASES = [
    # Watermarks advance with increasing watermarks for a single input valve.
    pytest.param(1, [
        wm(0, 0, 0),
        wm(0, 25, 25),
    ], id="testSingleInputIncreasingWatermarks"),

    # Watermarks do not advance with decreasing watermark inputs for a single input valve.
    pytest.param(1, [
        wm(0, 25, 25),
        wm(0, 18),
        wm(0, 42, 42),
    ], id="testSingleInputDecreasingWatermarksYieldsNoOutput"),

    # Status toggling works, and non-toggling status inputs yield nothing, for one input.
    pytest.param(1, [
        st(0, ACTIVE),  # also shows that channels start ACTIVE
        st(0, IDLE, IDLE),
        st(0, IDLE),
        st(0, ACTIVE, ACTIVE),
    ], id="testSingleInputWatermarkStatusToggling"),

    # The watermark of an input channel remains intact while the channel is IDLE.
    pytest.param(1, [
        wm(0, 25, 25),
        st(0, IDLE, IDLE),
        wm(0, 50, now=25),  # ignored while idle
        st(0, ACTIVE, ACTIVE),
        wm(0, 50, 50),
    ], id="testSingleInputWatermarksIntactDuringIdleness"),

    # The valve yields a watermark only once every input has received one.
    pytest.param(3, [
        wm(0, 0),
        wm(1, 0),
        wm(2, 0, 0),  # now all channels have watermarks
    ], id="testMultipleInputYieldsWatermarkOnlyWhenAllChannelsReceivesWatermarks"),

    # A new minimum is emitted as soon as the minimum across the inputs advances.
    pytest.param(3, [
        wm(0, 0),
        wm(1, 0),
        wm(2, 0, 0),
        wm(0, 12),
        wm(2, 8),
        wm(2, 10),
        wm(1, 15, 10),  # lowest is now channel 2 at 10
        wm(2, 17, 12),  # lowest is now channel 0 at 12
        wm(0, 20, 15),  # lowest is now channel 1 at 15
    ], id="testMultipleInputIncreasingWatermarks"),

    # Decreasing watermarks yield no output for a multiple input valve.
    pytest.param(3, [
        wm(0, 25),
        wm(1, 10),
        wm(2, 17, 10),
        wm(0, 12),
        wm(1, 8),
        wm(2, 15),
    ], id="testMultipleInputDecreasingWatermarksYieldsNoOutput"),

    # Status toggling works, and non-toggling status inputs yield nothing, for two inputs.
    pytest.param(2, [
        st(0, ACTIVE),  # also shows that all channels start ACTIVE
        st(1, ACTIVE),
        st(1, IDLE),
        st(0, IDLE, IDLE),  # now all channels are IDLE
        st(0, IDLE),
        st(1, IDLE),
        st(1, ACTIVE, ACTIVE),  # one active input makes the valve ACTIVE again
        st(0, ACTIVE),  # already ACTIVE: no output
    ], id="testMultipleInputWatermarkStatusToggling"),

    # With some inputs idle, the minimum is computed and advanced from the active ones.
    pytest.param(3, [
        wm(0, 15),
        wm(1, 10),
        st(2, IDLE, 10),  # minimum of the remaining ACTIVE channels
        wm(1, 18, 15),  # now channel 0's 15
        wm(0, 20, 18),  # now channel 1's 18
    ], id="testMultipleInputWatermarkAdvancingWithPartiallyIdleChannels"),

    # As inputs go idle one by one, the minimum of the remaining active ones is emitted.
    pytest.param(3, [
        wm(0, 25),
        wm(1, 10),
        wm(2, 17, 10),
        st(1, IDLE, 17),  # channels 0 and 2 are ACTIVE: 17 is the minimum
        st(2, IDLE, 25),  # only channel 0 is ACTIVE: 25
    ], id="testMultipleInputWatermarkAdvancingAsChannelsIndividuallyBecomeIdle"),

    # When all inputs go idle, the maximum across all channels is flushed, then IDLE. With the
    # previous case: the final watermark does not depend on the order of going idle.
    pytest.param(3, [
        wm(0, 10),
        wm(1, 5),
        wm(2, 3, 3),
        st(0, IDLE),
        st(1, IDLE),
        st(2, IDLE, 10, IDLE),
    ], id="testMultipleInputFlushMaxWatermarkAndWatermarkStatusOnceAllInputsBecomeIdle"),

    # FLINK-40475 (correction 1): the maximum is flushed when all inputs go idle even if the
    # last one to go idle is unaligned (went idle, resumed, only partly caught up).
    pytest.param(3, [
        wm(0, 100),
        wm(1, 50),
        wm(2, 70, 50),
        st(1, IDLE, 70),  # minimum of channels 0 and 2
        st(1, ACTIVE, aligned=False),  # 50 is behind the last output 70
        wm(1, 60, now=60, aligned=False),  # recorded, still behind
        st(0, IDLE),
        st(2, IDLE),
        # Flink 1.x flushed only if this channel held the last output (60 != 70), so it
        # emitted just IDLE and 100 was lost; FLINK-40475 flushes unconditionally.
        st(1, IDLE, 100, IDLE),
    ], id="testMultipleInputFlushMaxWatermarkOnceAllInputsBecomeIdleWithUnalignedLastChannel"),

    # A channel that resumes must catch up with the last output before it counts again.
    pytest.param(3, [
        wm(0, 10),
        wm(1, 7),
        wm(2, 3, 3),
        st(2, IDLE, 7),
        st(2, ACTIVE, aligned=False),  # the minimum has advanced to 7 meanwhile
        wm(2, 5, now=5),  # accepted while realigning, but yields nothing
        wm(2, 9, aligned=True),  # caught up with 7: aligned again
        wm(1, 12, 9),  # the realigned channel now holds the minimum
    ], id="testMultipleInputWatermarkRealignmentAfterResumeActive"),

    # Nothing is emitted (in particular not Long.MAX_VALUE) when every ACTIVE channel is
    # unaligned.
    pytest.param(3, [
        wm(0, 10),
        wm(1, 7),
        st(2, IDLE, 7),
        st(2, ACTIVE),  # unaligned: catching up
        st(0, IDLE),
        st(1, IDLE),  # channel 2 is the only ACTIVE channel, and it is unaligned
    ], id="testNoOutputWhenAllActiveChannelsAreUnaligned"),

    # An unaligned active channel going idle changes nothing.
    pytest.param(2, [
        wm(0, 7),
        wm(1, 10, 7),
        st(0, IDLE, 10),
        st(0, ACTIVE),  # still unaligned: 7 < 10
        wm(0, 9),
        st(0, IDLE),
    ], id="testUnalignedActiveChannelBecomesIdle"),

    # FLINK-40475 (correction 2): a channel that resumes as the only aligned channel advances
    # the minimum at once instead of stalling until a larger watermark arrives on it.
    pytest.param(3, [
        wm(0, 10),
        wm(1, 7),
        st(2, IDLE, 7),
        st(2, ACTIVE),  # unaligned: its watermark never advanced
        st(0, IDLE),
        st(1, IDLE),  # the only ACTIVE channel (2) is unaligned: nothing can be emitted
        # Channel 0's 10 has caught up with the last output 7, so it realigns. Flink 1.x
        # emitted nothing here (it did not re-derive the minimum); FLINK-40475 emits 10.
        st(0, ACTIVE, 10, aligned=True),
        st(2, IDLE),  # the unaligned channel going idle again changes nothing
    ], id="testWatermarkAdvancesWhenReactivatedChannelBecomesOnlyAlignedChannel"),

    # FLINK-40475 (correction 2): a channel that resumes ahead of the last output realigns and
    # the new minimum is emitted at once; the later all-idle flush does not repeat it.
    pytest.param(3, [
        wm(0, 10),
        wm(1, 20),
        wm(2, 30, 10),
        st(2, IDLE),  # 30 is above the minimum: nothing changes
        st(0, IDLE, 20),  # minimum of channel 1
        st(0, ACTIVE, aligned=False),  # 10 < 20
        st(1, IDLE),  # no aligned channel remains
        # 30 is above the last output 20: aligned. Flink 1.x emitted nothing here, and as
        # channel 2 then went idle last without holding the last output, it never flushed
        # 30 either; FLINK-40475 emits 30 now.
        st(2, ACTIVE, 30, aligned=True),
        st(0, IDLE),
        st(2, IDLE, IDLE),  # the maximum, 30, was already emitted: only the status
    ], id="testRealignmentAfterResumeActiveEmitsNewMinWatermark"),
]


class Recorder:
    """A ValveOutput that collects emitted watermarks (ints) and statuses in order."""

    def __init__(self) -> None:
        self.outputs: list[Output] = []

    def emit_watermark(self, watermark: int) -> None:
        self.outputs.append(watermark)

    def emit_watermark_status(self, status: WatermarkStatus) -> None:
        self.outputs.append(status)

    def take(self) -> list[Output]:
        outputs, self.outputs = self.outputs, []
        return outputs


@pytest.mark.parametrize(("num_channels", "steps"), CASES)
def test_status_watermark_valve_test(num_channels: int, steps: list[Step]) -> None:
    """Replays the Flink ``StatusWatermarkValveTest`` method named by the case id."""
    out = Recorder()
    valve = StatusWatermarkValve(num_channels, out)
    for number, step in enumerate(steps, 1):
        if isinstance(step.value, WatermarkStatus):
            valve.input_watermark_status(step.value, step.channel)
        else:
            valve.input_watermark(step.value, step.channel)
        where = f"step {number} ({step.value!r} on channel {step.channel})"
        assert out.take() == list(step.emits), where
        if step.watermark is not None:
            assert valve.channel(step.channel).watermark == step.watermark, where
        if step.aligned is not None:
            assert valve.channel(step.channel).aligned is step.aligned, where
