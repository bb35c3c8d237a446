"""MAVLink: frame conversions (exact), the software-in-the-loop vehicle's PX4 rules (offboard needs a set-point
stream, arming needs offboard, stream loss is a failsafe, flight termination), a flight over UDP loopback
whose state is the plant's, an unreachable vehicle, and fuzzed datagrams into the driver's parser."""

from __future__ import annotations

import math
import random
import socket
import time

import numpy as np
import pytest

from embodied.core.errors import UserError
from embodied.hardware import load_bundle
from embodied.hardware.frames import euler_to_rotmat, ned_to_ours, ours_to_ned, quat_to_rotmat, rotmat_to_euler
from embodied.hardware.loop import ControlLoop, LoopConfig
from embodied.hardware.robot import make_robot
from embodied.hardware.sitl.mavlink import PX4_OFFBOARD, MavlinkVehicle

FUZZ_DATAGRAMS = 10_000


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- frames ----------------------------------------------------------------------------------------------
def test_frames_exact_values():
    # yaw 90 deg in NED (nose east) is nose right of north: in ours (z up, y left) a -90 deg turn about z
    p, r, v, w = ned_to_ours((1.0, 2.0, -3.0), (0.1, 0.2, 0.3), 0.0, 0.0, math.pi / 2, (0.4, 0.5, 0.6))
    np.testing.assert_allclose(p, [1.0, -2.0, 3.0])
    np.testing.assert_allclose(v, [0.1, -0.2, -0.3])
    np.testing.assert_allclose(w, [0.4, -0.5, -0.6])
    np.testing.assert_allclose(r, [[0, 1, 0], [-1, 0, 0], [0, 0, 1]], atol=1e-12)
    # a positive roll in FRD (right wing down) is a positive roll about x in FLU too (x is shared)
    _, r, _, _ = ned_to_ours((0, 0, 0), (0, 0, 0), 0.3, 0.0, 0.0, (0, 0, 0))
    np.testing.assert_allclose(r, euler_to_rotmat(0.3, 0.0, 0.0), atol=1e-12)
    rng = np.random.default_rng(0)
    for _ in range(100):
        q = rng.normal(size=4)
        q /= np.linalg.norm(q)
        rot = quat_to_rotmat(q)
        pn, (ro, pi_, ya), vn, wn = ours_to_ned(rng.normal(size=3), rot, rng.normal(size=3), rng.normal(size=3))
        _, back, _, _ = ned_to_ours(pn, vn, ro, pi_, ya, wn)
        np.testing.assert_allclose(back, rot, atol=1e-9)
        np.testing.assert_allclose(euler_to_rotmat(*rotmat_to_euler(rot)), rot, atol=1e-9)


# ---- the vehicle's rules -----------------------------------------------------------------------------------
def gcs(port: int):
    from pymavlink import mavutil

    c = mavutil.mavlink_connection(f"udpout:127.0.0.1:{port}", source_system=255, source_component=190)
    c.mav.heartbeat_send(6, 8, 0, 0, 0)
    assert c.recv_match(type="HEARTBEAT", blocking=True, timeout=2) is not None
    return c


def ack(c, command: int) -> int:
    while True:
        m = c.recv_match(type="COMMAND_ACK", blocking=True, timeout=2)
        assert m is not None, "no COMMAND_ACK"
        if m.command == command:
            return m.result


def test_vehicle_enforces_px4_offboard_rules():
    from pymavlink import mavutil

    m = mavutil.mavlink
    port = free_port()
    with MavlinkVehicle(port, offboard_loss_s=0.3) as v:
        c = gcs(port)
        c.mav.command_long_send(1, 1, m.MAV_CMD_DO_SET_MODE, 0, 1, PX4_OFFBOARD, 0, 0, 0, 0, 0)
        assert ack(c, m.MAV_CMD_DO_SET_MODE) == m.MAV_RESULT_DENIED  # no set-point stream yet
        c.mav.command_long_send(1, 1, m.MAV_CMD_COMPONENT_ARM_DISARM, 0, 1, 0, 0, 0, 0, 0, 0)
        assert ack(c, m.MAV_CMD_COMPONENT_ARM_DISARM) == m.MAV_RESULT_DENIED  # not in offboard
        for _ in range(6):
            c.mav.set_attitude_target_send(0, 1, 1, 128, [1, 0, 0, 0], 0, 0, 0, 0.44)
            time.sleep(0.05)
        c.mav.command_long_send(1, 1, m.MAV_CMD_DO_SET_MODE, 0, 1, PX4_OFFBOARD, 0, 0, 0, 0, 0)
        assert ack(c, m.MAV_CMD_DO_SET_MODE) == m.MAV_RESULT_ACCEPTED
        c.mav.command_long_send(1, 1, m.MAV_CMD_COMPONENT_ARM_DISARM, 0, 1, 0, 0, 0, 0, 0, 0)
        assert ack(c, m.MAV_CMD_COMPONENT_ARM_DISARM) == m.MAV_RESULT_ACCEPTED and v.armed
        time.sleep(0.6)  # the stream stops: failsafe to hold
        assert v.main_mode != PX4_OFFBOARD and v.counts["failsafe"] == 1 and "offboard lost: hold" in v.events
        c.mav.command_long_send(1, 1, m.MAV_CMD_DO_FLIGHTTERMINATION, 0, 1, 0, 0, 0, 0, 0, 0)
        assert ack(c, m.MAV_CMD_DO_FLIGHTTERMINATION) == m.MAV_RESULT_ACCEPTED
        assert v.terminated and not v.armed
        c.close()


# ---- the driver --------------------------------------------------------------------------------------------
def test_flight_over_mavlink_reads_the_plant_and_lands(rates_bundle, plant_state, lagged_error):
    port = free_port()
    runner = load_bundle(rates_bundle)
    with MavlinkVehicle(port, seed=4) as v, make_robot(f"mavlink://udp:127.0.0.1:{port}") as robot:
        states = []

        class Spy:  # the runner, recording what it was given beside the vehicle's own plant state
            def reset(self):
                runner.reset()

            def act(self, s):
                states.append((s.copy(), plant_state(v)))
                return runner.act(s)

        summary = ControlLoop(robot, Spy(), LoopConfig(100.0, duration_s=1.0, status=False)).run()
        deadline = time.monotonic() + 5.0  # the fake counts on its own thread: let it drain its socket under load
        while v.counts["SET_ATTITUDE_TARGET"] < summary["ticks"] and time.monotonic() < deadline:
            time.sleep(0.01)
        why = (summary["outcome"], summary["fault"], summary["ticks"], v.events)  # a short flight says why it ended
        assert v.counts["SET_ATTITUDE_TARGET"] >= 90 and v.counts["acks_ok"] >= 2, why
    assert summary["outcome"] == "completed" and summary["ticks"] >= 90
    assert [t["dst"] for t in summary["transitions"]][-2:] == ["landing", "disarmed"]
    # the state the policy saw is one of the plant's recent states (telemetry lags a period or more under load)
    err = lagged_error([s for s, _ in states], [t for _, t in states])
    assert np.median(err[5:]) < 0.02


def test_unreachable_vehicle_is_one_user_error():
    with pytest.raises(UserError, match="no MAVLink vehicle"):
        make_robot(f"mavlink://udp:127.0.0.1:{free_port()}?timeout=0.3").connect()
    with pytest.raises(UserError):
        make_robot("mavlink://serial:/dev/ttyACM0")
    with pytest.raises(UserError, match="thrust \\+ body rates"):
        make_robot("mavlink://udp:127.0.0.1:1?task=quadrotor-hover").connect()


def _fuzz_driver(n: int) -> None:
    from pymavlink import mavutil

    port = free_port()
    with MavlinkVehicle(port) as v:
        robot = make_robot(f"mavlink://udp:127.0.0.1:{port}")
        robot.connect()
        local = robot.conn.port.getsockname()
        enc = mavutil.mavlink.MAVLink(None, srcSystem=1, srcComponent=1)
        good = enc.attitude_encode(1, 0.1, 0.2, 0.3, 0.0, 0.0, 0.0).pack(enc)
        rng = random.Random(0)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for i in range(n):
            if rng.random() < 0.5:
                data = bytearray(good)
                for _ in range(rng.randint(1, 4)):
                    data[rng.randrange(len(data))] = rng.randrange(256)
                data = bytes(data[: rng.randint(1, len(data))] if rng.random() < 0.3 else data)
            else:
                data = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300)))
            sock.sendto(data, local)
            if i % 500 == 0:
                robot.observe()
        sock.close()
        time.sleep(0.1)
        s = robot.observe()  # still parsing the vehicle's real telemetry
        assert np.all(np.isfinite(s.values)) and robot.seq > 0
        robot.close()
        assert v.counts["HEARTBEAT"] >= 1


def test_fuzz_mavlink_driver_parser():
    _fuzz_driver(FUZZ_DATAGRAMS)


@pytest.mark.slow
def test_fuzz_mavlink_driver_parser_100k():
    _fuzz_driver(100_000)
