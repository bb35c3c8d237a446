"""The serial link: the frame protocol (CRC check value, round trip, resynchronization), fuzzing of both
parsers (ours in Python, the generated firmware's in C, through a real pty), and hardware-in-the-loop
flights: the compiled C policy on one end of a pty pair, the HAL with our simulator as the plant on the other."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

from embodied.core.errors import UserError
from embodied.hardware import load_bundle
from embodied.hardware import protocol as P
from embodied.hardware.hil import FirmwareProcess, firmware_for
from embodied.hardware.loop import ControlLoop, LoopConfig
from embodied.hardware.robot import make_robot

FUZZ_FRAMES = 10_000  # the slow tier runs 100k


def test_crc16_ccitt_false_check_value():
    assert P.crc16(b"123456789") == 0x29B1  # the catalogued check value of CRC-16/CCITT-FALSE
    assert P.crc16(b"") == 0xFFFF


def test_frames_round_trip_and_resync():
    frames = [P.encode(P.STATE, 7, P.floats([1.5, -2.0, 3.25])), P.encode(P.RESET, 8),
              P.encode(P.ACTION, 9, b"x" * 255)]
    stream = b"\x00\xaa\xaa\x55\x01" + frames[0] + b"junk\xaa" + frames[1] + frames[2][:10]
    d = P.Decoder()
    got = d.feed(stream)
    got += d.feed(frames[2][10:])
    assert [(f.msg, f.seq) for f in got] == [(P.STATE, 7), (P.RESET, 8), (P.ACTION, 9)]
    assert P.unpack_floats(got[0].payload) == (1.5, -2.0, 3.25) and got[2].payload == b"x" * 255
    bad = bytearray(frames[0])
    bad[7] ^= 0x10
    d2 = P.Decoder()
    assert d2.feed(bytes(bad) + frames[1])[0].msg == P.RESET and d2.crc_errors == 1
    with pytest.raises(ValueError):
        P.encode(P.STATE, 0, b"x" * 256)


def fuzz_stream(rng: random.Random, n: int) -> tuple[bytes, int]:
    """Random frames, mutated frames (bit flips, truncation, bad lengths) and noise; the valid ones counted."""
    out, valid = bytearray(), 0
    for _ in range(n):
        kind = rng.random()
        payload = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 4, 16, 72, 255])))
        frame = bytearray(P.encode(rng.randrange(256), rng.randrange(256), payload))
        if kind < 0.3:
            valid += 1
        elif kind < 0.6:
            for _ in range(rng.randint(1, 3)):
                frame[rng.randrange(len(frame))] ^= 1 << rng.randrange(8)
        elif kind < 0.8:
            frame = frame[: rng.randrange(len(frame))]
        else:
            frame = bytearray(rng.getrandbits(8) for _ in range(rng.randrange(1, 40)))
        out += frame
    return bytes(out), valid


def _fuzz_decoder(n: int) -> None:
    rng = random.Random(0)
    stream, valid = fuzz_stream(rng, n)
    d = P.Decoder()
    got = 0
    for i in range(0, len(stream), 97):  # arbitrary chunking
        got += len(d.feed(stream[i:i + 97]))
        assert len(d.buf) <= P.OVERHEAD + P.MAX_PAYLOAD + 97  # bounded memory
    # every intact frame is recovered unless noise before it happened to look like a frame header that swallowed it
    assert valid * 0.9 <= got


def test_fuzz_python_decoder():
    _fuzz_decoder(FUZZ_FRAMES)


@pytest.mark.slow
def test_fuzz_python_decoder_100k():
    _fuzz_decoder(100_000)


def _fuzz_firmware(rpm_bundle, n: int) -> None:
    import serial

    with FirmwareProcess(firmware_for(rpm_bundle)) as path:
        port = serial.Serial(path, 921600, timeout=0.5)
        stream, _ = fuzz_stream(random.Random(1), n)
        for i in range(0, len(stream), 4096):
            port.write(stream[i:i + 4096])
            port.read(port.in_waiting)  # drain its replies
        port.write(b"\x00" * 300)  # flush any half frame it holds
        port.reset_input_buffer()
        port.write(P.encode(P.HEARTBEAT, 1))
        d, frames = P.Decoder(), []
        for _ in range(20):
            frames += [f for f in d.feed(port.read(max(1, port.in_waiting))) if f.msg == P.HEARTBEAT]
            if frames:
                break
        port.close()
    assert frames, "the firmware stopped answering after the fuzz stream"
    status, ok, crc_errors = struct.unpack_from("<BII", frames[0].payload)
    assert ok > 0 and crc_errors > 0


def test_fuzz_firmware_parser(rpm_bundle):
    _fuzz_firmware(rpm_bundle, FUZZ_FRAMES)


@pytest.mark.slow
def test_fuzz_firmware_parser_100k(rpm_bundle):
    _fuzz_firmware(rpm_bundle, 100_000)


def test_hil_flight_runs_the_c_policy(rpm_bundle):
    """Lock-step over the pty: every action the firmware returns is the bundle's policy of that state and of
    the action history the firmware keeps itself (across a RESET at each new episode)."""
    runner = load_bundle(rpm_bundle, "onnx")
    robot = make_robot("serial://hil?plant=quadrotor-hover&seed=3")
    robot.attach_bundle(rpm_bundle)
    rows = []

    class Check:  # the HAL-side reference: the same bundle through onnxruntime
        def __init__(self):
            self.worst = 0.0

    check = Check()
    with robot:
        original = robot.policy_action

        def compare(state):
            a = original(state)
            ref = runner.act(state.values)
            check.worst = max(check.worst, float(np.abs(a - ref).max()))
            rows.append(a)
            return a

        robot.policy_action = compare
        original_reset = robot.reset_policy

        def reset_both():
            original_reset()
            runner.reset()

        robot.reset_policy = reset_both
        summary = ControlLoop(robot, None, LoopConfig(100.0, lockstep=True, status=False, episodes=2)).run()
    assert summary["outcome"] == "completed" and summary["episodes"] == 2
    assert summary["robot"]["timeouts"] == 0 and summary["robot"]["crc_errors"] == 0
    assert len(rows) == summary["ticks"] + 1 and check.worst <= 1e-5  # + the loop's warm-up call


def test_unreachable_serial_device_is_one_user_error():
    with pytest.raises(UserError, match="cannot open"):
        make_robot("serial:///dev/does-not-exist?plant=quadrotor-hover").connect()
    with pytest.raises(UserError, match="plant"):
        make_robot("serial:///dev/ttyUSB0")


def test_firmware_death_is_a_fault(rpm_bundle):
    robot = make_robot("serial://hil?plant=quadrotor-hover")
    robot.attach_bundle(rpm_bundle)
    runner_ticks = []
    with robot:
        original = robot.policy_action

        def dying(state):
            runner_ticks.append(1)
            if len(runner_ticks) == 30:
                robot._fw.proc.kill()
                robot._fw.proc.wait()
            return original(state)

        robot.policy_action = dying
        summary = ControlLoop(robot, None, LoopConfig(100.0, lockstep=True, status=False, max_ticks=200)).run()
    assert summary["outcome"] == "fault" and summary["fault"]  # the write to a line nobody reads, or the dead process
    assert [t["dst"] for t in summary["transitions"]][-2:] == ["fault", "disarmed"]


def test_estop_over_a_dead_link_still_disarms(rpm_bundle):
    """The e-stop's link-level command fails (the firmware is gone): the HAL still ends disarmed, as a fault."""
    from embodied.hardware.safety import EStop

    estop = EStop()
    robot = make_robot("serial://hil?plant=quadrotor-hover")
    robot.attach_bundle(rpm_bundle)
    with robot:
        original = robot.policy_action
        calls = []

        def dying(state):
            calls.append(1)
            if len(calls) == 20:
                robot._fw.proc.kill()
                robot._fw.proc.wait()
                estop.trip("operator")
                return np.zeros(4, np.float32)
            return original(state)

        robot.policy_action = dying
        summary = ControlLoop(robot, None, LoopConfig(100.0, lockstep=True, status=False, max_ticks=100), estop).run()
    dst = [t["dst"] for t in summary["transitions"]]
    assert dst[-2:] == ["estop", "disarmed"] and summary["outcome"] == "fault" and not robot.armed


def test_a_stalled_firmware_is_a_missing_command_then_recovers(rpm_bundle):
    """SIGSTOP the firmware for 0.2 s: its replies time out (missing commands), the watchdog holds, and when it
    answers again the loop recovers."""
    import os
    import signal
    import threading

    robot = make_robot("serial://hil?plant=quadrotor-hover&timeout=0.02")
    robot.attach_bundle(rpm_bundle)
    with robot:
        pid = robot._fw.proc.pid
        original = robot.policy_action
        calls = []

        def stall(state):
            calls.append(1)
            if len(calls) == 20:
                os.kill(pid, signal.SIGSTOP)
                threading.Timer(0.2, os.kill, (pid, signal.SIGCONT)).start()
            return original(state)

        robot.policy_action = stall
        summary = ControlLoop(robot, None, LoopConfig(100.0, lockstep=True, status=False, max_ticks=80)).run()
    reasons = [t["reason"] for t in summary["transitions"]]
    assert summary["robot"]["timeouts"] >= 1 and "missing command" in reasons and "recovered" in reasons
    assert summary["outcome"] == "completed"
